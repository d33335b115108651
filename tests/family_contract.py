"""The contract every family passes (like diffusers' test_modeling_common): subclass with a debug preset."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from genforge.app.config import load_config
from genforge.app.runs import build_task
from genforge.data.base import collate
from genforge.data.loader import StepBatchSampler, build_dataset, data_info
from genforge.core.random import BatchRandom
from genforge.core.task import Task
from genforge.app.runs import make_trainer


class FamilyContract:
    preset: str  # a debug preset of the family: tiny, a few CPU seconds
    overrides: tuple[str, ...] = ()  # --set overrides on top of the preset (a variant of the family)

    def build(self, *extra: str):
        torch.manual_seed(0)
        cfg = load_config(self.preset, [*self.overrides, *extra])
        dataset = build_dataset(cfg.data)
        task = build_task(cfg, data_info(dataset, cfg.data))
        batch = collate([dataset[item] for item in next(iter(StepBatchSampler(len(dataset), cfg.train.batch_size)))])
        batch.pop("skipped")
        return cfg, task, batch

    def test_is_a_task_with_named_phases(self):
        _, task, _ = self.build()
        assert isinstance(task, Task) and task.phases and all(isinstance(p, str) for p in task.phases)

    def test_loss_is_a_finite_scalar_and_trains_its_phase(self):
        cfg, task, batch = self.build()
        for i, phase in enumerate(task.phases):
            task.zero_grad(set_to_none=True)
            batch["rng"] = BatchRandom(0, 0, i, cfg.train.batch_size, 0, cfg.train.batch_size)
            loss, logs = task.loss(batch, phase, 0)
            assert loss.ndim == 0 and torch.isfinite(loss)
            assert all(v.ndim == 0 for v in logs.values())
            loss.backward()
            params = list(task.parameters_for(phase))
            assert params and any(p.grad is not None and p.grad.abs().sum() > 0 for p in params)

    def test_grad_checkpointing_keeps_the_loss_and_gradients_and_saves_less(self):
        """model.grad_checkpointing recomputes each block's activations in backward: the loss and gradients of
        the first phase equal the plain run's (1e-6), and fewer bytes are saved for backward."""
        runs = []
        for flag in ("false", "true"):
            cfg, task, batch = self.build(f"model.grad_checkpointing={flag}")
            n = cfg.train.batch_size
            batch["rng"] = BatchRandom(0, 0, 0, n, 0, n)
            saved = [0]

            def count(tensor):
                saved[0] += tensor.numel() * tensor.element_size()
                return tensor

            with torch.autograd.graph.saved_tensors_hooks(count, lambda tensor: tensor):
                loss, _ = task.loss(batch, task.phases[0], 0)
            loss.backward()
            grads = {name: p.grad for name, p in task.named_parameters() if p.grad is not None}
            runs.append((loss.detach(), grads, saved[0]))
        (plain_loss, plain_grads, plain_saved), (loss, grads, saved) = runs
        assert task.trained_blocks() and torch.allclose(loss, plain_loss, rtol=0, atol=1e-6)
        assert grads.keys() == plain_grads.keys()
        assert all(torch.allclose(grads[k], plain_grads[k], rtol=1e-5, atol=1e-6) for k in grads)
        assert saved < plain_saved

    def test_loss_is_deterministic_given_the_batch_rng(self):
        cfg, task, batch = self.build()
        n = cfg.train.batch_size
        losses = []
        for _ in range(2):
            batch["rng"] = BatchRandom(0, 5, 0, n, 0, n)
            losses.append(task.loss(batch, task.phases[0], 5)[0])
        assert torch.equal(losses[0], losses[1])

    def test_sample_shape_and_range(self):
        cfg, task, _ = self.build()
        if not task.traits.makes_samples:  # an embedding model (clip): nothing to sample
            return
        task.eval()
        gen = torch.Generator().manual_seed(0)
        options = task.resolve()
        cond = task.sample_conditions(2, gen, options)
        out = task.sample(cond, gen, 2, options)
        assert out.shape[0] == 2 and out.shape[-1] == cfg.data.image_size
        assert torch.isfinite(out).all() and out.min() >= -1 and out.max() <= 1
        again = task.sample(task.sample_conditions(2, torch.Generator().manual_seed(0), options),
                            torch.Generator().manual_seed(0), 2, options)
        assert torch.equal(out, again)

    def test_checkpoint_state_is_json(self):
        _, task, _ = self.build()
        json.dumps(task.state_for_checkpoint())
        task.load_state_from_checkpoint(task.state_for_checkpoint())

    def test_ema_module_is_part_of_the_task(self):
        _, task, _ = self.build()
        ids = {id(p) for p in task.parameters()}
        assert all(id(p) in ids for p in task.ema_module().parameters())

    def test_resume_is_bit_identical(self, tmp_path):
        """N steps straight == N/2 steps, stop, the same command again (weights, EMA, family state, losses)."""
        overrides = [*self.overrides, "train.steps=4", "train.checkpoint_every=2", "train.log_every=1", "train.sample_every=0",
                     "eval.every=0"]

        def train(run_dir, stop_at=None):
            torch.manual_seed(123)  # what a new process would not share: the trainer must not depend on it
            make_trainer(load_config(self.preset, overrides), run_dir).fit(stop_at=stop_at)

        def state(run_dir):
            ckpt = Path(run_dir) / "checkpoints" / "step-000004"
            trainer_state = json.loads((ckpt / "trainer_state.json").read_text())
            return (load_file(str(ckpt / "model.safetensors")), load_file(str(ckpt / "ema.safetensors")),
                    trainer_state["family_state"])

        def losses(run_dir):
            return [{k: v for k, v in r.items() if k not in ("time", "samples_per_s")}
                    for r in map(json.loads, open(Path(run_dir) / "metrics.jsonl"))]

        train(tmp_path / "straight")
        train(tmp_path / "resumed", stop_at=2)
        train(tmp_path / "resumed")
        (model_a, ema_a, family_a), (model_b, ema_b, family_b) = state(tmp_path / "straight"), state(tmp_path / "resumed")
        assert model_a.keys() == model_b.keys() and ema_a.keys() == ema_b.keys()
        assert all(torch.equal(model_a[k], model_b[k]) for k in model_a)
        assert all(torch.equal(ema_a[k], ema_b[k]) for k in ema_a)
        assert family_a == family_b
        assert losses(tmp_path / "straight") == losses(tmp_path / "resumed")
