"""What the image tokenizer families (dvae, vqgan, klvae; cvivit later) share, and not a family itself:
reconstruction, perceptual and GAN losses (`TokenizerTask`), previews of held-out reconstructions, and the config
sections of those losses (`TokenizerConfig`)."""
