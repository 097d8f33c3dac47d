"""Staging (``_take.stage``): the views of :class:`ViewStager` and the copy of :func:`stage_into`
give one layout, byte for byte: pieces at their offsets, zero padding between."""

from __future__ import annotations

import torch

from snapshotkit._plan.layout import DataObjectPlan, PieceSlot
from snapshotkit._plan.leaves import Payload
from snapshotkit._take.stage import ViewStager, stage_into, staging_cost_bytes


def test_views_and_copies_stage_the_same_bytes() -> None:
    whole = torch.arange(16, dtype=torch.float32)  # contiguous: written from its own memory
    transposed = torch.arange(12, dtype=torch.int16).view(3, 4).t()  # copied, in row-major order
    negative = torch.arange(4.0)._neg_view()  # a lazy neg bit: copied, resolved
    payloads = [
        Payload.of_tensor(whole),
        Payload.of_tensor(transposed),
        Payload.of_bytes(b"object"),
        Payload.of_tensor(negative),
    ]
    slots = (
        PieceSlot(0, 0, 64, 0, 0),  # all of it
        PieceSlot(0, 16, 40, 0, 64),  # a range of it
        PieceSlot(1, 4, 20, 0, 128),  # a range of a copy, after padding
        PieceSlot(2, 0, 6, 0, 150),
        PieceSlot(3, 0, 16, 0, 160),
    )
    plan = DataObjectPlan("data/x", slots, 176)
    viewed = ViewStager(payloads).stage(plan)
    copied = stage_into(plan, payloads, memoryview(bytearray(plan.nbytes)), None)
    assert b"".join(viewed.buffers) == b"".join(copied.buffers) and len(b"".join(viewed.buffers)) == 176
    assert [bytes(p) for p in viewed.pieces] == [bytes(p) for p in copied.pieces]
    expected = transposed.contiguous().reshape(-1)[2:10].numpy().tobytes()
    assert bytes(viewed.pieces[2]) == expected and bytes(viewed.pieces[1]) == whole[4:10].numpy().tobytes()
    assert bytes(viewed.pieces[4]) == (-torch.arange(4.0)).numpy().tobytes()
    assert staging_cost_bytes(plan, payloads) == 16 + 16  # the copies: of the transposed and the negative views
    assert len(viewed.keepalive) == 2  # the two copies live as long as the staged object
