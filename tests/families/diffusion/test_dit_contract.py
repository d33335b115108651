from family_contract import FamilyContract


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
    overrides = ("model.backbone=unet", "model.unet.dim=16", "model.unet.dim_mults=[1,2]",
                 "model.unet.num_res_blocks=1", "model.unet.attention_levels=[1]", "model.unet.head_dim=16",
                 "model.diffusion.prediction=v", "model.diffusion.learn_sigma=false")


class TestDiTUNetLearnedSigma(FamilyContract):
    preset = "dit-debug"
    overrides = ("model.backbone=unet", "model.unet.dim=16", "model.unet.dim_mults=[1,2]",
                 "model.unet.num_res_blocks=1", "model.unet.attention_levels=[1]", "model.unet.head_dim=16")
