"""train.grad_clip by default is each family's seed trainer's (issue 58): read from the built config of every family
(unset in the config: the family's FamilyTraits.grad_clip, written resolved), handed to the trainer, and kept by old
runs, whose config.yaml holds the value they trained with."""

from pathlib import Path

import pytest

from genforge.app.config import config_from_dict, load_config, to_yaml
from genforge.app.runs import make_trainer, resume_changes
from genforge.core.config import TrainConfig
from genforge.core.registry import FAMILIES

# family -> (a preset of it, its default max grad norm (0: none), where that comes from)
SEED_CLIPPING = {
    "diffusion": ("dit-debug", 0.0, "facebookresearch/DiT train.py does not clip"),
    "vqgan": ("vqgan-debug", 0.0, "muse-maskgit-pytorch VQGanVAETrainer: max_grad_norm=None"),
    "dvae": ("dvae-debug", 0.0, "DALLE-pytorch train_vae.py does not clip"),
    "dalle2_decoder": ("dalle2-decoder-debug", 0.5, "DALLE2-pytorch DecoderTrainConfig.max_grad_norm"),
    "dalle2_prior": ("dalle2-prior-debug", 0.5, "DALLE2-pytorch DiffusionPriorTrainConfig.max_grad_norm"),
    "klvae": ("klvae-debug", 1.0, "no seed trainer (SD's VAE weights): genforge's 1.0"),
    "maskgit": ("maskgit-debug", 1.0, "muse-maskgit-pytorch has no MaskGIT trainer: genforge's 1.0"),
    "clip": ("clip-debug", 1.0, "no seed trainer (DALLE2-pytorch's CLIP adapters): genforge's 1.0"),
}
SEED_CLIPPING.update({
    "phenaki": ("phenaki-debug", 0.0, "phenaki-pytorch PhenakiTrainer: max_grad_norm=None"),
    "cvivit": ("cvivit-debug", 0.5, "phenaki-pytorch CViViTTrainer: 0.5 on the autoencoder, none on D"),
})
OWNED_ELSEWHERE: dict[str, tuple[str, float]] = {}
FIXTURES = Path(__file__).parent.parent / "fixtures"


def test_every_family_has_its_default_listed():
    assert set(FAMILIES) - {"toy"} <= set(SEED_CLIPPING) | set(OWNED_ELSEWHERE)


@pytest.mark.parametrize("family", sorted(SEED_CLIPPING) + sorted(OWNED_ELSEWHERE))
def test_an_unset_grad_clip_is_the_familys_default_written_resolved(family):
    preset, expected = (SEED_CLIPPING.get(family) or OWNED_ELSEWHERE[family])[:2]
    cfg = load_config(preset, ["train.grad_clip=null"])  # unset, whatever the preset says
    assert cfg.model.family == family and cfg.train.grad_clip == expected
    assert config_from_dict(cfg.model_dump(mode="json")).train.grad_clip == expected
    assert f"grad_clip: {expected}" in to_yaml(cfg)  # config.yaml holds the value, not "the family's"


@pytest.mark.parametrize("value", [0.0, 0.25, 2.0])
def test_a_set_grad_clip_wins_and_zero_means_off(value):
    assert load_config("dit-debug", [f"train.grad_clip={value}"]).train.grad_clip == value


@pytest.mark.parametrize("preset", ["unet-shapes", "dit-shapes", "dit-latent-shapes", "dvae-shapes", "vqgan-shapes",
                                    "dalle2-decoder-shapes", "dalle2-prior-shapes", "cvivit-moving-shapes",
                                    "phenaki-moving-shapes", "phenaki-moving-shapes-frames"])
def test_presets_whose_figures_were_measured_with_clipping_at_1_keep_it(preset):
    assert load_config(preset).train.grad_clip == 1.0


@pytest.mark.parametrize("family", ["dit", "vqgan", "dvae"])
def test_old_runs_keep_the_clipping_they_trained_with(family):
    """A run's config.yaml holds every key: runs written when 1.0 was every family's default keep 1.0."""
    assert load_config(str(FIXTURES / "runs-42ccac9" / family / "config.yaml")).train.grad_clip == 1.0


def test_resuming_an_old_run_with_a_config_that_leaves_it_unset_changes_it_and_says_so(tmp_path):
    old = load_config("dit-debug", ["train.grad_clip=1.0"])
    (tmp_path / "config.yaml").write_text(to_yaml(old))
    changes = resume_changes(load_config("dit-debug"), tmp_path)
    assert [(c.field, c.old, c.new, c.allowed) for c in changes] == [("train.grad_clip", 1.0, 0.0, True)]


def test_the_trainer_clips_each_phase_with_the_built_default(tmp_path):
    trainer = make_trainer(load_config("dit-debug", ["train.steps=1"]), tmp_path)
    assert trainer.phase_train["main"].grad_clip == 0.0


def test_cvivit_clips_its_autoencoder_at_half_and_its_discriminator_not_as_phenaki_pytorch(tmp_path):
    """CViViTTrainer clips the autoencoder's gradients at 0.5 and leaves the discriminator's alone: the built
    trainer's phases, from a config that leaves clipping unset; a set train.grad_clip (a preset measured at 1.0) is
    every phase's, and a phase's own setting wins."""
    trainer = make_trainer(load_config("cvivit-debug", ["train.steps=1", "train.grad_clip=null"]), tmp_path / "a")
    assert trainer.phase_train["generator"].grad_clip == 0.5
    assert trainer.phase_train["discriminator"].grad_clip == 0.0
    written = config_from_dict(load_config("cvivit-debug", ["train.grad_clip=null"]).model_dump(mode="json"))
    assert written.train.phases["discriminator"].grad_clip == 0.0  # config.yaml holds it, resolved
    pinned = load_config("cvivit-debug", ["train.grad_clip=1.0"])
    assert pinned.train.for_phase("discriminator").grad_clip == 1.0
    own = load_config("cvivit-debug", ["train.grad_clip=null", "train.phases.discriminator.grad_clip=0.25"])
    assert own.train.for_phase("discriminator").grad_clip == 0.25


def test_a_train_section_built_by_hand_takes_the_default_it_is_handed():
    train = TrainConfig.model_validate({"phases": {"discriminator": {"grad_clip": 0.25}}})
    assert train.grad_clip is None
    assert train.for_phase("generator", 0.5).grad_clip == 0.5
    assert train.for_phase("discriminator", 0.5).grad_clip == 0.25  # the phase's own wins
    assert TrainConfig(grad_clip=2.0).for_phase("generator", 0.5).grad_clip == 2.0
