"""A tiny LightningModule, data and a stateful callback, built for either Lightning distribution,
and the runs the tests compare (an uninterrupted one, one resumed from a checkpoint)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader, TensorDataset

#: the Lightning distributions' trainer packages: ``lightning.pytorch`` and ``pytorch_lightning``.
FLAVOURS = ("lightning.pytorch", "pytorch_lightning")
BATCHES_PER_EPOCH = 4


@dataclass(frozen=True)
class Flavour:
    """One Lightning distribution's classes."""

    pl: Any  # the package: Trainer, LightningModule, Callback
    ModelCheckpoint: Any

    @classmethod
    def load(cls, name: str) -> Flavour:
        pl = importlib.import_module(name)
        return cls(pl, importlib.import_module(f"{name}.callbacks").ModelCheckpoint)

    def module(self, seed: int = 0) -> Any:
        torch.manual_seed(seed)
        return _module_class(self.pl)(hidden=8)

    def counter(self) -> Any:
        return _counter_class(self.pl)()

    def trainer(self, root: Path | str, max_steps: int, plugins: list[Any], callbacks: list[Any]) -> Any:
        return self.pl.Trainer(
            max_steps=max_steps,
            accelerator="cpu",
            devices=1,
            enable_progress_bar=False,
            enable_model_summary=False,
            logger=False,
            num_sanity_val_steps=0,
            limit_val_batches=0,
            default_root_dir=str(root),
            plugins=plugins,
            callbacks=callbacks,
            enable_checkpointing=any(isinstance(c, self.ModelCheckpoint) for c in callbacks),
        )


def data() -> DataLoader[tuple[torch.Tensor, ...]]:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(BATCHES_PER_EPOCH * 4, 6, generator=generator)
    y = torch.randn(BATCHES_PER_EPOCH * 4, 2, generator=generator)
    return DataLoader(TensorDataset(x, y), batch_size=4, shuffle=False)


_CLASSES: dict[tuple[str, str], type] = {}


def _module_class(pl: Any) -> type:
    key = (pl.__name__, "module")
    if key not in _CLASSES:

        class Tiny(pl.LightningModule):  # type: ignore[name-defined,misc]
            def __init__(self, hidden: int) -> None:
                super().__init__()
                self.save_hyperparameters()
                self.net = torch.nn.Sequential(torch.nn.Linear(6, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, 2))
                self.register_buffer("seen", torch.zeros((), dtype=torch.int64))

            def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
                x, y = batch
                self.seen += 1
                return torch.nn.functional.mse_loss(self.net(x), y)

            def configure_optimizers(self) -> Any:
                optimizer = torch.optim.AdamW(self.parameters(), lr=0.05)
                scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
                return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

        _CLASSES[key] = Tiny
    return _CLASSES[key]


def _counter_class(pl: Any) -> type:
    key = (pl.__name__, "counter")
    if key not in _CLASSES:

        class BatchCounter(pl.Callback):  # type: ignore[name-defined,misc]
            """Counts the batches trained and sums their losses: state a resume must bring back."""

            def __init__(self) -> None:
                self.batches = 0
                self.loss_sum = 0.0

            def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
                self.batches += 1
                self.loss_sum += float(outputs["loss"])

            def state_dict(self) -> dict[str, Any]:
                return {"batches": self.batches, "loss_sum": self.loss_sum}

            def load_state_dict(self, state_dict: dict[str, Any]) -> None:
                self.batches = state_dict["batches"]
                self.loss_sum = state_dict["loss_sum"]

        _CLASSES[key] = BatchCounter
    return _CLASSES[key]


def state_of(trainer: Any, module: Any, counter: Any) -> dict[str, Any]:
    """Everything a resume must bring back exactly, after a run."""
    optimizer = trainer.optimizers[0]
    scheduler = trainer.lr_scheduler_configs[0].scheduler
    return {
        "weights": {k: v.clone() for k, v in module.state_dict().items()},
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "global_step": trainer.global_step,
        "epoch": trainer.current_epoch,
        "counter": (counter.batches, counter.loss_sum),
    }


def assert_same_state(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Bit-exact: tensors by ``torch.equal``, everything else by ``==``."""
    assert a.keys() == b.keys()
    for name in a:
        _assert_equal(a[name], b[name], name)


def _assert_equal(a: Any, b: Any, where: str) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), where
        for key in a:
            _assert_equal(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for index, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_equal(x, y, f"{where}/{index}")
    else:
        assert a == b, (where, a, b)
