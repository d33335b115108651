"""`Frozen` keeps a network out of its owner's module tree: no weights in the owner's state_dict, parameters or
EMA, untouched by the owner's .train() and dtype casts, and moved to its inputs' device on use."""

import torch
from torch import nn

from genforge.nn.frozen import Frozen


class Owner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.trained = nn.Linear(2, 2)
        self.teacher = Frozen(nn.Sequential(nn.Linear(2, 3), nn.Dropout(0.5)))


def test_a_frozen_network_is_not_part_of_its_owner():
    owner = Owner()
    assert set(owner.state_dict()) == {"trained.weight", "trained.bias"}
    assert [n for n, _ in owner.named_parameters()] == ["trained.weight", "trained.bias"]
    owner.train()
    assert owner.teacher.module.training is False  # dropout stays off
    assert not any(p.requires_grad for p in owner.teacher.module.parameters())
    owner.double()
    assert owner.trained.weight.dtype == torch.float64 and owner.teacher.module[0].weight.dtype == torch.float32


def test_it_follows_its_inputs_and_reads_through_attributes():
    holder = Frozen(nn.Linear(2, 3))
    assert holder.out_features == 3  # attributes read through to the network
    moved = holder.on("meta")
    assert moved is holder.module and moved.weight.device.type == "meta"
    assert holder.on(torch.device("meta")).weight.device.type == "meta"
