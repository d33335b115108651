from family_contract import FamilyContract


class TestDVAE(FamilyContract):
    preset = "dvae-debug"


class TestDVAEStraightThrough(FamilyContract):
    preset = "dvae-debug"
    overrides = ("model.straight_through=true",)
