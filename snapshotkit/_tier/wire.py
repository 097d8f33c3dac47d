"""What a transfer of a copy is, how it ends, and the JSON messages its two ranks exchange.

Shared by the sending side (:mod:`.transfer`) and the receiving side (:mod:`.receive`). A JSON
message is an int64 length, then that many uint8 bytes, sent point to point.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

from snapshotkit._dist import Group

__all__ = [
    "INCOMING_INFIX",
    "Transfer",
    "TransferOutcome",
    "describe",
    "is_incoming",
    "ok_reason",
    "receive_json",
    "send_json",
]

#: What separates the target's name from the random part in the name of an incoming copy.
INCOMING_INFIX = ".incoming-"
_INCOMING = re.compile(r".+" + re.escape(INCOMING_INFIX) + r"[0-9a-f]{16}")


@dataclasses.dataclass(frozen=True)
class Transfer:
    """One copy to make: ``owner``'s snapshot of ``step``, from the sender's local root into the receiver's.

    Attributes:
        step: the training step of the snapshot.
        owner: the rank whose state the snapshot holds.
        sender: the rank that reads the copy from its node's local root and sends it.
        receiver: the rank that receives it and writes it into its node's local root.

    Every rank is a rank of the process group passed to
    :func:`~snapshotkit._tier.transfer.send_and_receive`.
    """

    step: int
    owner: int
    sender: int
    receiver: int


@dataclasses.dataclass(frozen=True)
class TransferOutcome:
    """How one transfer ended (on its sender and its receiver alike).

    Attributes:
        transfer: the transfer.
        ok: whether the receiver now holds a committed, verified copy at its target (a copy it
            already held counts).
        reason: why not, when not ``ok`` (the source is not a committed snapshot, the copy failed
            verification, the receiver could not write); empty when ``ok``.
    """

    transfer: Transfer
    ok: bool
    reason: str = ""


def is_incoming(name: str) -> bool:
    """Whether ``name`` (a file name, no directory) is that of a copy still being received:
    ``<target name>.incoming-<16 hex digits>``. One whose receiver died stays behind; nothing
    else reads it, and the local root's clean-up removes it."""
    return _INCOMING.fullmatch(name) is not None


def describe(transfer: Transfer) -> str:
    """What a transfer does, for error messages."""
    return (
        f"copying rank {transfer.owner}'s snapshot of step {transfer.step} "
        f"from rank {transfer.sender} to rank {transfer.receiver}"
    )


def send_json(group: Group, peer: int, message: dict[str, Any], what: str) -> None:
    import torch

    data = json.dumps(message).encode()
    group.send_to(torch.tensor([len(data)], dtype=torch.int64), peer, what)
    group.send_to(torch.frombuffer(bytearray(data), dtype=torch.uint8), peer, what)


def receive_json(group: Group, peer: int, what: str) -> dict[str, Any]:
    import torch

    length = torch.zeros(1, dtype=torch.int64)
    group.receive_from(length, peer, what)
    data = torch.empty(int(length.item()), dtype=torch.uint8)
    group.receive_from(data, peer, what)
    message = json.loads(data.numpy().tobytes())
    return message if isinstance(message, dict) else {}


def ok_reason(message: dict[str, Any]) -> tuple[bool, str]:
    """A message's ``ok`` and, when not, its ``reason``."""
    ok = message.get("ok") is True
    return ok, "" if ok else str(message.get("reason") or "the peer gave no reason")
