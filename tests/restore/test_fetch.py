"""``snapshotkit._restore.fetch``: corrupt data objects (flipped bytes, truncated or deleted objects) are
detected by checksum and size, and only where they are read.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _snapshots import flip_byte, piece_of, take_basic

from snapshotkit import Snapshot, StateDict
from snapshotkit.errors import ChecksumMismatchError, IntegrityError, TruncatedDataError

pytestmark = pytest.mark.usefixtures("clean_env")


def test_flipped_byte_raises_checksum_mismatch_on_restore(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    location, start, _ = piece_of(path, "extras/w")
    flip_byte(location, start + 5)

    with pytest.raises(ChecksumMismatchError) as info:
        Snapshot(str(path)).restore({"extras": StateDict()})
    exc = info.value
    assert isinstance(exc, IntegrityError)
    assert isinstance(exc, ValueError)
    message = str(exc)
    assert "'extras/w'" in message
    assert location.relative_to(path).as_posix() in message
    assert "verify_checksums=False" in message


def test_flipped_byte_raises_checksum_mismatch_on_read_object(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    location, start, _ = piece_of(path, "model/layer1.weight")
    flip_byte(location, start)

    with pytest.raises(ChecksumMismatchError) as info:
        Snapshot(str(path)).read_object("model/layer1.weight")
    assert "'model/layer1.weight'" in str(info.value)
    with pytest.raises(ChecksumMismatchError):
        Snapshot(str(path)).read_object("model/layer1.weight", obj_out=torch.empty(2, 3))
    with pytest.raises(ChecksumMismatchError):
        Snapshot(str(path)).read_object("model")  # the subtree includes the corrupt leaf


def test_flipped_byte_in_one_tensor_does_not_affect_reading_another(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    location, start, _ = piece_of(path, "model/layer1.weight")
    flip_byte(location, start)
    bias = Snapshot(str(path)).read_object("model/layer1.bias")
    assert torch.equal(bias, torch.tensor([-1.0, 1.0]))


def test_flipped_byte_loads_without_error_when_checksums_are_off(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    location, start, _ = piece_of(path, "extras/w")
    flip_byte(location, start + 5)
    expected = torch.arange(8, dtype=torch.float32)

    extras = StateDict(step=0, w=torch.zeros(8), name="")
    Snapshot(str(path)).restore({"extras": extras}, verify_checksums=False)
    assert not torch.equal(extras["w"], expected)
    differing = (extras["w"].view(torch.uint8) != expected.view(torch.uint8)).nonzero().flatten().tolist()
    assert differing == [5]

    value = Snapshot(str(path)).read_object("extras/w", verify_checksums=False)
    assert torch.equal(value, extras["w"])


def test_flipped_byte_loads_without_error_when_checksums_are_off_by_env(
    tmp_path: Path, clean_env: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    location, start, _ = piece_of(path, "extras/w")
    flip_byte(location, start)
    clean_env.setenv("SNAPSHOTKIT_VERIFY_CHECKSUMS", "0")
    value = Snapshot(str(path)).read_object("extras/w")
    assert not torch.equal(value, torch.arange(8, dtype=torch.float32))
    # The explicit argument wins over the environment.
    with pytest.raises(ChecksumMismatchError):
        Snapshot(str(path)).read_object("extras/w", verify_checksums=True)


def test_flipped_byte_in_serialized_object_raises_checksum_mismatch(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    Snapshot.take(str(path), {"extras": StateDict(shape=torch.Size([2, 3]))})
    location, start, end = piece_of(path, "extras/shape")
    flip_byte(location, (start + end) // 2)
    with pytest.raises(ChecksumMismatchError) as info:
        Snapshot(str(path)).read_object("extras/shape")
    assert "'extras/shape'" in str(info.value)


def test_truncated_data_object_raises_truncated_data(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    location, start, _ = piece_of(path, "extras/w")
    location.write_bytes(location.read_bytes()[: start + 3])

    with pytest.raises(TruncatedDataError) as info:
        Snapshot(str(path)).read_object("extras/w")
    exc = info.value
    assert isinstance(exc, IntegrityError)
    assert isinstance(exc, ValueError)
    message = str(exc)
    assert "'extras/w'" in message
    assert location.relative_to(path).as_posix() in message
    assert "truncated" in message

    with pytest.raises(TruncatedDataError) as info:
        Snapshot(str(path)).restore({"extras": StateDict()})
    assert "'extras/w'" in str(info.value)


def test_deleted_data_object_raises_integrity_error(tmp_path: Path) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    location, _, _ = piece_of(path, "extras/w")
    location.unlink()

    with pytest.raises(IntegrityError) as info:
        Snapshot(str(path)).restore({"extras": StateDict()})
    exc = info.value
    assert isinstance(exc, ValueError)
    message = str(exc)
    assert "'extras/w'" in message
    assert location.relative_to(path).as_posix() in message
    assert "missing" in message

    with pytest.raises(IntegrityError):
        Snapshot(str(path)).read_object("extras/w")
