"""Regression tests for bugs found in review; each names what went wrong before the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from snapshotkit import Snapshot, StateDict
from snapshotkit._config import Config
from snapshotkit._dist import resolve_group
from snapshotkit._take.engine import run_prepared
from snapshotkit._take.prepare import prepare_take
from snapshotkit._take.writers import InlineWriter
from snapshotkit.errors import SnapshotExistsError
from snapshotkit.manifest import ObjectEntry, TensorEntry
from snapshotkit.storage import FSStoragePlugin, url_to_storage_plugin


def test_torch_save_payloads_larger_than_a_chunk_stay_one_piece(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before: a quantized tensor or object above SNAPSHOTKIT_CHUNK_BYTES was split into several
    # pieces, which the manifest decoder (rightly) refuses for torch_save data.
    monkeypatch.setenv("SNAPSHOTKIT_CHUNK_BYTES", "4096")
    quantized = torch.quantize_per_tensor(torch.linspace(-1, 1, 20_000), 0.01, 0, torch.qint8)
    blob = set(range(5_000))
    Snapshot.take(str(tmp_path / "s"), {"sd": StateDict(q=quantized, blob=blob)})
    snapshot = Snapshot(str(tmp_path / "s"))
    manifest = snapshot.get_manifest()
    entry = manifest["0/sd/q"]
    assert isinstance(entry, TensorEntry) and len(entry.pieces) == 1 and entry.pieces[0].nbytes > 4096
    assert isinstance(manifest["0/sd/blob"], ObjectEntry)
    assert torch.equal(snapshot.read_object("sd/q").int_repr(), quantized.int_repr())
    assert snapshot.read_object("sd/blob") == blob


def test_a_losing_concurrent_take_does_not_damage_the_committed_snapshot(tmp_path: Path) -> None:
    # Before: data object names were the same for every take to a path, so a second take that
    # passed the existence check before the first committed overwrote (and then deleted) the
    # first snapshot's data objects.
    path = str(tmp_path / "s")
    winner = {"sd": StateDict(t=torch.arange(1000.0))}
    loser = {"sd": StateDict(t=torch.zeros(1000))}
    config = Config.resolve()
    group = resolve_group(None)
    prepared = prepare_take(
        path, loser, group=group, config=config, replicated=[], open_plugin=lambda p: url_to_storage_plugin(p, {})
    )
    Snapshot.take(path, winner)

    with pytest.raises(SnapshotExistsError):
        run_prepared(prepared, group=group, config=config, storage_options={}, writer=InlineWriter()).wait()
    assert torch.equal(Snapshot(path).read_object("sd/t"), torch.arange(1000.0))


def test_strings_that_are_not_valid_utf8_round_trip(tmp_path: Path) -> None:
    # Before: a lone surrogate went inline into the UTF-8 manifest and the commit crashed with
    # a raw UnicodeEncodeError.
    odd = "bad \udcff surrogate"
    Snapshot.take(str(tmp_path / "s"), {"sd": StateDict(s=odd, ok="ünï")})
    fresh = StateDict()
    Snapshot(str(tmp_path / "s")).restore({"sd": fresh})
    assert fresh["s"] == odd and fresh["ok"] == "ünï"


@pytest.mark.timeout(60)
def test_keyboard_interrupt_raised_on_the_loop_does_not_hang_snapshotkit(tmp_path: Path) -> None:
    # Before: a KeyboardInterrupt raised by plugin code on snapshotkit's loop thread stopped the
    # loop, so this take and every later snapshotkit call waited forever.
    from snapshotkit.storage import register_storage_plugin
    from snapshotkit.storage._registry import _registered

    class InterruptingFS(FSStoragePlugin):
        async def write(self, location: str, data: object) -> None:  # type: ignore[override]
            raise KeyboardInterrupt

    register_storage_plugin("interrupting", lambda root, options: InterruptingFS(root))
    try:
        with pytest.raises(KeyboardInterrupt):
            Snapshot.take(f"interrupting://{tmp_path / 'a'}", {"sd": StateDict(t=torch.zeros(3))})
    finally:
        _registered.pop("interrupting", None)
    assert not (tmp_path / "a").exists()
    Snapshot.take(str(tmp_path / "b"), {"sd": StateDict(t=torch.ones(3))})
    assert torch.equal(Snapshot(str(tmp_path / "b")).read_object("sd/t"), torch.ones(3))
