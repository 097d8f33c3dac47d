from __future__ import annotations

import enum
from collections import OrderedDict
from pathlib import Path

import pytest
import torch
from _snapshots import depth_of, nested
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from snapshotkit import Snapshot, StateDict
from snapshotkit._format.entries import child_paths
from snapshotkit._plan.flatten import (
    MAX_INT_BITS,
    MAX_NESTING_DEPTH,
    escape_key,
    fits_inline,
    flatten,
    inflate,
    is_flattenable_dict,
    join_path,
    unescape_key,
)
from snapshotkit.errors import UnsupportedValueError
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
    flat = flatten(state, "root")
    containers, leaves = flat.containers, flat.leaves
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
    flat = flatten({"d": value}, "k")
    containers, leaves = flat.containers, flat.leaves
    assert "k/d" not in containers
    assert leaves["k/d"] is value


class _Color(str, enum.Enum):
    RED = "red"


class _Printed(str):
    def __str__(self) -> str:
        return "other"


class _PlainSubclass(str):
    pass


@pytest.mark.parametrize("key", [_Color.RED, _Printed("k")], ids=["str-enum", "str-subclass-printing-other"])
def test_a_dict_keyed_by_a_str_that_prints_as_other_text_is_a_leaf(key: str, tmp_path: Path) -> None:
    # found by a review: the path was built from str(key) ("_Color.RED") and the manifest held the
    # key's text ("red"): the take committed a snapshot whose restore raised "the manifest is corrupt"
    value = {key: torch.ones(2)}
    flat = flatten({"d": value, "n": 1}, "k")
    assert "k/d" not in flat.containers and flat.leaves["k/d"] is value
    Snapshot.take(str(tmp_path / "snap"), {"s": StateDict(d=value, n=1)})
    restored = StateDict()
    Snapshot(str(tmp_path / "snap")).restore({"s": restored}, weights_only=False)
    assert list(restored["d"]) == [key] and torch.equal(restored["d"][key], torch.ones(2)) and restored["n"] == 1


def test_a_str_subclass_that_prints_as_itself_is_a_key_like_str() -> None:
    flat = flatten({"d": {_PlainSubclass("k"): 1}}, "p")
    assert "p/d" in flat.containers and flat.leaves == {"p/d/k": 1}


def test_subclasses_of_containers_are_leaves() -> None:
    class MyDict(dict):  # type: ignore[type-arg]
        pass

    class MyList(list):  # type: ignore[type-arg]
        pass

    torch_size = torch.Size([2, 3])
    flat = flatten({"a": MyDict(x=1), "b": MyList([1]), "c": torch_size}, "k")
    containers, leaves = flat.containers, flat.leaves
    assert set(leaves) == {"k/a", "k/b", "k/c"}
    assert set(containers) == {"k"}


def test_top_level_leaf() -> None:
    tensor = torch.ones(2)
    flat = flatten(tensor, "k")
    containers, leaves = flat.containers, flat.leaves
    assert containers == {}
    assert inflate("k", containers, leaves) is tensor


def test_empty_containers_at_the_top() -> None:
    for value, entry in [({}, DictEntry(())), ([], ListEntry(0)), ((), TupleEntry(0))]:
        flat = flatten(value, "k")
        assert flat.containers == {"k": entry}
        assert flat.leaves == {}
        assert inflate("k", flat.containers, flat.leaves) == value


FAST = settings(max_examples=100, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

keys = st.one_of(st.text(max_size=5), st.integers(-3, 3))
primitives = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=5), st.binary(max_size=4))
states = st.recursive(
    primitives,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=4).map(tuple),
        st.dictionaries(keys, children, max_size=4),
        st.dictionaries(keys, children, max_size=4).map(lambda d: OrderedDict(reversed(d.items()))),
    ),
    max_leaves=20,
)


def same(a: object, b: object) -> bool:
    """Equal, with the same container types and key order all the way down."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        assert isinstance(b, dict)
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple))
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b


@FAST
@given(state=states, prefix=st.sampled_from(["k", "a%2Fb", "x/y"]))
def test_inflate_rebuilds_what_flatten_split(state: object, prefix: str) -> None:
    flat = flatten(state, prefix)
    assert same(inflate(prefix, flat.containers, flat.leaves), state)
    assert flat.containers.keys().isdisjoint(flat.leaves.keys())  # a path is a container or a leaf
    assert all(path == prefix or path.startswith(prefix + "/") for path in [*flat.containers, *flat.leaves])
    assert flatten(state, prefix) == flat


@FAST
@given(key=st.text(max_size=12))
def test_any_key_escapes_to_one_path_component(key: str) -> None:
    escaped = escape_key(key)
    assert "/" not in escaped
    assert unescape_key(escaped) == key


def test_inflate_rebuilds_the_deepest_nesting_flatten_accepts_without_recursion() -> None:
    # Before: inflate recursed once per level, so state nested 500 deep was taken but its
    # restore raised RecursionError.
    flat = flatten(nested(MAX_NESTING_DEPTH), "root")
    assert len(flat.containers) == MAX_NESTING_DEPTH
    assert depth_of(inflate("root", flat.containers, flat.leaves)) == MAX_NESTING_DEPTH


def test_flatten_refuses_nesting_deeper_than_the_limit_naming_the_path() -> None:
    with pytest.raises(UnsupportedValueError, match=f"more than {MAX_NESTING_DEPTH} levels.*'root/d/d/d"):
        flatten(nested(MAX_NESTING_DEPTH + 1), "root")


def test_a_dict_with_a_key_the_manifest_cannot_hold_is_a_leaf() -> None:
    # Before: a dict key with a lone surrogate reached the UTF-8 manifest: a raw UnicodeEncodeError
    # at commit, after every data object was written.
    odd = {"bad \udcff key": 1}
    flat = flatten({"ok": odd}, "root")
    assert flat.leaves["root/ok"] is odd
    assert "root/ok" not in flat.containers
    assert not fits_inline("\ud800") and fits_inline("ünï") and fits_inline(b"\xff") and fits_inline(10**700)


def test_int_keys_beyond_the_limit_are_refused_naming_the_path() -> None:
    # Before: str() of a 5,000-digit key raised a raw ValueError inside take.
    flatten({"ok": {2**MAX_INT_BITS - 1: 1, -(2**MAX_INT_BITS - 1): 2}}, "root")
    with pytest.raises(UnsupportedValueError, match=f"'root/ok' has {MAX_INT_BITS + 1} bits"):
        flatten({"ok": {2**MAX_INT_BITS: 1}}, "root")


def _reference_flatten(obj: object, prefix: str) -> tuple[dict[str, object], dict[str, object]]:
    """flatten as it was before the batched child paths: one join_path and one stack entry per child."""
    containers: dict[str, object] = {}
    leaves: dict[str, object] = {}
    stack: list[tuple[str, object]] = [(prefix, obj)]
    while stack:
        path, value = stack.pop()
        kind = type(value)
        if (kind is dict or kind is OrderedDict) and is_flattenable_dict(value, path):  # type: ignore[arg-type]
            containers[path] = DictEntry(tuple(value), ordered=kind is OrderedDict)  # type: ignore[call-overload]
            children = [(join_path(path, k), v) for k, v in value.items()]  # type: ignore[attr-defined]
        elif kind is list or kind is tuple:
            containers[path] = ListEntry(len(value)) if kind is list else TupleEntry(len(value))  # type: ignore[arg-type]
            children = [(join_path(path, i), v) for i, v in enumerate(value)]  # type: ignore[arg-type]
        else:
            leaves[path] = value
            continue
        stack.extend(reversed(children))
    return containers, leaves


# keys that need escaping, int keys, and keys that print alike, beside plain ones
odd_keys = st.one_of(st.sampled_from(["a", "b/c", "50%", "%2F", "", "1"]), st.integers(-2, 2), st.text(max_size=3))
wide_states = st.recursive(
    primitives,
    lambda children: st.one_of(
        st.lists(children, max_size=6),
        st.lists(children, max_size=6).map(tuple),
        st.dictionaries(odd_keys, children, max_size=6),
        st.dictionaries(odd_keys, children, max_size=6).map(lambda d: OrderedDict(reversed(d.items()))),
    ),
    max_leaves=40,
)


@FAST
@given(state=wide_states, prefix=st.sampled_from(["k", "a%2Fb", "x/y", ""]))
def test_flatten_and_inflate_give_the_paths_and_order_of_one_join_path_per_child(state: object, prefix: str) -> None:
    # flatten names a container's children at once (child_paths) and adds them straight to the
    # leaves when none is a container: the same paths, in the same depth-first order, as before.
    containers, leaves = _reference_flatten(state, prefix)
    flat = flatten(state, prefix)
    assert list(flat.containers.items()) == list(containers.items())
    assert list(flat.leaves) == list(leaves) and all(flat.leaves[p] is leaves[p] for p in leaves)
    if prefix:  # below the root "" a key "" names the root itself: no round trip, before or now
        assert same(inflate(prefix, flat.containers, flat.leaves), state)


@FAST
@given(prefix=st.sampled_from(["", "k", "a/b"]), keys=st.lists(st.one_of(odd_keys, st.booleans()), max_size=8))
def test_child_paths_is_join_path_of_each_key(prefix: str, keys: list[str | int]) -> None:
    assert child_paths(prefix, keys) == [join_path(prefix, key) for key in keys]
    assert child_paths(prefix, iter(keys)) == [join_path(prefix, key) for key in keys]


def test_inflate_of_a_container_whose_child_is_missing_raises_key_error() -> None:
    flat = flatten({"a": {"x": 1, "y": [2]}, "b": 3}, "k")
    for missing in ("k/a/x", "k/b", "k/a/y/0"):
        leaves = {path: value for path, value in flat.leaves.items() if path != missing}
        with pytest.raises(KeyError, match=missing):
            inflate("k", flat.containers, leaves)
