"""A small FSDP2 model and its AdamW, and one training step: for tests of sharded state on gloo ranks."""

from __future__ import annotations

import torch


def fsdp_model(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """Two ``fully_shard``-ed linear layers (DTensor parameters) and an AdamW over them."""
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 33), torch.nn.ReLU(), torch.nn.Linear(33, 5))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=0.01)


def train_step(model: torch.nn.Module, optim: torch.optim.Optimizer, seed: int) -> None:
    """One step on a batch drawn from ``seed`` (the optimizer's state exists after the first)."""
    torch.manual_seed(seed)
    model(torch.randn(8, 16)).pow(2).mean().backward()
    optim.step()
    optim.zero_grad()
