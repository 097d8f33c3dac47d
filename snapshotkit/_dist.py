"""The process-group facade: rank and world size, world size 1 without torch.distributed."""

from __future__ import annotations

import dataclasses
from typing import Any

from .errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Group:
    """This process's place in the group a snapshot is taken or restored by."""

    rank: int
    world_size: int


def resolve_group(pg: Any | None) -> Group:
    """The rank and world size of ``pg`` (the default group when ``None``).

    Without an initialized ``torch.distributed`` everything is world size 1. This release
    writes and reads snapshots from one process; a group of several ranks is refused clearly
    rather than producing a snapshot that only holds rank 0's state.
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        if pg is not None:
            raise ConfigError("pg was given but torch.distributed is not initialized; call init_process_group() first")
        return Group(0, 1)
    world_size = dist.get_world_size(pg)
    rank = dist.get_rank(pg)
    if world_size > 1:
        raise ConfigError(
            f"the process group has {world_size} ranks; this snapshotkit release takes and restores snapshots "
            "from a single process. Take from one rank with a single-rank group (dist.new_group([rank])) "
            "until multi-rank support lands"
        )
    return Group(rank, world_size)
