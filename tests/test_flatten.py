from __future__ import annotations

from collections import OrderedDict

import pytest
import torch

from snapshotkit._plan.flatten import escape_key, flatten, inflate, unescape_key
from snapshotkit.manifest import DictEntry, ListEntry, TupleEntry


def test_escape_round_trip() -> None:
    for key in ["plain", "a/b", "50%", "%2F", "/", "%", "a%2Fb/c"]:
        assert unescape_key(escape_key(key)) == key
        assert "/" not in escape_key(key)


def test_flatten_nested_containers_and_inflate_restores_types_and_order() -> None:
    tensor = torch.arange(3)
    state = {
        "b": 1,
        "a": [1.5, (2, "x"), {"k": None}],
        "od": OrderedDict([("z", 1), ("y", 2)]),
        3: "int key",
        "sl/ash": tensor,
        "empty_list": [],
        "empty_dict": {},
    }
    containers, leaves = flatten(state, "root")
    assert containers["root"] == DictEntry(("b", "a", "od", 3, "sl/ash", "empty_list", "empty_dict"))
    assert containers["root/a"] == ListEntry(3)
    assert containers["root/a/1"] == TupleEntry(2)
    assert containers["root/od"] == DictEntry(("z", "y"), ordered=True)
    assert leaves["root/sl%2Fash"] is tensor
    assert leaves["root/3"] == "int key"
    rebuilt = inflate("root", containers, leaves)
    assert rebuilt == state
    assert list(rebuilt) == list(state)
    assert type(rebuilt["od"]) is OrderedDict
    assert type(rebuilt["a"][1]) is tuple
    assert 3 in rebuilt and "3" not in rebuilt


@pytest.mark.parametrize(
    "value",
    [
        {1: "a", "1": "b"},  # keys that print the same cannot both be paths
        {(1, 2): "tuple key"},
        {True: "bool key"},
        {1.5: "float key"},
    ],
)
def test_dicts_with_unrepresentable_keys_are_leaves(value: dict[object, str]) -> None:
    containers, leaves = flatten({"d": value}, "k")
    assert "k/d" not in containers
    assert leaves["k/d"] is value


def test_subclasses_of_containers_are_leaves() -> None:
    class MyDict(dict):  # type: ignore[type-arg]
        pass

    class MyList(list):  # type: ignore[type-arg]
        pass

    torch_size = torch.Size([2, 3])
    containers, leaves = flatten({"a": MyDict(x=1), "b": MyList([1]), "c": torch_size}, "k")
    assert set(leaves) == {"k/a", "k/b", "k/c"}
    assert set(containers) == {"k"}


def test_top_level_leaf() -> None:
    tensor = torch.ones(2)
    containers, leaves = flatten(tensor, "k")
    assert containers == {}
    assert inflate("k", containers, leaves) is tensor
