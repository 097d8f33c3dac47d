"""User metadata: a small JSON object a take stores in the manifest header, as ``user_metadata``.

``docs/format.md`` section 2.2 specifies the member. snapshotkit never interprets it; a
snapshot manager reads it back with ``Snapshot(path).metadata.user_metadata``. A take checks
the argument (:func:`check_user_metadata`) before anything is written and stores exactly what a
JSON round trip of it gives, so what is read back equals what was stored, value for value.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, cast

from snapshotkit.errors import ConfigError, InvalidArgumentError

#: The largest ``user_metadata`` a take stores: its compact UTF-8 JSON encoding, in bytes. The
#: manifest is read whole on every open; larger values belong in the state (a ``StateDict``).
MAX_USER_METADATA_BYTES = 1024 * 1024
#: Objects and arrays nest at most this deep (JSON parsers recurse, and so does the manifest reader).
MAX_USER_METADATA_DEPTH = 100
#: The largest int, in bits; the limit of int leaves (``_plan.flatten.MAX_INT_BITS``), below every
#: Python's int<->str conversion limit, so every reader can parse it.
_MAX_INT_BITS = 2000


def check_user_metadata(metadata: object) -> dict[str, Any]:
    """The ``user_metadata`` a take stores for the ``metadata=`` argument (``{}`` for None).

    Accepts a ``Mapping`` with ``str`` keys whose values are mappings (with ``str`` keys),
    lists, ``str``, ``int``, finite ``float``, ``bool`` or ``None``, nested at most
    :data:`MAX_USER_METADATA_DEPTH` deep and at most :data:`MAX_USER_METADATA_BYTES` encoded.
    Returns a new ``dict``: the JSON round trip of ``metadata`` (mappings become ``dict``).

    Raises:
        InvalidArgumentError: ``metadata`` is not a ``Mapping`` (or None).
        ConfigError: a key is not a ``str``, a value is not JSON (a tuple, a set, a tensor,
            NaN or infinity, a string with a lone surrogate, an int past 2000 bits), it nests
            too deep, or it is too large; the message names the key path (``metadata['a'][0]``).
    """
    if metadata is None:
        return {}
    if not isinstance(metadata, Mapping):
        raise InvalidArgumentError(
            f"metadata must be a dict of str -> JSON value (e.g. metadata={{'step': 100}}), got "
            f"{type(metadata).__name__} {_short(metadata)}"
        )
    plain = _plain_copy(metadata)
    text = json.dumps(plain, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    size_bytes = len(text.encode("utf-8"))
    if size_bytes > MAX_USER_METADATA_BYTES:
        sizes = {key: len(json.dumps(value, ensure_ascii=False, separators=(",", ":"))) for key, value in plain.items()}
        largest = max(sizes, key=lambda key: sizes[key])
        raise ConfigError(
            f"metadata is {size_bytes} bytes as JSON, more than the {MAX_USER_METADATA_BYTES} a snapshot stores "
            f"in its manifest (the largest member is metadata[{largest!r}], about {sizes[largest]} bytes). "
            "Keep metadata small (steps, metrics, tags) and put large values in app_state, e.g. a StateDict"
        )
    result: dict[str, Any] = json.loads(text)
    return result


def _plain_copy(metadata: Mapping[Any, Any]) -> dict[str, Any]:
    """``metadata`` as plain dicts and lists (iteratively: any depth is reported, not a RecursionError)."""
    root: dict[str, Any] = {}
    stack: list[tuple[Mapping[Any, Any] | list[Any], dict[str, Any] | list[Any], str, int]] = [
        (metadata, root, "metadata", 1)
    ]
    while stack:
        source, target, where, depth = stack.pop()
        if depth > MAX_USER_METADATA_DEPTH:
            raise ConfigError(
                f"{where} nests objects and lists more than {MAX_USER_METADATA_DEPTH} levels deep; "
                "flatten the metadata (e.g. join nested keys with '.')"
            )
        items = source.items() if isinstance(source, Mapping) else enumerate(source)
        for key, value in items:
            if isinstance(source, Mapping):
                if not isinstance(key, str):
                    raise ConfigError(
                        f"{where} has the key {key!r} of type {type(key).__name__}; JSON object keys are strings: "
                        f"use str keys (e.g. {str(key)!r})"
                    )
                _check_text(key, f"the key {key!r} of {where}")
            here = f"{where}[{key!r}]"
            child: Any
            if isinstance(value, Mapping):
                child = {}
                stack.append((value, child, here, depth + 1))
            elif isinstance(value, list):
                child = []
                stack.append((value, child, here, depth + 1))
            else:
                child = _check_scalar(value, here)
            if isinstance(target, dict):
                target[cast(str, key)] = child  # checked above
            else:
                target.append(child)
    return root


def _check_scalar(value: object, where: str) -> object:
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ConfigError(
                f"{where} is {value!r}; JSON has no NaN or infinity: store a finite float, None, or a string "
                f"such as {str(value)!r}"
            )
        return value
    if isinstance(value, int):
        if value.bit_length() > _MAX_INT_BITS:
            raise ConfigError(
                f"{where} is an int of {value.bit_length()} bits; metadata holds ints of at most {_MAX_INT_BITS} "
                "bits: store it as a string"
            )
        return value
    if isinstance(value, str):
        _check_text(value, where)
        return value
    hint = "a list" if isinstance(value, tuple) else "one of those (e.g. float(x), x.tolist(), str(x))"
    raise ConfigError(
        f"{where} is a {type(value).__module__}.{type(value).__qualname__} {_short(value)}, which is not a JSON "
        f"value; metadata holds dicts, lists, str, int, float, bool and None: convert it to {hint}, or keep "
        "tensors and other objects in app_state instead"
    )


def _check_text(text: str, where: str) -> None:
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise ConfigError(
                f"{where} holds a lone surrogate, which has no UTF-8 form; remove it or encode the text first"
            ) from None


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
