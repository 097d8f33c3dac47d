"""``python -m snapshotkit``: the command line (see :mod:`snapshotkit.cli`)."""

from __future__ import annotations

from snapshotkit.cli import main

if __name__ == "__main__":
    main(prog_name="snapshotkit")
