"""What every source reader returns, and the rules all of them share.

Naming: a checkpoint holding a dict with ``str`` keys (``{"model": sd, "optim": osd, "epoch": 3}``)
gives one app-state key per top-level key (``model``, ``optim``, ``epoch``), so its leaves get
the logical paths ``model/0.weight``, ``optim/state/0/exp_avg``. A checkpoint that is one state
dict of tensors (a bare ``model.state_dict()``, every safetensors file) or anything that is not
such a dict becomes the state of the one app-state key ``key`` (default ``"model"``), so
``Snapshot(out).restore({"model": module})`` loads it straight into a module.

Pickled objects load with ``torch.load(weights_only=True)`` unless the caller passed
``weights_only=False``: no code from a source runs unless the user opts in.
"""

from __future__ import annotations

import dataclasses
import io
import pickle
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from snapshotkit.errors import ImportSourceError, UnsafeObjectError


@dataclasses.dataclass(frozen=True)
class Loaded:
    """A source read into app-state form (its tensors mapped, not read).

    Attributes:
        states: app-state key -> that key's state (a dict, or any other value).
        skipped_paths: what the source holds that the snapshot will not (torchsnapshot's
            per-rank state of ranks other than 0: ``"<rank>/<logical path>"``).
        provenance: JSON members the snapshot's user metadata records about the source.
    """

    states: dict[str, Any]
    skipped_paths: tuple[str, ...] = ()
    provenance: Mapping[str, Any] = dataclasses.field(default_factory=dict)


def split_top_level(obj: Any, key: str) -> dict[str, Any]:
    """App-state key -> state for a checkpoint's top-level object (see the module docstring)."""
    if (
        type(obj) in (dict, OrderedDict)
        and obj
        and all(isinstance(name, str) and name for name in obj)
        and not all(isinstance(value, torch.Tensor) for value in obj.values())
    ):
        return dict(obj)
    return {key: obj}


def load_object(data: bytes | memoryview, *, weights_only: bool, what: str, src: Path) -> Any:
    """Unpickle ``torch.save`` bytes of the source: only tensors and plain values with ``weights_only``.

    Raises:
        UnsafeObjectError: ``weights_only`` refused the object.
        ImportSourceError: the bytes are not a ``torch.save`` payload.
    """
    try:
        return torch.load(io.BytesIO(data), map_location="cpu", weights_only=weights_only)
    except pickle.UnpicklingError as exc:
        if weights_only:
            raise refused(what, src, exc) from exc
        raise ImportSourceError(f"{src}: {what} could not be unpickled ({exc}); the checkpoint is corrupt") from exc
    except Exception as exc:
        raise ImportSourceError(f"{src}: {what} could not be loaded with torch.load ({exc}); it is corrupt") from exc


def refused(what: str, src: Path, exc: BaseException) -> UnsafeObjectError:
    """The error for an object that ``weights_only=True`` loading refused."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()] or [type(exc).__name__]
    # torch's message begins with generic advice; the line naming the refused global is the news.
    first_line = next((line for line in lines if "Unsupported global" in line), lines[0])
    return UnsafeObjectError(
        f"{src}: {what} cannot be loaded with weights_only=True ({first_line[:300]}). Import runs no code from "
        "a checkpoint unless told to: if you trust it, pass weights_only=False to import_snapshot (the snapshot "
        "then holds the object, and restoring it needs weights_only=False too), or allow the class with "
        "torch.serialization.add_safe_globals()"
    )
