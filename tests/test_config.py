"""``snapshotkit._config``: arguments beat ``SNAPSHOTKIT_*`` variables beat defaults; bad values are refused."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from _snapshots import make_app_state, take_basic

from snapshotkit import Snapshot, StateDict
from snapshotkit._config import Config, available_memory_bytes, default_memory_budget_bytes
from snapshotkit.errors import ConfigError


def test_argument_beats_environment_beats_default(monkeypatch: pytest.MonkeyPatch) -> None:
    # The default follows the RAM available now: hold it still, or another process's
    # allocation between the two readings below fails the test.
    monkeypatch.setattr("snapshotkit._config.available_memory_bytes", lambda: 8 << 30)
    env = {"SNAPSHOTKIT_MEMORY_BUDGET_BYTES": "1_000_000"}
    assert Config.resolve(memory_budget_bytes=5, environ=env).memory_budget_bytes == 5
    assert Config.resolve(environ=env).memory_budget_bytes == 1_000_000
    assert Config.resolve(environ={}).memory_budget_bytes == default_memory_budget_bytes()


@pytest.mark.skipif(not Path("/proc/meminfo").exists(), reason="reads /proc/meminfo")
def test_available_memory_is_what_psutil_reports_without_importing_it() -> None:
    psutil = pytest.importorskip("psutil")
    # Both follow what other processes allocate: equal up to what changes between two readings.
    assert abs(available_memory_bytes() - psutil.virtual_memory().available) < 1 << 30


def test_default_budget_is_bounded() -> None:
    budget = default_memory_budget_bytes()
    assert 64 << 20 <= budget <= 32 << 30
    assert default_memory_budget_bytes(local_world_size=8) <= budget


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("SNAPSHOTKIT_MEMORY_BUDGET_BYTES", "lots"),
        ("SNAPSHOTKIT_MEMORY_BUDGET_BYTES", "-5"),
        ("SNAPSHOTKIT_CHUNK_BYTES", "0"),
        ("SNAPSHOTKIT_VERIFY_CHECKSUMS", "maybe"),
        ("SNAPSHOTKIT_BACKGROUND_NICENESS", "-1"),
        ("SNAPSHOTKIT_BACKGROUND_NICENESS", "20"),
        ("SNAPSHOTKIT_BACKGROUND_NICENESS", "low"),
    ],
)
def test_bad_environment_values_are_config_errors(name: str, value: str) -> None:
    with pytest.raises(ConfigError, match=name):
        Config.resolve(environ={name: value})


def test_verify_checksums_from_environment() -> None:
    assert Config.resolve(environ={"SNAPSHOTKIT_VERIFY_CHECKSUMS": "0"}).verify_checksums is False
    assert Config.resolve(verify_checksums=True, environ={"SNAPSHOTKIT_VERIFY_CHECKSUMS": "0"}).verify_checksums


def test_explicit_non_positive_budget_is_rejected() -> None:
    with pytest.raises(ConfigError, match="memory_budget_bytes"):
        Config.resolve(memory_budget_bytes=0, environ={})


def test_background_niceness_default_environment_and_bounds() -> None:
    assert Config.resolve(environ={}).background_niceness == 19
    assert Config.resolve(environ={"SNAPSHOTKIT_BACKGROUND_NICENESS": "0"}).background_niceness == 0
    assert Config.resolve(environ={"SNAPSHOTKIT_BACKGROUND_NICENESS": "7"}).background_niceness == 7
    for bad in (-1, 20, True, 1.5):
        with pytest.raises(ConfigError, match="background_niceness must be an integer from 0 to 19"):
            Config(memory_budget_bytes=1 << 20, background_niceness=bad)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# bad configuration reaches every entry point as a ConfigError


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("SNAPSHOTKIT_MEMORY_BUDGET_BYTES", "abc"),
        ("SNAPSHOTKIT_MEMORY_BUDGET_BYTES", "-1"),
        ("SNAPSHOTKIT_MEMORY_BUDGET_BYTES", "0"),
        ("SNAPSHOTKIT_MEMORY_BUDGET_BYTES", "1.5GB"),
        ("SNAPSHOTKIT_CHUNK_BYTES", "lots"),
        ("SNAPSHOTKIT_DATA_OBJECT_BYTES", "0"),
        ("SNAPSHOTKIT_IO_CONCURRENCY", "four"),
        ("SNAPSHOTKIT_VERIFY_CHECKSUMS", "maybe"),
    ],
)
def test_invalid_environment_variable_raises_config_error(
    tmp_path: Path, clean_env: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    clean_env.setenv(variable, value)

    calls: list[Callable[[], Any]] = [
        lambda: Snapshot.take(str(tmp_path / "other"), make_app_state()),
        lambda: Snapshot(str(path)).restore({"extras": StateDict()}),
        lambda: Snapshot(str(path)).read_object("extras/w"),
    ]
    for call in calls:
        with pytest.raises(ConfigError) as info:
            call()
        exc = info.value
        assert isinstance(exc, ValueError)
        message = str(exc)
        assert variable in message
        assert repr(value) in message
    assert not (tmp_path / "other").exists()


@pytest.mark.usefixtures("clean_env")
@pytest.mark.parametrize("budget", [0, -5, 1.5, "1024", True], ids=["zero", "negative", "float", "str", "bool"])
def test_invalid_memory_budget_argument_raises_config_error(tmp_path: Path, budget: Any) -> None:
    path = tmp_path / "snap"
    take_basic(path)
    with pytest.raises(ConfigError) as info:
        Snapshot(str(path)).restore({"extras": StateDict()}, memory_budget_bytes=budget)
    assert isinstance(info.value, ValueError)
    assert "memory_budget_bytes" in str(info.value)
    assert repr(budget) in str(info.value)
    with pytest.raises(ConfigError):
        Snapshot.take(str(tmp_path / "other"), make_app_state(), memory_budget_bytes=budget)
    assert not (tmp_path / "other").exists()


@pytest.mark.parametrize(
    ("raw", "expected"), [(None, "auto"), ("auto", "auto"), (" AUTO ", "auto"), ("1", True), ("off", False)]
)
def test_share_replicated_reads_from_the_environment(raw: str | None, expected: object) -> None:
    environ = {} if raw is None else {"SNAPSHOTKIT_SHARE_REPLICATED_READS": raw}
    assert Config.resolve(memory_budget_bytes=1 << 20, environ=environ).share_replicated_reads == expected


@pytest.mark.parametrize("value", [1, 0, "yes", None])
def test_share_replicated_reads_must_be_true_false_or_auto(value: object) -> None:
    with pytest.raises(ConfigError, match="share_replicated_reads"):
        Config(memory_budget_bytes=1 << 20, share_replicated_reads=value)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="SNAPSHOTKIT_SHARE_REPLICATED_READS"):
        Config.resolve(memory_budget_bytes=1 << 20, environ={"SNAPSHOTKIT_SHARE_REPLICATED_READS": "sometimes"})
