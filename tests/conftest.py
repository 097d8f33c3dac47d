"""Shared fixtures, the real object-store servers on loopback, and the check that the run leaves nothing behind.

S3 is SeaweedFS ``weed mini`` and GCS is fake-gcs-server, both started through
:mod:`snapshotkit.testing` (the benchmarks use the same helpers). A test that needs a server
skips with the reason only when the server's package is missing; CI installs them all.

The session runs with ``TMPDIR`` (and :data:`tempfile.tempdir`) pointing at a fresh private
directory, inherited by every subprocess the tests start (ranks, daemons, servers, examples). At
the end it must be empty: anything left there fails the run, listed by name, and the directory is
removed either way.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.util
import os
import shutil
import sys
import tempfile
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from snapshotkit.testing import FakeGCSServer, SeaweedS3Server, ServerUnavailable

# The helpers shared by test modules assert too: rewrite them like the tests, for readable failures.
pytest.register_assert_rewrite("_snapshots", "_benchmarks", "_chain")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """Unset every ``SNAPSHOTKIT_*`` variable for the test, so the caller's environment cannot leak in.

    Returns the ``monkeypatch`` fixture, for ``clean_env.setenv(...)``.
    """
    for name in list(os.environ):
        if name.startswith("SNAPSHOTKIT_"):
            monkeypatch.delenv(name)
    return monkeypatch


# s3fs/botocore read credentials and region from the environment; never pass region_name in
# client_kwargs (s3fs.mkdir would then send a LocationConstraint that us-east-1 rejects).
os.environ.setdefault("AWS_ACCESS_KEY_ID", SeaweedS3Server.access_key)
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", SeaweedS3Server.secret_key)
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
# gcsfs >= 2026.6 stalls 30-75 s per operation against emulators unless this is off; it must be
# set before gcsfs is first imported.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")


@pytest.fixture(scope="session")
def seaweed_s3_endpoint() -> Iterator[str]:
    """URL of a SeaweedFS S3 gateway on loopback (``weed mini`` in a temp dir), for the whole session."""
    pytest.importorskip("s3fs", reason="S3 tests need s3fs (pip install s3fs)")
    try:
        with SeaweedS3Server() as server:
            yield server.endpoint_url
    except ServerUnavailable as exc:
        pytest.skip(f"S3 tests need SeaweedFS: {exc}")


@pytest.fixture(scope="session")
def fake_gcs_endpoint() -> Iterator[str]:
    """URL of a fake-gcs-server for the session, with ``STORAGE_EMULATOR_HOST`` pointing at it."""
    pytest.importorskip("gcsfs", reason="GCS tests need gcsfs (pip install gcsfs)")
    try:
        with FakeGCSServer() as server:
            yield server.url
    except ServerUnavailable as exc:
        pytest.skip(f"GCS tests need fake-gcs-server: {exc}")


@pytest.fixture(autouse=True)
def _restore_snapshotkit_logging() -> Iterator[None]:
    """Commands run in-process (click's runner, anywhere in the suite) add a handler to the
    ``snapshotkit`` logger, set its level and stop propagation: put it back after every test."""
    logger = logging.getLogger("snapshotkit")
    handlers, level, propagate = list(logger.handlers), logger.level, logger.propagate
    yield
    logger.handlers[:] = handlers
    logger.setLevel(level)
    logger.propagate = propagate


# Shared memory (the process executor's staging pool: multiprocessing.shared_memory, named psm_*)
# stays in /dev/shm until someone unlinks it, however many processes that used it have ended: a
# segment the run made that no live process maps any more once a test, or the run, is over, leaked.
_SHM_DIR = Path("/dev/shm")
_SHM_PREFIX = "psm_"
_SHM_AT_START = pytest.StashKey[set[str]]()
# Left alone (they may be another program's); each is reported by the first check that finds it.
_SHM_REPORTED: set[str] = set()


def _shm_segments() -> set[str]:
    try:
        return {name for name in os.listdir(_SHM_DIR) if name.startswith(_SHM_PREFIX)}
    except OSError:  # no /dev/shm (not Linux): nothing to check
        return set()


def _unmapped(names: set[str]) -> set[str]:
    """Those of ``names`` no live process maps (one that does is a pool in use, this run's or another program's)."""
    unmapped = set(names)
    for maps in Path("/proc").glob("[0-9]*/maps"):
        if not unmapped:
            break
        try:
            text = maps.read_text()
        except OSError:  # the process ended meanwhile
            continue
        unmapped = {name for name in unmapped if f"{_SHM_DIR}/{name}" not in text}
    return unmapped


def _leaked_shm_message(leaked: set[str], by: str) -> str:
    return (
        f"{by} left {len(leaked)} shared-memory segment(s) in {_SHM_DIR} that no process uses: "
        f"{', '.join(sorted(leaked))}; whatever made them must unlink them (a user's /dev/shm fills up)"
    )


@pytest.fixture(autouse=True)
def _no_leaked_shared_memory() -> Iterator[None]:
    """Fail a test after which a shared-memory segment it made is left that no process maps."""
    before = _shm_segments()
    yield
    new = _shm_segments() - before
    if new and (leaked := _unmapped(new)):
        _SHM_REPORTED.update(leaked)  # not again at the end of the run
        pytest.fail(_leaked_shm_message(leaked, "the test"), pytrace=False)


# The private temp directory, and what TMPDIR, TORCHINDUCTOR_CACHE_DIR and tempfile.tempdir were.
_SESSION_TMP = pytest.StashKey[tuple[Path, dict[str, str | None], str | None]]()
# The root pytest makes in the temp directory for every user's tmp_path trees; it stays even when
# it is empty (tmp_path_retention_policy = "none" removes what is inside it at the end).
_PYTEST_ROOT_PREFIX = "pytest-of-"
_LISTED_LEFTOVERS = 20


# torch's compiler cache, which any torch program makes in the temp directory the first time an
# optimizer steps (importing torch._dynamo); a cache meant to outlive the run, so not a leftover.
_TORCH_CACHE = "torchinductor_cache"


def pytest_configure(config: pytest.Config) -> None:
    """Point ``TMPDIR`` at a fresh private directory before any test or subprocess makes a temp file."""
    config.stash[_SHM_AT_START] = _shm_segments()
    private = Path(tempfile.mkdtemp(prefix="snapshotkit-tests-")).resolve()
    previous_env = {name: os.environ.get(name) for name in ("TMPDIR", "TORCHINDUCTOR_CACHE_DIR")}
    config.stash[_SESSION_TMP] = (private, previous_env, tempfile.tempdir)
    os.environ["TMPDIR"] = str(private)
    tempfile.tempdir = str(private)
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(private / _TORCH_CACHE))


def _own_multiprocessing_dir() -> Path | None:
    """This process's multiprocessing temp dir (the forkserver's socket is in it), if it made one.

    multiprocessing removes it when the interpreter exits, after pytest has returned: not a leftover.
    """
    tempdir = multiprocessing.process.current_process()._config.get("tempdir")
    return Path(tempdir).resolve() if tempdir else None


def _leftovers(private: Path, own: Path | None) -> list[str]:
    found: list[str] = []
    for path in sorted(private.rglob("*")):
        relative = path.relative_to(private)
        if relative.parts[0] == _TORCH_CACHE or (own is not None and path.is_relative_to(own)):
            continue
        if relative.parts[0].startswith(_PYTEST_ROOT_PREFIX) and path.is_dir() and not any(path.iterdir()):
            continue
        if path.is_dir() and any(path.iterdir()):
            continue  # its contents are listed instead
        found.append(str(relative) + ("/" if path.is_dir() else ""))
    return found


# The innermost wrapper: it resumes after the session's own clean-up (fixtures torn down, servers
# stopped, tmp_path trees removed) and before the terminal summary, which then shows its section.
@pytest.hookimpl(wrapper=True, trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> Generator[None]:
    """Fail the run if anything is left in the private temp directory; then remove the directory."""
    result = yield
    _check_shared_memory(session)
    private, previous_env, previous_tempdir = session.config.stash[_SESSION_TMP]
    own = _own_multiprocessing_dir()
    leftovers = _leftovers(private, own)
    if own is not None and own.is_relative_to(private):
        # After multiprocessing's own removal of that dir at exit (finalizers run by priority, high first).
        multiprocessing.util.Finalize(
            None, shutil.rmtree, args=(private,), kwargs={"ignore_errors": True}, exitpriority=-200
        )
    else:
        shutil.rmtree(private, ignore_errors=True)
    for name, value in previous_env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    tempfile.tempdir = previous_tempdir
    if leftovers:
        listed = "\n".join(f"  {name}" for name in leftovers[:_LISTED_LEFTOVERS])
        more = f"\n  ... and {len(leftovers) - _LISTED_LEFTOVERS} more" if len(leftovers) > _LISTED_LEFTOVERS else ""
        message = (
            f"the test run left {len(leftovers)} {'entry' if len(leftovers) == 1 else 'entries'} in its temp "
            f"directory {private} (removed now); whatever made them must clean up:\n{listed}{more}"
        )
        _fail_run(session, "leftovers in the temp directory", message)
    return result


def _fail_run(session: pytest.Session, title: str, message: str) -> None:
    """Report ``message`` under ``title`` at the end of the run, and make the run fail."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_sep("=", title, red=True, bold=True)
        reporter.write_line(message)
    else:
        sys.stderr.write(message + "\n")
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def _check_shared_memory(session: pytest.Session) -> None:
    """Fail the run if a shared-memory segment made during it is left that no process maps, once this
    process's checkpoint daemons stopped (as they do at exit, unlinking their pools)."""
    if "snapshotkit._take.executors" in sys.modules:
        sys.modules["snapshotkit._take.executors"].shutdown_writers()
    leaked = _unmapped(_shm_segments() - session.config.stash[_SHM_AT_START] - _SHM_REPORTED)
    if not leaked:
        return
    message = _leaked_shm_message(leaked, "the test run") + " (made by another program, if one ran meanwhile)"
    _fail_run(session, "leaked shared memory", message)
