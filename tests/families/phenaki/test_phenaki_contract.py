from family_contract import FamilyContract


class TestPhenaki(FamilyContract):
    preset = "phenaki-debug"
