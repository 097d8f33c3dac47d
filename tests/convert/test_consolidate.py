"""consolidate_snapshot: a self-contained copy of an incremental chain (and of full snapshots), on real
storage: local directories and SeaweedFS over S3; exports of incremental snapshots."""

from __future__ import annotations

import contextlib
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch
from _chain import USER_METADATA, assert_same, empty_like, take_chain
from _snapshots import assert_nothing_committed, files_of, flip_byte

from snapshotkit import Snapshot
from snapshotkit._format.checksum import content_hash
from snapshotkit._format.entries import pieces_of
from snapshotkit.convert import consolidate_snapshot, export_snapshot
from snapshotkit.errors import (
    BaseSnapshotError,
    ChecksumMismatchError,
    FolderOfSnapshotsError,
    SnapshotExistsError,
)
from snapshotkit.manifest import SnapshotMetadata
from snapshotkit.verify import verify_snapshot

pytestmark = [
    pytest.mark.usefixtures("clean_env"),
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),  # DCP in one process
]

GOLDEN_V2 = Path(__file__).resolve().parents[1] / "golden" / "v2" / "sharded"


def _without_pieces(metadata: SnapshotMetadata) -> dict[str, Any]:
    """The manifest as JSON with every piece's location and byte range left out (kept: checksum, hash)."""

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in ("location", "byte_range", "base")}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return {key: strip(entry.to_json()) for key, entry in metadata.manifest.items()}


def _restored(path: str, state: dict[str, Any], **options: Any) -> dict[str, Any]:
    out = empty_like(state)
    Snapshot(path, storage_options=options or None).restore(out)
    return {name: dict(value) for name, value in out.items()}


def _plain(state: dict[str, Any]) -> dict[str, Any]:
    return {name: dict(value) for name, value in state.items()}


@pytest.fixture
def chain(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    run = tmp_path / "run"
    return run, take_chain(str(run))


def test_a_consolidated_chain_outlives_its_bases(chain: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    run, state = chain
    source = Snapshot(str(run / "step_3")).metadata
    assert set(source.bases) == {"../step_1", "../step_2"}
    dst = tmp_path / "copies" / "step_3"
    # A small budget: several data objects, each written while the next is read.
    copy = consolidate_snapshot(run / "step_3", dst, memory_budget_bytes=400_000)
    metadata = copy.metadata
    assert metadata.bases == {} and metadata.snapshot_id not in (None, source.snapshot_id)
    assert metadata.format_version == 5 and metadata.world_size == 1
    assert metadata.user_metadata == USER_METADATA
    assert _without_pieces(metadata) == _without_pieces(source)  # every entry, checksums and hashes kept
    pieces = [piece for entry in metadata.manifest.values() for piece in pieces_of(entry)]
    assert all(piece.base is None and piece.location.startswith("data/") for piece in pieces)
    assert len({piece.location for piece in pieces}) > 1
    shutil.rmtree(run)  # every base gone, the source too
    assert_same(_restored(str(dst), state), _plain(state))
    report = verify_snapshot(str(dst))
    assert report.ok and report.pieces_checked == len({(p.location, p.byte_range) for p in pieces})


def test_a_full_multi_rank_snapshot_of_an_old_format(tmp_path: Path) -> None:
    """Golden v2: two ranks, sharded, replicated and per-rank entries; hashes are computed (v2 has none)."""
    source = Snapshot(str(GOLDEN_V2)).metadata
    copy = consolidate_snapshot(GOLDEN_V2, tmp_path / "copy").metadata
    assert copy.world_size == 2 and copy.format_version == 5
    assert list(copy.manifest) == list(source.manifest)
    for key, entry in source.manifest.items():
        mine = copy.manifest[key]
        assert type(mine) is type(entry) and getattr(mine, "replicated", None) == getattr(entry, "replicated", None)
        assert [p.checksum for p in pieces_of(mine)] == [p.checksum for p in pieces_of(entry)]
        for piece in pieces_of(mine):
            start, end = piece.byte_range
            assert piece.hash == content_hash((tmp_path / "copy" / piece.location).read_bytes()[start:end])
    assert verify_snapshot(str(tmp_path / "copy")).ok
    for key in source.manifest:
        logical_path = key if source.world_size > 1 else key.partition("/")[2]
        if pieces_of(source.manifest[key]):
            expected = Snapshot(str(GOLDEN_V2)).read_object(logical_path)
            assert_same(Snapshot(str(tmp_path / "copy")).read_object(logical_path), expected, key)


def test_a_damaged_referenced_piece_commits_nothing(chain: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    run, _ = chain
    piece = Snapshot(str(run / "step_3")).metadata.manifest["0/m/a"].pieces[0]
    assert piece.base == "../step_2"
    flip_byte(run / "step_2" / piece.location, piece.byte_range[0] + 7)
    dst = tmp_path / "copy"
    # The pieces of step_1 come first and are written before step_2's damaged piece is read.
    with pytest.raises(ChecksumMismatchError, match=r"logical path 'm/a'.*'\.\./step_2/data/") as info:
        consolidate_snapshot(run / "step_3", dst, memory_budget_bytes=400_000)
    assert "corrupt" in str(info.value)
    assert_nothing_committed(dst)
    assert not dst.exists()


def test_a_missing_base_is_named_before_anything_is_written(chain: tuple[Path, dict[str, Any]], tmp_path: Path) -> None:
    run, _ = chain
    shutil.rmtree(run / "step_1")
    with pytest.raises(BaseSnapshotError, match=r"'\.\./step_1'.*deleted"):
        consolidate_snapshot(run / "step_3", tmp_path / "copy")
    assert not (tmp_path / "copy").exists()


def test_an_existing_destination_is_never_overwritten(chain: tuple[Path, dict[str, Any]]) -> None:
    run, _ = chain
    before = files_of(run / "step_2")
    with pytest.raises(SnapshotExistsError, match="never overwrites"):
        consolidate_snapshot(run / "step_3", run / "step_2")
    with pytest.raises(SnapshotExistsError):
        consolidate_snapshot(run / "step_3", run / "step_3")
    assert files_of(run / "step_2") == before


def test_a_copy_into_the_run_folder_itself_is_refused(chain: tuple[Path, dict[str, Any]]) -> None:
    # Before: the copy was written at the run folder itself, beside its step_<n> snapshots.
    run, _ = chain
    before = files_of(run)
    with pytest.raises(FolderOfSnapshotsError, match="Give the consolidate the path of its own step"):
        consolidate_snapshot(run / "step_3", run)
    assert files_of(run) == before


@pytest.mark.parametrize("to", ["torch", "safetensors", "dcp"])
def test_export_of_an_incremental_snapshot_equals_that_of_a_full_one(
    chain: tuple[Path, dict[str, Any]], tmp_path: Path, to: str
) -> None:
    run, state = chain
    Snapshot.take(str(run / "full_3"), state)  # the same state, self-contained
    assert Snapshot(str(run / "full_3")).metadata.bases == {}
    out = tmp_path / "out"
    out.mkdir()
    incremental = export_snapshot(run / "step_3", out / f"incremental.{to}", to=to)
    full = export_snapshot(run / "full_3", out / f"full.{to}", to=to)
    assert incremental.tensors_written == full.tensors_written > 0
    assert incremental.skipped == full.skipped
    mine, theirs = _load(out / f"incremental.{to}", to), _load(out / f"full.{to}", to)
    assert_same(mine, theirs)
    assert torch.equal(_tensor(mine, to, "m/b"), state["m"]["b"])  # referenced in step_1


def _load(path: Path, to: str) -> Any:
    if to == "torch":
        return torch.load(path, weights_only=True)
    if to == "safetensors":
        return safetensors.torch.load_file(path)
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    converted = path.with_suffix(".pt")
    dcp_to_torch_save(path, converted)
    return torch.load(converted, weights_only=False)


def _tensor(loaded: Any, to: str, logical_path: str) -> torch.Tensor:
    if to == "safetensors":
        return loaded[logical_path.replace("/", ".")]
    value = loaded
    for part in logical_path.split("/"):
        value = value[part]
    return value


def test_s3_source_and_destination(seaweed_s3_endpoint: str) -> None:
    boto3 = pytest.importorskip("boto3")
    client = boto3.client("s3", endpoint_url=seaweed_s3_endpoint)
    bucket = "snapshotkit-consolidate"
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket=bucket)
    prefix = uuid.uuid4().hex
    run = f"s3://{bucket}/{prefix}/run"
    options = {"endpoint_url": seaweed_s3_endpoint}
    try:
        state = take_chain(run, options)
        dst = f"s3://{bucket}/{prefix}/copies/step_3"
        copy = consolidate_snapshot(f"{run}/step_3", dst, storage_options=options, memory_budget_bytes=400_000)
        assert copy.metadata.bases == {}
        _delete_prefix(client, bucket, f"{prefix}/run/")  # the source and its bases
        assert_same(_restored(dst, state, **options), _plain(state))
        assert verify_snapshot(dst, storage_options=options).ok
    finally:
        _delete_prefix(client, bucket, f"{prefix}/")


def _delete_prefix(client: Any, bucket: str, prefix: str) -> None:
    listed = client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    for item in listed:
        client.delete_object(Bucket=bucket, Key=item["Key"])
