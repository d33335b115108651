from family_contract import FamilyContract


class TestVQGAN(FamilyContract):
    """VQ with an EMA codebook and dead-code restarts, patch GAN with MUSE's gradient penalty (the preset)."""

    preset = "vqgan-debug"


class TestVQGANR1(FamilyContract):
    """The lazy R1 penalty every 2 steps (what the preset had before MUSE's penalty)."""

    preset = "vqgan-debug"
    overrides = ("model.gan.penalty=r1", "model.gan.penalty_weight=1.0", "model.gan.penalty_every=2")


class TestVQGANGradientPenaltyOnInterpolates(FamilyContract):
    """WGAN-GP's random interpolates: ε from the batch's stream, so resume stays bit-identical."""

    preset = "vqgan-debug"
    overrides = ("model.gan.penalty_inputs=interpolates",)


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
