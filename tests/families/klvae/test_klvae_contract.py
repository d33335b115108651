from family_contract import FamilyContract


class TestKLVAE(FamilyContract):
    preset = "klvae-debug"


class TestKLVAEWithGAN(FamilyContract):
    preset = "klvae-debug"
    overrides = ("model.gan={num_layers: 2, r1_weight: 1.0, r1_every: 1}",)
