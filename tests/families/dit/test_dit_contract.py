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
