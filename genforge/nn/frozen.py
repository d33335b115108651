"""`Frozen`: the one way genforge keeps a frozen network (a pretrained text encoder, CLIP, a perceptual loss's
feature network) out of the module tree of the task that uses it."""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import torch
from torch import nn

M = TypeVar("M", bound=nn.Module)


def module_device(module: nn.Module) -> torch.device | None:
    """The device of a module's first parameter or buffer (None: it holds no tensors)."""
    for tensor in (*module.parameters(), *module.buffers()):
        return tensor.device
    return None


class Frozen(Generic[M]):
    """Holds a frozen network in eval mode with requires_grad off. Set as an attribute of a module
    (`task.text_encoder = Frozen(encoder)`) it is a plain attribute, not a submodule (nn.Module registers only
    Modules, Parameters and Tensors): its weights stay out of the owner's `state_dict()`, `parameters()`, EMA,
    optimizers and DDP/FSDP wrapping (checkpoints do not carry GBs of fixed T5 or CLIP weights), and the owner's
    `.to()` / `.train()` leave it alone. `on(device)` moves it where its inputs are; other attributes read through
    to the network (`holder.embed_dim`)."""

    def __init__(self, module: M) -> None:
        self.module: M = module.eval().requires_grad_(False)

    def on(self, device: torch.device | str) -> M:
        """The network, on `device` (moved there on first use there)."""
        device = torch.device(device)
        current = module_device(self.module)
        if current is not None and (current.type, current.index or 0) != (device.type, device.index or 0):
            self.module.to(device)
        return self.module

    def __getattr__(self, name: str) -> Any:
        if name == "module":  # not set yet (copy/unpickle): no recursion
            raise AttributeError(name)
        return getattr(self.module, name)

    def __repr__(self) -> str:
        return f"Frozen({type(self.module).__name__})"


def held_on(module: nn.Module | Frozen, device: torch.device | str) -> nn.Module:
    """The network of a submodule or of a `Frozen` holder, on `device` (a submodule is moved with its owner; a held
    one follows its inputs). Where the application decides how a frozen input is kept (a codec: a copy in the
    checkpoints, or a reference), the task reaches it through this."""
    return module.on(device) if isinstance(module, Frozen) else module
