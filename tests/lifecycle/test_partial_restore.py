"""restore_latest never passes off a failed restore as "nothing to resume from".

A damaged snapshot is found while its bytes land in the model's own tensors (direct reads,
verified after): when no snapshot restores after such an attempt, ``restore_latest`` raises
``PartialRestoreError`` naming each attempt; None only when nothing was changed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _snapshots import MANIFEST, flip_byte, piece_of

from lifecycle._runs import make_state, same_weights, train_step, weights
from snapshotkit import SnapshotManager, StateDict
from snapshotkit.errors import ChecksumMismatchError, InvalidAppStateError, PartialRestoreError


def take_steps(root: Path, steps: list[int]) -> None:
    state = make_state()
    with SnapshotManager(str(root)) as mgr:
        for step in steps:
            train_step(state)
            mgr.save(step, state)


def damage_weight(root: Path, step: int) -> None:
    data_object, start, _ = piece_of(root / f"step_{step}", "model/weight")
    flip_byte(data_object, start)


def damage_manifest(root: Path, step: int) -> None:
    manifest = root / f"step_{step}" / MANIFEST
    text = bytearray(manifest.read_bytes())
    text[-10] ^= 0x20
    manifest.write_bytes(bytes(text))


def test_one_damaged_snapshot_that_was_read_into_the_model_raises(tmp_path: Path) -> None:
    # Before: a RuntimeWarning, then None; `restore_latest(...) or 0` trained from step 0 on
    # weights that were partly overwritten with the damaged snapshot's bytes.
    take_steps(tmp_path, [10])
    damage_weight(tmp_path, 10)
    fresh = make_state(seed=5)
    before = weights(fresh)
    mgr = SnapshotManager(str(tmp_path), async_executor=None)
    with mgr, pytest.warns(RuntimeWarning, match="step 10"), pytest.raises(PartialRestoreError) as info:
        mgr.restore_latest(fresh)
    assert not same_weights(weights(fresh), before)  # the premise: the model really was written into
    error = info.value
    assert isinstance(error, RuntimeError)
    assert isinstance(error.__cause__, ChecksumMismatchError)
    assert [step for step, _ in error.attempts] == [10]
    assert error.attempts[0][1].startswith("ChecksumMismatchError: checksum mismatch for logical path 'model/weight'")
    message = str(error)
    assert "restored no snapshot" in message
    assert f"step 10 at {str(tmp_path / 'step_10')!r}: ChecksumMismatchError" in message
    assert "may have written into the state" in message
    assert "Do not train on from these objects" in message


def test_every_attempt_is_named_with_whether_it_wrote(tmp_path: Path) -> None:
    take_steps(tmp_path, [10, 20, 30])
    damage_manifest(tmp_path, 30)  # found before anything is read
    damage_weight(tmp_path, 20)  # found after the weights were read in place
    damage_manifest(tmp_path, 10)
    mgr = SnapshotManager(str(tmp_path), async_executor=None)
    with mgr, pytest.warns(RuntimeWarning), pytest.raises(PartialRestoreError) as info:
        mgr.restore_latest(make_state(seed=5))
    assert [step for step, _ in info.value.attempts] == [30, 20, 10]
    message = str(info.value)
    assert message.index("step 30") < message.index("step 20") < message.index("step 10")
    assert "ManifestIntegrityError" in message and "ChecksumMismatchError" in message
    assert message.count("failed before writing anything") == 2
    assert message.count("may have written into the state") == 1
    assert "ManifestIntegrityError" in type(info.value.__cause__).__name__


def test_none_when_every_attempt_failed_before_writing(tmp_path: Path) -> None:
    take_steps(tmp_path, [10, 20])
    damage_manifest(tmp_path, 20)
    damage_manifest(tmp_path, 10)
    fresh = make_state(seed=5)
    before = weights(fresh)
    with SnapshotManager(str(tmp_path), async_executor=None) as mgr, pytest.warns(RuntimeWarning):
        assert mgr.restore_latest(fresh) is None
    assert same_weights(weights(fresh), before)


def test_none_when_the_damaged_bytes_went_only_into_new_tensors(tmp_path: Path) -> None:
    # strict=False with a destination of another shape: the saved tensor is read into a new
    # tensor, so the damage is found before anything of the caller's was written.
    root = tmp_path / "root"
    with SnapshotManager(str(root)) as mgr:
        mgr.save(1, {"s": StateDict(w=torch.arange(64.0))})
    data_object, start, _ = piece_of(root / "step_1", "s/w")
    flip_byte(data_object, start)
    destination = StateDict(w=torch.zeros(1))
    with SnapshotManager(str(root), async_executor=None) as mgr, pytest.warns(RuntimeWarning, match="Checksum"):
        assert mgr.restore_latest({"s": destination}, strict=False) is None
    assert torch.equal(destination["w"], torch.zeros(1))


def test_app_state_is_checked_before_the_root_is_read(tmp_path: Path) -> None:
    # Before: an empty root returned None for any app_state; a root with snapshots reported a
    # damaged snapshot before the wrong argument.
    with SnapshotManager(str(tmp_path / "empty"), async_executor=None) as mgr:
        with pytest.raises(InvalidAppStateError, match=r"app_state\['optim'\] is a int"):
            mgr.restore_latest({"optim": 1})  # type: ignore[dict-item]
        with pytest.raises(InvalidAppStateError, match=r"app_state\['optim'\] is a int"):
            mgr.save(1, {"optim": 1})  # type: ignore[dict-item]
        assert mgr.steps() == []


class _RefusesToLoad(StateDict):
    def load_state_dict(self, state_dict: dict[str, object]) -> None:
        raise ValueError("refused on purpose")


def test_a_failure_that_is_raised_after_writing_says_so_too(tmp_path: Path) -> None:
    # Not a damaged snapshot, so not skipped; but the model was loaded before "z" refused.
    with SnapshotManager(str(tmp_path)) as mgr:
        mgr.save(1, {"a": StateDict(w=torch.arange(4.0)), "z": StateDict(x=1)})
    destination = StateDict(w=torch.zeros(4))
    mgr = SnapshotManager(str(tmp_path), async_executor=None)
    with mgr, pytest.raises(PartialRestoreError, match=r"step 1 at .*ValueError: refused on purpose") as info:
        mgr.restore_latest({"a": destination, "z": _RefusesToLoad(x=0)})
    assert isinstance(info.value.__cause__, ValueError)
    assert torch.equal(destination["w"], torch.arange(4.0))  # the premise: "a" was loaded
