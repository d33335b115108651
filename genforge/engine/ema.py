"""Moving averages of a module's weights: the exponential EMA DiT and ADM sample from, or EDM2's power-function EMAs
(genforge.engine.phema)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
from torch import Tensor, nn

from genforge.core.config import TrainConfig
from genforge.core.task import Task
from genforge.engine.phema import power_beta


class EMA:
    """fp32 shadow copy of `module`'s trainable parameters (buffers, e.g. an EMA-updated codebook, stay live).

    The parameters are averaged by phase: `phases` maps a phase name to (its decay, the names of the parameters it
    trains), e.g. each U-Net of a cascade with its `train.phases.<phase>.ema_decay`; parameters of no phase keep their
    shadow bit for bit (a stage of a cascade that this run does not train). Default: one phase, "main", averaging
    every parameter at `decay`. Each phase counts its own updates n (`updates`, kept in checkpoints), and its decay
    is min(decay, (1 + n) / (10 + n)) with warm-up, 0 (a copy) while n < `start`: a phase first trained late (a
    cascade's second U-Net, a token critic added to a trained generator) warms up from its own first update, as it
    would in a run of its own.

    `gammas` (train.ema.kind=power): instead, one power-function EMA per exponent γ (EDM2), β = (1 − 1/t)^(γ+1) at a
    phase's t-th averaging update (the phases' decays and the warm-up do not apply); `shadow` is the first γ's (what
    previews, eval and sampling use), `power_shadows` the others'.
    """

    def __init__(self, module: nn.Module, decay: float, warmup: bool = True, start: int = 0,
                 phases: dict[str, tuple[float, list[str]]] | None = None, gammas: tuple[float, ...] = ()) -> None:
        self.module, self.decay, self.warmup, self.start = module, decay, warmup, start
        self.names = [n for n, p in module.named_parameters() if p.requires_grad]
        params = dict(module.named_parameters())
        self.shadow: dict[str, Tensor] = {n: params[n].detach().float().clone() for n in self.names}
        phases = phases if phases is not None else {"main": (decay, self.names)}
        trainable = set(self.names)
        self.phases: dict[str, tuple[float, list[str]]] = {  # phase -> (decay, the names averaged with it)
            phase: (phase_decay, [n for n in names if n in trainable])
            for phase, (phase_decay, names) in phases.items()}
        self.updates: dict[str, int] = dict.fromkeys(self.phases, 0)  # per phase (others' counts carried as loaded)
        self.gammas = tuple(gammas)
        self.power_shadows: list[dict[str, Tensor]] = [{n: t.clone() for n, t in self.shadow.items()}
                                                       for _ in self.gammas[1:]]

    def decay_at(self, n: int, decay: float | None = None, gamma: float | None = None) -> float:
        """The decay of a phase's update after its `n` earlier updates (0 before `start`: copy), for a phase whose
        configured decay is `decay` (default: the EMA's); with `gamma`, the power-function EMA's β_t, t the update's
        number from `start` on."""
        decay = self.decay if decay is None else decay
        if n < self.start:
            return 0.0
        n -= self.start
        if gamma is not None:
            return power_beta(n + 1, gamma)
        return min(decay, (1 + n) / (10 + n)) if self.warmup else decay

    def averaged(self) -> dict[str, int]:
        """Per phase this EMA averages, the updates t its averages hold (those from `start` on)."""
        return {phase: max(0, self.updates[phase] - self.start) for phase in self.phases}

    @torch.no_grad()
    def update(self) -> None:
        """shadow <- decay·shadow + (1 − decay)·weights for every phase's parameters (one call per phase), each at
        the decay of its own update count; then every phase has one more update."""
        params = dict(self.module.named_parameters())
        for phase, (decay, names) in self.phases.items():
            if names:
                live = [params[n].detach().float() for n in names]
                for gamma, shadow in zip(self.gammas or (None,), [self.shadow, *self.power_shadows]):
                    weight = 1.0 - self.decay_at(self.updates[phase], decay, gamma)
                    torch._foreach_lerp_([shadow[n] for n in names], live, weight)
            self.updates[phase] += 1

    def load_updates(self, updates: dict[str, int]) -> None:
        """Set the phases' update counts (from a checkpoint); the counts of phases this EMA does not average are kept
        and written back unchanged."""
        self.updates.update({phase: int(n) for phase, n in updates.items()})

    def state_dict(self) -> dict[str, Tensor]:
        return dict(self.shadow)

    def load_state_dict(self, state: dict[str, Tensor], may_lack: set[str] = frozenset()) -> None:
        """Copy `state` into the shadow weights; names in `may_lack` (weights new since `state` was saved) keep their
        current shadow when absent."""
        _copy_into(self.shadow, state, may_lack, "EMA state")

    def power_state_dict(self) -> dict[str, Tensor]:
        """The power-function EMAs after the first, `<index>/<name>` (index into `gammas`); empty otherwise."""
        return {f"{i}/{n}": t for i, shadow in enumerate(self.power_shadows, 1) for n, t in shadow.items()}

    def load_power_state_dict(self, state: dict[str, Tensor], may_lack: set[str] = frozenset()) -> None:
        """Inverse of power_state_dict (names in `may_lack` may be absent, as for `load_state_dict`)."""
        for i, shadow in enumerate(self.power_shadows, 1):
            mine = {k[len(f"{i}/"):]: t for k, t in state.items() if k.startswith(f"{i}/")}
            _copy_into(shadow, mine, may_lack, f"the power-function EMA of γ={self.gammas[i]:.3f}")

    def averages(self) -> dict[str, Tensor]:
        """Every average, `<index>/<name>`: the shadow as index 0, then the power-function EMAs after it (what a
        snapshot holds)."""
        return {**{f"0/{n}": t for n, t in self.shadow.items()}, **self.power_state_dict()}

    @contextmanager
    def swapped_in(self) -> Iterator[nn.Module]:
        """Temporarily load the EMA weights into the module (e.g. to sample), then restore the live ones."""
        params = dict(self.module.named_parameters())
        backup = {n: params[n].detach().clone() for n in self.names}
        with torch.no_grad():
            for n in self.names:
                params[n].copy_(self.shadow[n])
        try:
            yield self.module
        finally:
            with torch.no_grad():
                for n in self.names:
                    params[n].copy_(backup[n])


def _copy_into(shadow: dict[str, Tensor], state: dict[str, Tensor], may_lack: set[str], what: str) -> None:
    """Copy `state` into `shadow`; a name of `shadow` absent from `state` is a KeyError unless in `may_lack`."""
    missing = set(shadow) - set(state) - set(may_lack)
    if missing:
        raise KeyError(f"{what} lacks {sorted(missing)[:5]}")
    for n, t in shadow.items():
        if n in state:
            t.copy_(state[n])


def ema_phases(task: Task, phase_train: dict[str, TrainConfig]) -> dict[str, tuple[float, list[str]]]:
    """The `phases` of a task's EMA: each phase this run trains with its decay (`train.phases.<phase>.ema_decay`)
    and the names of the averaged parameters it trains (the last phase that lists a parameter owns it); parameters
    no phase of this run trains keep their EMA as it is."""
    phase_of = {id(p): phase for phase in task.phases for p in task.parameters_for(phase)}
    names: dict[str, list[str]] = {phase: [] for phase in task.phases}
    for name, p in task.ema_module().named_parameters():
        if id(p) in phase_of:
            names[phase_of[id(p)]].append(name)
    return {phase: (phase_train[phase].ema_decay, names[phase]) for phase in task.phases}
