"""The ``snapshotkit`` command line: look into, check, compare and tidy snapshots from a shell.

    snapshotkit ls s3://bucket/run7                      # the step_<n> snapshots under a root
    snapshotkit info ckpt/step_1000 --depth 2            # what a snapshot holds
    snapshotkit show ckpt/step_1000 model/layer1.weight  # one value, with statistics
    snapshotkit verify ckpt/step_1000                    # every byte read, every checksum checked
    snapshotkit diff ckpt/step_1000 ckpt/step_2000       # what changed
    snapshotkit prune ckpt --keep-last 3 --dry-run       # retention, as SnapshotManager applies it
    snapshotkit cleanup ckpt                             # remove takes that never committed
    snapshotkit export ckpt/step_1000 model.safetensors --to safetensors --select 'model/**' --strip-prefix model/
    snapshotkit import model.safetensors ckpt/imported   # torch.save, safetensors, DCP, torchsnapshot in
    snapshotkit consolidate ckpt/step_1200 ckpt/full_1200  # an incremental snapshot, self-contained

Every command takes ``--json`` (one JSON document on stdout, schemas in docs/cli.md),
``--storage-option KEY=VALUE`` and ``--debug``. Exit status: 0 success, 1 a difference or
damage found, 2 a usage or access error. Installed as the ``snapshotkit`` console script;
``python -m snapshotkit`` runs it too.
"""

from __future__ import annotations

import click

from snapshotkit._version import __version__
from snapshotkit.cli._consolidate import consolidate
from snapshotkit.cli._convert import export, import_
from snapshotkit.cli._diff import diff
from snapshotkit.cli._info import info
from snapshotkit.cli._ls import ls
from snapshotkit.cli._retention import cleanup, prune
from snapshotkit.cli._show import show
from snapshotkit.cli._verify import verify

__all__ = ["main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="snapshotkit")
def main() -> None:
    """Look into, check, compare and tidy snapshotkit snapshots (local paths, file://, s3://, gs://, ...).

    Exit status: 0 success, 1 a check found a difference or damage, 2 a usage or access error.
    Every command takes --json, --storage-option KEY=VALUE and --debug.
    """


for _command in (ls, info, show, verify, diff, prune, cleanup, export, import_, consolidate):
    main.add_command(_command)
