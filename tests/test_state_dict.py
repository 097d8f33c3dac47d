"""``StateDict``'s constructor: a plain dict is copied at once, anything else goes through ``UserDict``."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from snapshotkit import StateDict


def test_a_state_dict_holds_what_userdict_would_in_the_same_order() -> None:
    items = {"b": 1, "a": [2], "c": None}
    for args, kwargs in [((items,), {}), ((items,), {"d": 4, "a": 5}), ((), {"x": 1}), ((None,), {}), ((), {})]:
        state = StateDict(*args, **kwargs)
        expected = {**(args[0] or {} if args else {}), **kwargs}
        assert list(state.data.items()) == list(expected.items())
    state = StateDict(items)
    assert state.data is not items and state.data["a"] is items["a"]  # a copy of the dict, not of its values
    assert list(StateDict(OrderedDict(items)).items()) == list(items.items())
    assert list(StateDict(list(items.items())).items()) == list(items.items())


def test_a_subclass_that_overrides_setitem_sees_every_item() -> None:
    class Recording(StateDict):
        seen: list[str]

        def __setitem__(self, key: str, value: Any) -> None:
            self.__dict__.setdefault("seen", []).append(key)
            super().__setitem__(key, value)

    state = Recording({"a": 1, "b": 2}, c=3)
    assert state.seen == ["a", "b", "c"] and dict(state) == {"a": 1, "b": 2, "c": 3}
