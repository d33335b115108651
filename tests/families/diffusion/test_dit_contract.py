from family_contract import FamilyContract

# a tiny U-Net in place of the DiT
UNET_16 = "model.backbone={kind: unet, dim: 16, dim_mults: [1, 2], num_res_blocks: 1, attention_levels: [1], " \
          "head_dim: 16}"


class TestDiTPixels(FamilyContract):
    preset = "dit-debug"


class TestDiTLatents(FamilyContract):
    preset = "dit-latent-debug"


class TestDiTFlow(FamilyContract):
    preset = "dit-debug"
    overrides = ("model.diffusion.objective=flow", "model.diffusion.learn_sigma=false",
                 "model.diffusion.sampler=euler")


class TestDiTEDM(FamilyContract):
    preset = "dit-debug"
    overrides = ("model.diffusion.objective=edm", "model.diffusion.learn_sigma=false",
                 "model.diffusion.sampler=heun", "model.diffusion.guidance_interval=[0.1,10.0]")


class TestDiTUNetBackbone(FamilyContract):
    preset = "dit-debug"
    overrides = (UNET_16, "model.diffusion.prediction=v", "model.diffusion.learn_sigma=false")


class TestDiTUNetLearnedSigma(FamilyContract):
    preset = "dit-debug"
    overrides = (UNET_16,)


class TestDiTMagnitudePreservingUNet(FamilyContract):
    preset = "dit-debug"
    overrides = (UNET_16, "model.backbone.magnitude_preserving=true", "model.diffusion.objective=flow",
                 "model.diffusion.learn_sigma=false", "model.diffusion.sampler=euler")
