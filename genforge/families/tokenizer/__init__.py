"""What the image tokenizers (dvae, vqgan, klvae) share: reconstruction, perceptual and GAN losses, previews
of held-out reconstructions, and the codec they hand to generators."""
