"""Sampling options typed end to end: `Run.sample` validates the keywords against the family's options model, the
task resolves them once (the config's defaults filled in) and receives that ONE typed object in
`sample_conditions`, `sample` and `sampler_settings`; the UI's progress bar travels beside it."""

from pathlib import Path

import pytest

from genforge.app.api import load_run
from genforge.core.config import SampleOptions
from genforge.families.phenaki.config import PhenakiSampleOptions

OLD_RUNS = Path(__file__).parent.parent / "fixtures" / "runs-3f8e24e"


def _spy(run, monkeypatch) -> dict:
    """What the run's task is handed: the options of each call, and `progress`."""
    seen: dict = {"conditions": [], "sample": [], "progress": []}
    conditions, sample = run.task.sample_conditions, run.task.sample

    def sample_conditions(n, generator, options):
        seen["conditions"].append(options)
        return conditions(n, generator, options)

    def spy_sample(cond, generator, n, options, progress=False):
        seen["sample"].append(options)
        seen["progress"].append(progress)
        return sample(cond, generator, n, options, progress)

    monkeypatch.setattr(run.task, "sample_conditions", sample_conditions)
    monkeypatch.setattr(run.task, "sample", spy_sample)
    return seen


def test_a_diffusion_task_receives_its_typed_options_with_the_config_defaults(monkeypatch):
    run = load_run(OLD_RUNS / "dit", device="cpu")
    seen = _spy(run, monkeypatch)
    run.sample(n=2, steps=2, label=1)
    d = run.config.model.diffusion
    options = seen["sample"][0]
    assert type(options) is SampleOptions and seen["conditions"] == [options] and seen["progress"] == [False]
    assert (options.steps, options.label, options.sampler, options.cfg_scale) == (2, 1, d.sampler, d.cfg_scale)
    assert run.task.resolve(options) == options  # resolving resolved options changes nothing
    assert run.task.sampler_settings(options) == {"sampler": d.sampler, "steps": 2, "cfg_scale": d.cfg_scale,
                                                  "ddim_eta": d.ddim_eta}


def test_a_phenaki_task_receives_its_family_options_with_the_config_defaults(monkeypatch):
    run = load_run(OLD_RUNS / "phenaki", device="cpu")
    seen = _spy(run, monkeypatch)
    run.sample(n=1, prompt="a red circle moving left", steps=2, temperature=0.5)
    m = run.config.model
    options = seen["sample"][0]
    assert type(options) is PhenakiSampleOptions and seen["conditions"] == [options]
    assert (options.prompt, options.steps, options.temperature) == ("a red circle moving left", 2, 0.5)
    assert (options.cfg_scale, options.choice_temperature) == (m.cfg_scale, m.choice_temperature)
    assert (options.frames, options.decode_order) == (run.config.data.video.num_frames, m.decode_order)
    with pytest.raises(ValueError, match="frames does not apply to a 'diffusion' model"):
        load_run(OLD_RUNS / "dit", device="cpu").sample(n=1, frames=9)


def test_the_previews_take_the_train_section_through_the_task():
    """The engine hands the task the train section; phenaki makes clips of train.sample_frames of it, others the
    defaults."""
    run = load_run(OLD_RUNS / "phenaki", device="cpu")
    train = run.config.train.model_copy(update={"sample_frames": 9})
    assert run.task.preview_options(train).frames == 9
    assert run.task.preview_options(run.config.train).frames == run.config.data.video.num_frames
    dit = load_run(OLD_RUNS / "dit", device="cpu").task
    assert dit.preview_options(train) == dit.resolve() == dit.resolve(SampleOptions())
