import pytest
import yaml
from typer.testing import CliRunner

from genforge.cli import app
from genforge.app.config import ConfigError, list_presets, load_config, parse_overrides, to_yaml
from genforge.core.registry import FAMILIES

runner = CliRunner()


def test_presets_listed_with_family_and_description():
    presets = list_presets()
    assert {"dit-shapes", "dit-debug", "dit-latent-debug"} <= set(presets)
    assert all(desc for desc in presets.values())
    out = runner.invoke(app, ["presets"])
    assert out.exit_code == 0
    for name in presets:
        line = next(l for l in out.stdout.splitlines() if l.startswith(name + " "))
        assert f" {load_config(name).model.family} " in line


@pytest.mark.parametrize("preset", sorted(list_presets()))
def test_dry_run_every_preset(preset):
    out = runner.invoke(app, ["train", preset, "--dry-run"])
    assert out.exit_code == 0, out.output
    assert "# parameters: " in out.stdout
    resolved = yaml.safe_load(out.stdout.split("# parameters")[0])
    assert resolved["model"]["family"] in FAMILIES


def test_default_is_the_unet_on_32px_shapes():
    cfg = load_config(None)
    assert cfg.name == "unet-shapes" and cfg.model.family == "diffusion" and cfg.model.backbone.kind == "unet"
    assert cfg.data.source == "shapes" and cfg.data.image_size == 32 and cfg.model.conditioning == "class"


def test_overrides_are_typed_and_yaml_round_trips():
    cfg = load_config("dit-debug", ["train.lr=3e-4", "train.precision=bf16", "data.flip=false",
                                   "model.backbone.depth=3"])
    assert cfg.train.lr == 3e-4 and cfg.train.precision == "bf16" and cfg.data.flip is False
    assert cfg.model.backbone.dims()["depth"] == 3
    again = load_config("dit-debug", [])
    assert again != cfg
    assert load_config.__module__  # yaml dump of a resolved config loads to the same config:
    raw = yaml.safe_load(to_yaml(cfg))
    assert type(cfg).model_validate(raw) == cfg


def test_user_yaml_file(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("model: {family: dit, size: B/4}\ndata: {image_size: 64}\n")
    cfg = load_config(str(path))
    assert cfg.name == "mine" and cfg.model.backbone.dims()["hidden_size"] == 768


BAD = [
    (["train.lr=-1"], "train.lr"),
    (["train.lr=fast"], "train.lr"),
    (["train.steps=0"], "train.steps"),
    (["train.batch_size=-4"], "train.batch_size"),
    (["train.precision=fp8"], "train.precision"),
    (["train.keep_last=1"], "train.keep_last"),
    (["train.grad_accum=0"], "train.grad_accum"),
    (["train.batch_size=10", "train.grad_accum=4"], "train.grad_accum"),
    (["train.ema_decay=1.5"], "train.ema_decay"),
    (["train.betas=[0.9, 1.2]"], "train.betas"),
    (["train.lrr=1e-4"], "train.lrr"),
    (["trian.lr=1e-4"], "trian"),
    (["data.image_size=0"], "data.image_size"),
    (["data.image_size=30"], "data.image_size"),
    (["data.source=ftp"], "data.source"),
    (["data.source=folder"], "data.path"),
    (["data.shapes.min_shapes=3", "data.shapes.max_shapes=1"], "min_shapes"),
    (["data.shapes.paths=anywhere"], "data.shapes.paths"),
    (["data.val_fraction=1.0"], "data.val_fraction"),
    (["model.family=gan"], "model"),
    (["model.backbone.size=M/3"], "model.backbone.size"),
    (["model.backbone.depth=0"], "model.backbone.depth"),
    (["model.backbone.hidden_size=100", "model.backbone.num_heads=3"], "model.backbone.num_heads"),
    (["model.backbone.patch_size=3"], "model.backbone.patch_size"),
    (["model.backbone.kind=vit"], "model.backbone.kind"),
    (["model.diffusion.noise_schedule=quadratic"], "model.diffusion.noise_schedule"),
    (["model.diffusion.prediction=score"], "model.diffusion.prediction"),
    (["model.diffusion.sample_steps=5000"], "model.diffusion.sample_steps"),
    (["model.diffusion.cfg_scale=0.5"], "model.diffusion.cfg_scale"),
    (["model.class_dropout_prob=1"], "model.class_dropout_prob"),
    (["model.latent.factor=3"], "model.latent.factor"),
    (["eval.metrics=[fid9]"], "eval.metrics"),
    (["log.tensorboard=maybe"], "log.tensorboard"),
    (["train"], "train"),
    (["train.keep_best=judge_accuracy"], "train.keep_best"),  # without eval.every
    (["eval.every=100", "train.keep_best=fid"], "train.keep_best"),
    (["eval.every=100", "eval.metrics=[fid]", "train.keep_best=fid"], "train.keep_best_mode=min"),
    (["eval.ref_n=1"], "eval.ref_n"),
    (["train.keep_best_mode=up"], "train.keep_best_mode"),
    (["train.on_nonfinite=ignore"], "train.on_nonfinite"),
    (["train.max_rollbacks=-1"], "train.max_rollbacks"),
    (["train.max_nonfinite_skips=0"], "train.max_nonfinite_skips"),
    (["train.dist_timeout_s=1"], "train.dist_timeout_s"),
    (["data.max_bad_fraction=1.5"], "data.max_bad_fraction"),
    (["data.max_image_pixels=0"], "data.max_image_pixels"),
    (["data.num_workers=-1"], "data.num_workers"),
    (["model.diffusion.min_snr_gamma=0"], "model.diffusion.min_snr_gamma"),
]


@pytest.mark.parametrize("overrides,field", BAD, ids=[" ".join(o) for o, _ in BAD])
def test_bad_config_exits_2_naming_the_field(overrides, field):
    args = ["train", "dit-debug", "--dry-run"]
    for item in overrides:
        args += ["--set", item]
    out = runner.invoke(app, args)
    assert out.exit_code == 2, out.output
    assert field in out.stderr, out.stderr


def test_unknown_key_lists_allowed_keys():
    with pytest.raises(ConfigError) as err:
        load_config("dit-debug", ["train.lrr=1"])
    assert "unknown key" in str(err.value) and "lr" in str(err.value) and "warmup_steps" in str(err.value)


def test_wrong_type_names_value():
    with pytest.raises(ConfigError, match="train.steps.*'many'"):
        load_config("dit-debug", ["train.steps=many"])


def test_unknown_preset_and_missing_file():
    with pytest.raises(ConfigError, match="unknown preset"):
        load_config("no-such-preset")
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("missing.yaml")


def test_parse_overrides_nested():
    raw = parse_overrides({"a": {"b": 1}}, ["a.c.d=[1, 2]", "e=hello"])
    assert raw == {"a": {"b": 1, "c": {"d": [1, 2]}}, "e": "hello"}
    with pytest.raises(ConfigError):
        parse_overrides({}, ["novalue"])


def test_precision_no_survives_yaml_reading_it_as_false(tmp_path):
    """YAML 1.1 reads a bare `no` as false: `--set train.precision=no` and `precision: no` in a file mean "no"."""
    assert load_config("dit-debug", ["train.precision=no"]).train.precision == "no"
    path = tmp_path / "run.yaml"
    path.write_text("model: {family: dit}\ndata: {source: shapes}\ntrain: {precision: no}\n")
    assert load_config(str(path), []).train.precision == "no"
