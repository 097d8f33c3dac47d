"""Reading a manager's root (``_lifecycle/catalog.py``): step directories, what is ours, records."""

from __future__ import annotations

from snapshotkit._lifecycle.catalog import MANAGER_KEY, manager_record, parse_listing
from snapshotkit._lifecycle.retention import StepRecord

DATA = "data/0_00000_1a2b3c4d"


def test_listing_groups_step_directories_and_ignores_the_rest() -> None:
    listing = parse_listing(
        [
            f"step_10/{DATA}",
            "step_10/.snapshot_metadata",
            f"step_2/{DATA}",
            "step_007/.snapshot_metadata",  # padded: not a name the manager writes
            "step_x/.snapshot_metadata",
            "step_3",  # a file, not a directory
            "notes.txt",
            "other/step_4/.snapshot_metadata",
        ]
    )
    assert sorted(listing.steps) == [2, 10]
    assert listing.committed == [10]
    assert listing.incomplete == [2]


def test_committed_is_numeric_order() -> None:
    listing = parse_listing([f"step_{n}/.snapshot_metadata" for n in (100, 9, 10, 0)])
    assert listing.committed == [0, 9, 10, 100]


def test_only_ours_recognises_what_a_take_writes() -> None:
    ours = parse_listing(
        [f"step_1/{DATA}", "step_1/data/3_00012_ffffffff", "step_1/.snapshot_metadata.tmp-0123abcd"]
    ).steps[1]
    assert ours.only_ours and not ours.committed
    for foreign in ("step_1/.metadata", "step_1/__0_0.distcp", "step_1/data/model.pt", "step_1/README"):
        assert not parse_listing([f"step_1/{DATA}", foreign]).steps[1].only_ours


def test_manager_record_needs_the_managers_key_for_this_step() -> None:
    good = {MANAGER_KEY: {"step": 5, "metrics": {"loss": 0.5, "acc": 1, "bad": None}, "reason": "interval"}}
    assert manager_record(5, good) == StepRecord(5, {"loss": 0.5, "acc": 1.0, "bad": None})
    assert manager_record(6, good) is None  # copied or renamed from step 5
    assert manager_record(5, {}) is None
    assert manager_record(5, {MANAGER_KEY: {"step": True}}) is None
    assert manager_record(5, {MANAGER_KEY: {"step": 5, "metrics": [1]}}) is None
    assert manager_record(5, {MANAGER_KEY: "5"}) is None
