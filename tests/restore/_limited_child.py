"""Child process for the bounded-allocation tests: cap the address space, run restores, report.

Usage: ``python _limited_child.py <snapshot> <call>...`` with calls ``restore:<key>`` or
``read_object:<logical path>``. Prints one JSON line: for each call the exception type name
(``"none"`` when it succeeded) and message.
"""

from __future__ import annotations

import json
import resource
import sys

from snapshotkit import Snapshot, StateDict

CAP_BYTES = 1 << 30


def _address_space_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[0]) * resource.getpagesize()


def main(snapshot: str, calls: list[str]) -> None:
    limit = _address_space_bytes() + CAP_BYTES
    resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
    results = []
    for call in calls:
        kind, _, argument = call.partition(":")
        try:
            if kind == "restore":
                Snapshot(snapshot).restore({argument: StateDict()})
            else:
                Snapshot(snapshot).read_object(argument)
        except Exception as exc:  # reported to the parent, which asserts on the type
            results.append({"error": type(exc).__name__, "message": str(exc)})
        else:
            results.append({"error": "none", "message": ""})
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
