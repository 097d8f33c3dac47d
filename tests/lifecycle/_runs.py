"""A tiny training run for the manager tests: state that changes every step, and checks of it."""

from __future__ import annotations

import itertools
from typing import Any

import torch

from snapshotkit import RNGState, StateDict

_roots = itertools.count()


def memory_root(name: str) -> str:
    """A fresh ``memory://`` root (the memory store is process-wide)."""
    return f"memory://manager-tests/{name}-{next(_roots)}"


def make_state(seed: int = 0) -> dict[str, Any]:
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    optim = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    return {"model": model, "optim": optim, "progress": StateDict(step=0), "rng": RNGState()}


def train_step(state: dict[str, Any]) -> float:
    model, optim = state["model"], state["optim"]
    loss = model(torch.randn(8, 4)).pow(2).mean()
    optim.zero_grad()
    loss.backward()
    optim.step()
    state["progress"]["step"] += 1
    return loss.item()


def weights(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in state["model"].state_dict().items()}


def same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
