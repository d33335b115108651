from family_contract import FamilyContract


class TestVQGAN(FamilyContract):
    """VQ with an EMA codebook and dead-code restarts, patch GAN with R1 (the preset)."""

    preset = "vqgan-debug"


class TestVQGANCosineKMeans(FamilyContract):
    """l2-normalised codes (ViT-VQGAN), a low-dimensional projection, k-means initialisation."""

    preset = "vqgan-debug"
    overrides = ("model.quantizer={kind: vq, codebook_size: 64, codebook_dim: 4, use_cosine_sim: true, "
                 "kmeans_init: true, threshold_ema_dead_code: 1.0}",)


class TestVQGANLearntCodebook(FamilyContract):
    """A codebook learnt by gradient (taming), straight-through gradients, no GAN."""

    preset = "vqgan-debug"
    overrides = ("model.quantizer={kind: vq, codebook_size: 64, ema_update: false, rotation_trick: false}",
                 "model.gan=null")


class TestVQGANLFQ(FamilyContract):
    preset = "vqgan-debug"
    overrides = ("model.quantizer={kind: lfq, codebook_size: 64}",)


class TestVQGANFSQ(FamilyContract):
    preset = "vqgan-debug"
    overrides = ("model.quantizer={kind: fsq, levels: [5, 4, 3]}",)
