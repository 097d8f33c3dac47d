"""A library error's advice in the command line's words: its arguments and commands, not Python's.

The library words what to do for the Python API (``Choose another dst``, ``Snapshot(...)``); an
error whose advice names Python carries it as data (:class:`~snapshotkit.errors.Advice`), which
this module says again for the command that failed. The library knows nothing of click.
"""

from __future__ import annotations

import shlex

from snapshotkit.errors import SnapshotkitError

__all__ = ["reworded"]

#: The argument each command writes to, as its usage line names it.
_DESTINATION = {"export": "OUT", "import": "OUT", "consolidate": "DST"}
#: The commands whose one argument is a snapshot (an example command line can be given whole).
_ONE_SNAPSHOT = ("info", "verify")


def reworded(error: SnapshotkitError, command: str) -> str | None:
    """``error``'s message with its advice said for ``snapshotkit <command>``; None to keep the
    library's message (no advice as data, or none this command words differently)."""
    advice = error.advice
    if advice is None:
        return None
    if advice.action == "new_destination":
        argument = _DESTINATION.get(command)
        return None if argument is None else f"{advice.problem}. Give {argument} a new path (one that holds nothing)"
    if advice.action == "open_a_snapshot" and len(advice.paths) == 2:
        folder, latest = advice.paths
        example = f"`snapshotkit {command} {shlex.quote(latest)}`" if command in _ONE_SNAPSHOT else repr(latest)
        listing = f"; `snapshotkit ls {shlex.quote(folder)}` lists them" if advice.managed else ""
        return f"{advice.problem}. Name one of them, e.g. {example}{listing}"
    if advice.action == "remove_leftovers" and len(advice.paths) == 1:
        root = advice.paths[0].rstrip("/").rpartition("/")[0] or "."
        cleanup = f" (`snapshotkit cleanup {shlex.quote(root)}` removes them)" if advice.managed else ""
        return f"{advice.problem}. Restore from an earlier snapshot; these leftovers hold nothing restorable{cleanup}"
    if advice.action == "restore_another":
        return f"{advice.problem}; restore from another snapshot"
    if advice.action == "strip_the_name" and command == "export" and len(advice.paths) == 1:
        prefix = advice.paths[0]
        select = f"--select {shlex.quote(prefix + '**')}"
        return f"{advice.problem}; pass --strip-prefix {shlex.quote(prefix)} (and {select} for one model of several)"
    if advice.action == "name_the_format" and command == "import":
        return f"{advice.problem} (--from one of {', '.join(advice.paths)})"
    if advice.action == "format_given" and command == "import" and len(advice.paths) == 1:
        return f"--from {advice.paths[0]} was given, but {advice.problem}"
    return None
