import json

import pytest
import torch
from typer.testing import CliRunner

from genforge.app.runs import load_run
from genforge.cli import app
from genforge.diffusion.build import sampling_process
from genforge.diffusion.config import DiffusionConfig
from genforge.families.diffusion.config import DiTConfig
from genforge.families.diffusion.dit import DIT_SIZES, DiT


def tiny(**kw) -> DiT:
    args = dict(input_size=8, patch_size=2, in_channels=4, hidden_size=32, depth=2, num_heads=4, num_classes=10)
    return DiT(**{**args, **kw})


# The paper's sizes at 256 px (32x32x4 latents, 1000 classes). The reference implementation reports
# 675,129,632 for XL/2, which includes its frozen 256x1152 pos_embed Parameter; ours is a buffer.
@pytest.mark.parametrize("name,count", [("S/2", 32_865_056), ("B/2", 130_315_808), ("XL/2", 674_834_720)])
def test_paper_parameter_counts(name, count):
    with torch.device("meta"):
        model = DiT(**DiTConfig(size=name).dims(), input_size=32, in_channels=4, num_classes=1000)
    total = sum(p.numel() for p in model.parameters())
    assert total == count
    assert total / 1e6 == pytest.approx({"S/2": 33, "B/2": 130, "XL/2": 675}[name], rel=0.01)


def test_zoo_names_and_unknown_size():
    assert list(DIT_SIZES) == [f"{s}/{p}" for s in ("S", "B", "L", "XL") for p in (2, 4, 8)]
    assert DIT_SIZES["XL/2"] == dict(depth=28, hidden_size=1152, num_heads=16, patch_size=2)
    assert DIT_SIZES["L/4"] == dict(depth=24, hidden_size=1024, num_heads=16, patch_size=4)
    with pytest.raises(ValueError, match=r"allowed: S/2, S/4.*XL/8"):
        DiTConfig(size="M/3")


@pytest.mark.parametrize("learn_sigma", [True, False])
@pytest.mark.parametrize("channels,size", [(4, 32), (3, 16)])  # latents 32x32x4, pixels 16x16x3
def test_output_shapes(learn_sigma, channels, size):
    model = tiny(input_size=size, in_channels=channels, learn_sigma=learn_sigma, patch_size=4)
    x = torch.randn(3, channels, size, size)
    out = model(x, torch.tensor([0, 10, 999]), torch.tensor([1, 2, 10]))
    assert model.out_channels == channels * (2 if learn_sigma else 1)
    assert out.shape == (3, model.out_channels, size, size)
    assert model(x, torch.tensor([0.5, 10.25, 998.0])).shape == out.shape  # float t, no y


def test_adaln_zero_initial_output_is_exactly_zero():
    torch.manual_seed(0)
    model = tiny()
    out = model(torch.randn(2, 4, 8, 8), torch.tensor([5, 500]), torch.tensor([0, 3]))
    assert torch.equal(out, torch.zeros_like(out))
    for block in model.blocks:  # and every block starts as the identity: gates are zero
        assert not block.adaLN_modulation[-1].weight.any() and not block.adaLN_modulation[-1].bias.any()


def test_initialisation():
    torch.manual_seed(0)
    model = tiny(hidden_size=64, num_classes=1000)
    assert model.y_embedder.embedding_table.weight.std().item() == pytest.approx(0.02, rel=0.1)
    assert model.t_embedder.mlp[0].weight.std().item() == pytest.approx(0.02, rel=0.1)
    qkv = model.blocks[0].attn.qkv.weight  # xavier-uniform: bound sqrt(6 / (fan_in + fan_out))
    assert qkv.abs().max() <= (6 / (64 + 192)) ** 0.5 and not model.blocks[0].attn.qkv.bias.any()
    patch = model.x_embedder.proj.weight  # like a [64, 4·2·2] linear
    assert patch.abs().max() <= (6 / (64 + 16)) ** 0.5 and patch.abs().max() > 0.8 * (6 / (64 + 16)) ** 0.5


def test_position_embedding_is_a_fixed_buffer():
    model = tiny()
    assert "pos_embed" not in dict(model.named_parameters()) and "pos_embed" in dict(model.named_buffers())
    assert model.pos_embed.shape == (1, 16, 32) and not model.pos_embed.requires_grad
    assert model.to(torch.float64).pos_embed.dtype == torch.float64  # moves with the module


def test_first_step_reaches_only_the_zeroed_output_layer():
    torch.manual_seed(0)
    model = tiny()
    x = torch.randn(4, 4, 8, 8)
    (model(x, torch.randint(0, 1000, (4,)), torch.randint(0, 10, (4,))) - x.repeat(1, 2, 1, 1)).pow(2).mean().backward()
    live = {n for n, p in model.named_parameters() if p.grad is not None and p.grad.any()}
    # adaLN-Zero: the zero output layer blocks gradient to everything upstream on the first step
    assert live == {"final_layer.linear.weight", "final_layer.linear.bias"}


def test_every_parameter_learns():
    torch.manual_seed(0)
    model = tiny(class_dropout_prob=0.5)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    x, t, y = torch.randn(8, 4, 8, 8), torch.randint(0, 1000, (8,)), torch.randint(0, 10, (8,))
    for _ in range(3):
        opt.zero_grad()
        (model(x, t, y) - x.repeat(1, 2, 1, 1)).pow(2).mean().backward()
        opt.step()
    silent = [n for n, p in model.named_parameters() if p.grad is None or not p.grad.any()]
    assert not silent


def test_label_dropout_replaces_with_null_class():
    torch.manual_seed(0)
    model = tiny(class_dropout_prob=1.0)
    with torch.no_grad():
        model.final_layer.linear.weight.normal_()  # make the output depend on the conditioning
        for block in model.blocks:
            block.adaLN_modulation[-1].weight.normal_()
        model.final_layer.adaLN_modulation[-1].weight.normal_()
    x, t, y = torch.randn(2, 4, 8, 8), torch.tensor([3, 30]), torch.tensor([1, 7])
    dropped = model(x, t, y)  # training: every label -> null
    model.eval()
    torch.testing.assert_close(dropped, model(x, t, torch.tensor([10, 10])))
    torch.testing.assert_close(dropped, model(x, t))  # y=None is the null class
    assert not torch.allclose(dropped, model(x, t, y))  # eval keeps labels


def test_unconditional_model():
    model = tiny(num_classes=0)
    assert model.y_embedder is None
    assert model(torch.randn(1, 4, 8, 8), torch.tensor([3])).shape == (1, 8, 8, 8)
    with pytest.raises(ValueError, match="unconditional"):
        model(torch.randn(1, 4, 8, 8), torch.tensor([3]), torch.tensor([0]))


def test_size_checks():
    with pytest.raises(ValueError, match=r"input_size=9.*patch_size=2"):
        tiny(input_size=9)
    with pytest.raises(ValueError, match="8x8"):
        tiny()(torch.randn(1, 4, 16, 16), torch.tensor([3]))


def test_unpatchify_inverts_patchify_layout():
    model = tiny(learn_sigma=False)
    x = torch.randn(2, 4, 8, 8)
    patches = x.view(2, 4, 4, 2, 4, 2).permute(0, 2, 4, 3, 5, 1).reshape(2, 16, 16)  # [B, N, p·p·C]
    assert torch.equal(model.unpatchify(patches), x)


def test_guidance_on_three_channels_is_dits_sample_py_guidance():
    """model.diffusion.guidance_channels=3 on 4-channel latents: what facebookresearch/DiT's forward_with_cfg does,
    written out by hand on the same weights: the first 3 channels of ε guided, the 4th and the learned variance
    taken from the conditional branch."""
    torch.manual_seed(0)
    dit = DiT(input_size=8, patch_size=2, in_channels=4, hidden_size=32, depth=2, num_heads=2, num_classes=5).eval()
    for p in dit.parameters():  # adaLN-Zero starts at zero: give every output weight a value
        torch.nn.init.normal_(p, std=0.05)
    x, t, y = torch.randn(3, 4, 8, 8), torch.tensor([10, 500, 900]), torch.tensor([0, 2, 4])
    null = torch.full_like(y, 5)
    cfg = DiffusionConfig(cfg_scale=4.0, guidance_channels=3, sampler="ddpm", sample_steps=5)
    process = sampling_process(cfg, model=dit, model_kwargs={"y": y}, channels=4, clip=False, sampler="ddpm",
                               steps=5, cfg_scale=4.0, null_kwargs={"y": null})
    with torch.no_grad():
        guided = process.model(x, t, y=y)
        cond, uncond = dit(x, t, y), dit(x, t, null)
    eps = uncond[:, :3] + 4.0 * (cond[:, :3] - uncond[:, :3])
    torch.testing.assert_close(guided, torch.cat([eps, cond[:, 3:]], dim=1))
    every = sampling_process(cfg.model_copy(update={"guidance_channels": None}), model=dit, model_kwargs={"y": y},
                             channels=4, clip=False, sampler="ddpm", steps=5, cfg_scale=4.0, null_kwargs={"y": null})
    with torch.no_grad():
        assert not torch.allclose(every.model(x, t, y=y)[:, 3], guided[:, 3])  # the 4th channel is guided by default
    with pytest.raises(ValueError, match="guidance_channels=5"):
        sampling_process(cfg.model_copy(update={"guidance_channels": 5}), model=dit, model_kwargs={"y": y},
                         channels=4, clip=False, sampler="ddpm", steps=5, cfg_scale=4.0, null_kwargs={"y": null})


def test_a_finished_run_takes_guidance_channels_as_the_docs_say(tmp_path):
    """docs/diffusion.md: `genforge train RUN/config.yaml --run-dir RUN --set model.diffusion.guidance_channels=3`
    trains nothing on a finished run and records the change, which sampling then uses."""
    run = tmp_path / "run"
    sets = ["--set", "train.steps=2", "--set", "train.sample_every=0", "--set", "log.progress=false"]
    assert CliRunner().invoke(app, ["train", "dit-debug", "--run-dir", str(run), *sets]).exit_code == 0
    again = CliRunner().invoke(app, ["train", str(run / "config.yaml"), "--run-dir", str(run), "--set",
                                     "model.diffusion.guidance_channels=3"])
    assert again.exit_code == 0 and "nothing to train" in again.stderr, again.output
    assert load_run(run).config.model.diffusion.guidance_channels == 3
    history = [json.loads(line) for line in (run / "config-history.jsonl").read_text().splitlines()]
    assert history[-1]["changes"] == [{"field": "model.diffusion.guidance_channels", "old": None, "new": 3}]
