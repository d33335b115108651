from family_contract import FamilyContract


class TestCViViT(FamilyContract):
    preset = "cvivit-debug"
