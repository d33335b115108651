from family_contract import FamilyContract


class TestCViViT(FamilyContract):
    preset = "cvivit-debug"


class TestCViViTJointImages:
    """Joint image + video training (data.images): every other step trains on shapes images as 1-frame clips."""

    preset = "cvivit-debug"
    overrides = ("data.images.source=shapes", "data.images.ratio=0.5")
    test_resume_is_bit_identical = FamilyContract.test_resume_is_bit_identical


class TestCViViTClipDiscriminator:
    """cvivit-paper's GAN: the 3-D discriminator over whole clips at a fixed adversarial weight; a resume is
    bit-identical."""

    preset = "cvivit-debug"
    overrides = ("model.gan.discriminator=patch_3d", "model.gan.adversarial_weight=fixed")
    test_resume_is_bit_identical = FamilyContract.test_resume_is_bit_identical
