"""A ``torch.save`` file as app state.

Loaded with ``torch.load(weights_only=..., mmap=True)``: tensors view the mapped file, so memory
stays bounded whatever the file's size. A file in torch's legacy (pre-1.6, non-zip) format
cannot be mapped and is read whole.
"""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path

import torch

from snapshotkit._format.foreign import HEAD_BYTES, classify_head
from snapshotkit.convert._source import Loaded, refused, split_top_level
from snapshotkit.errors import ImportSourceError


def read_torch(src: Path, *, key: str, weights_only: bool) -> Loaded:
    """The state of the ``torch.save`` file ``src`` (naming as :func:`split_top_level` says).

    Raises:
        UnsafeObjectError: ``weights_only`` refused something in the file.
        ImportSourceError: the file is not a ``torch.save`` file, or torch cannot load it.
    """
    with open(src, "rb") as f:
        head = f.read(HEAD_BYTES)
    found = classify_head(head)
    zipped = found is not None and found.source_format == "torch" and head.startswith(b"PK")
    try:
        with warnings.catch_warnings():
            # A TorchScript archive makes torch.load warn before it refuses it (weights_only) or
            # hands it to torch.jit.load; the error or the result says enough.
            warnings.filterwarnings("ignore", message=".*TorchScript archive.*", category=UserWarning)
            obj = torch.load(src, map_location="cpu", weights_only=weights_only, mmap=zipped)
    except pickle.UnpicklingError as exc:
        if weights_only:
            raise refused("an object in the file", src, exc) from exc
        raise ImportSourceError(f"{src} is not a torch.save file torch can unpickle ({exc})") from exc
    except Exception as exc:
        what = "a torch.save file" if found is not None else "not a torch.save file"
        raise ImportSourceError(f"{src} ({what}) could not be loaded with torch.load: {exc}") from exc
    return Loaded(split_top_level(obj, key))
