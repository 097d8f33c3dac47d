"""A Lightning checkpoint dict as a snapshot's app state, and the dict rebuilt from a snapshot.

Each top-level key of the checkpoint (``state_dict``, ``optimizer_states``, ``loops``, ``epoch``,
...) is one app-state key, so logical paths read as the dict does: ``state_dict/layer.weight``,
``optimizer_states/0/state/0/exp_avg``, ``epoch``. Containers come back with their types
(``OrderedDict``, ``dict`` with ``int`` keys, ``list``, ``tuple``), primitives exactly.

Two things a snapshot does not say by itself go into the user metadata under
:data:`METADATA_KEY`: the order of the top-level keys, and the device every tensor not on the
CPU was saved from (the *location* ``map_location`` maps, as ``torch.load`` names it).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import torch

from snapshotkit._app_state import Held
from snapshotkit._format.entries import escape_key, join_path, unescape_key
from snapshotkit._plan.flatten import flatten
from snapshotkit.errors import InvalidArgumentError
from snapshotkit.snapshot import Snapshot
from snapshotkit.stateful import AppState

__all__ = ["METADATA_KEY", "check_map_location", "checkpoint_app_state", "load_checkpoint_dict"]

#: The user-metadata key of what :func:`load_checkpoint_dict` needs besides the entries.
METADATA_KEY = "snapshotkit.lightning"

MapLocation = Callable[..., Any] | torch.device | str | Mapping[str, Any] | None


def checkpoint_app_state(checkpoint: object) -> tuple[AppState, dict[str, Any]]:
    """The app state that stores ``checkpoint`` (one key per top-level key), and the user
    metadata that goes with it.

    Raises:
        InvalidArgumentError: ``checkpoint`` is not a dict with ``str`` keys.
    """
    if not isinstance(checkpoint, Mapping):
        raise InvalidArgumentError(
            f"save_checkpoint takes the checkpoint as a dict (what Lightning's Trainer builds), got "
            f"{type(checkpoint).__name__}"
        )
    bad = [key for key in checkpoint if not isinstance(key, str)]
    if bad:
        raise InvalidArgumentError(
            f"the checkpoint's top-level keys must be str (each becomes an app-state key), got {bad[0]!r} "
            f"({type(bad[0]).__name__}); nest such entries in a dict under a str key"
        )
    devices: dict[str, str] = {}
    for key, value in checkpoint.items():
        for path, leaf in flatten(value, escape_key(key)).leaves.items():
            if isinstance(leaf, torch.Tensor) and leaf.device.type != "cpu":
                devices[path] = str(leaf.device)
    metadata = {METADATA_KEY: {"keys": list(checkpoint), "devices": devices}}
    app_state: AppState = {key: Held(value) for key, value in checkpoint.items()}
    return app_state, metadata


def check_map_location(map_location: object) -> None:
    """Refuse a ``map_location`` that ``torch.load`` would not take, before anything is read.

    Raises:
        InvalidArgumentError: not None, a ``str``, a ``torch.device``, a dict or a callable.
    """
    if map_location is None or isinstance(map_location, (str, torch.device, Mapping)) or callable(map_location):
        return
    raise InvalidArgumentError(
        f"map_location takes what torch.load takes (None, a device or its name, a dict of locations, or a "
        f"function of (storage, location)), got {type(map_location).__name__} {map_location!r}"
    )


def load_checkpoint_dict(
    snapshot: Snapshot, *, map_location: MapLocation, weights_only: bool, memory_budget_bytes: int | None
) -> dict[str, Any]:
    """The checkpoint dict ``snapshot`` holds, tensors placed by ``map_location``.

    A snapshot that :mod:`snapshotkit.lightning` did not write loads too: every app-state key
    becomes a key of the dict, in the manifest's order, and every tensor was saved on the CPU.

    Raises:
        whatever :meth:`Snapshot.get_state_dict_for_key` raises (``IntegrityError`` for damaged
        bytes, ``StorageError``, ``UnsafeObjectError``...).
    """
    check_map_location(map_location)
    recorded = snapshot.metadata.user_metadata.get(METADATA_KEY)
    keys: list[str]
    devices: Mapping[str, str]
    if isinstance(recorded, Mapping) and isinstance(recorded.get("keys"), list):
        keys, devices = recorded["keys"], recorded.get("devices") or {}
    else:
        keys, devices = _app_state_keys(snapshot), {}
    place = _placer(map_location, devices)
    checkpoint: dict[str, Any] = {}
    for key in keys:
        value = snapshot.get_state_dict_for_key(key, weights_only=weights_only, memory_budget_bytes=memory_budget_bytes)
        checkpoint[key] = _placed(value, escape_key(key), place)
    return checkpoint


def _app_state_keys(snapshot: Snapshot) -> list[str]:
    keys: dict[str, None] = {}
    for name in snapshot.metadata.manifest:
        rank, _, logical_path = name.partition("/")
        if rank == "0":
            keys.setdefault(unescape_key(logical_path.split("/", 1)[0]), None)
    return list(keys)


def _placer(
    map_location: MapLocation, devices: Mapping[str, str]
) -> Callable[[str | None, torch.Tensor], torch.Tensor]:
    """How a tensor read onto the CPU gets to where ``map_location`` sends it (``torch.load``'s
    rules, with the location each tensor was saved from)."""

    def place(path: str | None, tensor: torch.Tensor) -> torch.Tensor:
        location = devices.get(path, "cpu") if path is not None else "cpu"
        if map_location is None:
            return tensor  # on the CPU, as Lightning's TorchCheckpointIO loads by default
        if isinstance(map_location, (str, torch.device)):
            target: Any = map_location
        elif isinstance(map_location, Mapping):
            target = map_location.get(location, location)
        else:
            result = map_location(tensor.untyped_storage(), location)
            target = location if result is None else result.device
        device = torch.device(target)
        return tensor if device == tensor.device else tensor.to(device)

    return place


def _placed(value: Any, path: str | None, place: Callable[[str | None, torch.Tensor], torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        return place(path, value)
    kind = type(value)
    if kind is dict or kind is OrderedDict:
        return kind((key, _placed(item, _child(path, key), place)) for key, item in value.items())
    if kind is list or kind is tuple:
        return kind(_placed(item, _child(path, index), place) for index, item in enumerate(value))
    return value


def _child(path: str | None, key: object) -> str | None:
    return join_path(path, key) if path is not None and isinstance(key, (str, int)) else None
