"""The ``app_state`` argument of take and restore: checked before anything is read or written."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from snapshotkit.errors import InvalidAppStateError
from snapshotkit.stateful import RNGState, Stateful


def validate_app_state(app_state: object) -> dict[str, Stateful]:
    """Check that ``app_state`` maps string keys to :class:`Stateful` values."""
    if not isinstance(app_state, Mapping):
        raise InvalidAppStateError(
            f"app_state must be a dict of name -> Stateful object, got {type(app_state).__name__}; "
            "wrap loose values in snapshotkit.StateDict"
        )
    for key, value in app_state.items():
        if not isinstance(key, str) or not key:
            raise InvalidAppStateError(f"app_state keys must be non-empty strings, got {key!r}")
        if not key.isascii() and not _utf8_encodable(key):
            raise InvalidAppStateError(
                f"app_state key {key!r} is not valid Unicode (it holds a lone surrogate) and cannot name "
                "logical paths in the UTF-8 manifest; use a key without surrogates"
            )
        if not isinstance(value, Stateful):
            raise InvalidAppStateError(
                f"app_state[{key!r}] is a {type(value).__name__}, which has no state_dict()/load_state_dict(); "
                f"wrap plain values as snapshotkit.StateDict({key}=...) or give the object those two methods"
            )
    rng_keys = [key for key, value in app_state.items() if isinstance(value, RNGState)]
    if len(rng_keys) > 1:
        raise InvalidAppStateError(f"app_state holds {len(rng_keys)} RNGState objects ({rng_keys}); use one")
    return dict(app_state)


def _utf8_encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class Held:
    """One value as an ``app_state`` entry: ``state_dict()`` returns it as is, ``load_state_dict``
    replaces it (a checkpoint dict's value for Lightning, a DCP plan's item, an imported value, a
    local copy's state being promoted)."""

    def __init__(self, value: Any = None) -> None:
        self.value = value

    def state_dict(self) -> Any:
        return self.value

    def load_state_dict(self, state_dict: Any) -> None:
        self.value = state_dict
