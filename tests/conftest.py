"""Shared fixtures."""

from __future__ import annotations

import os

import pytest

# The helpers shared by test modules assert too: rewrite them like the tests, for readable failures.
pytest.register_assert_rewrite("_snapshots")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """Unset every ``SNAPSHOTKIT_*`` variable for the test, so the caller's environment cannot leak in.

    Returns the ``monkeypatch`` fixture, for ``clean_env.setenv(...)``.
    """
    for name in list(os.environ):
        if name.startswith("SNAPSHOTKIT_"):
            monkeypatch.delenv(name)
    return monkeypatch
