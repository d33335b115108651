from family_contract import FamilyContract


class TestPhenaki(FamilyContract):
    preset = "phenaki-debug"


class TestPhenakiJointImages:
    """Joint image + video training (data.images): every other step trains on captioned shapes images as 1-frame
    clips."""

    preset = "phenaki-debug"
    overrides = ("data.images.source=shapes", "data.images.ratio=0.5")
    test_resume_is_bit_identical = FamilyContract.test_resume_is_bit_identical


class TestPhenakiTokenCritic(FamilyContract):
    """With a token critic (Token-Critic): the phases main and critic, sampling through the critic."""

    preset = "phenaki-debug"
    overrides = ("model.critic.depth=1",)


class TestPhenakiSelfCritic:
    """A self critic trained jointly with the generator (phenaki-pytorch's self_token_critic, one loss): one phase,
    resumed bit-identically."""

    preset = "phenaki-debug"
    overrides = ("model.critic.kind=self", "model.critic.training=joint", "model.critic.loss_weight=0.5")
    test_resume_is_bit_identical = FamilyContract.test_resume_is_bit_identical
