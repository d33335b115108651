from family_contract import FamilyContract


class TestDiTPixels(FamilyContract):
    preset = "dit-debug"


class TestDiTLatents(FamilyContract):
    preset = "dit-latent-debug"
