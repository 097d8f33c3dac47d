"""Fixtures shared by the take tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from snapshotkit._take import executors
from snapshotkit._take.process_writer import ProcessWriter


@pytest.fixture
def fresh_writers(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[tuple[str, int], Any]]:
    """No background writer yet (so the test sees every allocation, and whether a checkpoint
    daemon was started, one that knows the plugins registered now); its daemons are stopped after."""
    made: dict[tuple[str, int], Any] = {}
    monkeypatch.setattr(executors, "_writers", made)
    yield made
    for writer in made.values():
        if isinstance(writer, ProcessWriter):
            writer.shutdown()
