"""Tensors tied in the destination (one memory) but stored as two tensors in the snapshot.

Both reads used to land in the same memory, interleaved, and the checksum of each then failed
as if the snapshot were damaged: a false "the snapshot is corrupt". Now the second is read aside
and compared: equal bytes restore (and stay tied), different bytes are a ``StateMismatchError``
naming both logical paths.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from snapshotkit import Snapshot, SnapshotManager
from snapshotkit.errors import PartialRestoreError, StateMismatchError


class Pair(torch.nn.Module):
    def __init__(self, *, tied: bool) -> None:
        super().__init__()
        self.a = torch.nn.Linear(16, 16, bias=False)
        self.b = torch.nn.Linear(16, 16, bias=False)
        if tied:
            self.b.weight = self.a.weight


def test_different_values_into_tied_destinations_are_a_state_mismatch_not_corruption(tmp_path: Path) -> None:
    Snapshot.take(str(tmp_path / "s"), {"m": Pair(tied=False)})
    with pytest.raises(StateMismatchError, match=r"'m/b.weight' and 'm/a.weight' are one tensor in the app state"):
        Snapshot(str(tmp_path / "s")).restore({"m": Pair(tied=True)})


def test_equal_values_into_tied_destinations_restore_and_stay_tied(tmp_path: Path) -> None:
    saved = Pair(tied=False)
    with torch.no_grad():
        saved.b.weight.copy_(saved.a.weight)
    saved.a.weight.data[0, 0] = float("nan")  # compared as bytes: a NaN equals itself here
    saved.b.weight.data[0, 0] = float("nan")
    Snapshot.take(str(tmp_path / "s"), {"m": saved})
    model = Pair(tied=True)
    Snapshot(str(tmp_path / "s")).restore({"m": model})
    assert model.a.weight is model.b.weight
    assert torch.equal(model.a.weight.view(torch.int32), saved.a.weight.view(torch.int32))


@pytest.mark.parametrize(("saved_tied", "restored_tied"), [(True, True), (True, False), (False, False)])
def test_every_other_pairing_restores_bit_exact(tmp_path: Path, saved_tied: bool, restored_tied: bool) -> None:
    saved = Pair(tied=saved_tied)
    Snapshot.take(str(tmp_path / "s"), {"m": saved})
    model = Pair(tied=restored_tied)
    Snapshot(str(tmp_path / "s")).restore({"m": model})
    assert torch.equal(model.a.weight, saved.a.weight) and torch.equal(model.b.weight, saved.b.weight)
    assert (model.a.weight is model.b.weight) == restored_tied


def test_restore_latest_does_not_pass_off_a_half_written_tied_model(tmp_path: Path) -> None:
    manager = SnapshotManager(str(tmp_path / "run"))
    manager.save(1, {"m": Pair(tied=False)})
    manager.wait()
    # m/a.weight was read into the model before the comparison failed: never "nothing restored".
    with pytest.raises(PartialRestoreError) as raised:
        manager.restore_latest({"m": Pair(tied=True)})
    assert "m/b.weight" in str(raised.value)
