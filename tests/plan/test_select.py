"""``snapshotkit._plan.select``: what ``include=`` / ``exclude=`` keep of a flattened state."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from snapshotkit._plan.flatten import flatten, inflate
from snapshotkit._plan.select import Selection
from snapshotkit.errors import InvalidArgumentError
from snapshotkit.manifest import DictEntry, ListEntry


def kept(state: Any, include: list[str] | None = None, exclude: list[str] | None = None, root: str = "k") -> Any:
    """The value the selection keeps of ``state`` (rebuilt), or ``None`` when nothing is kept."""
    selection = Selection.of(include, exclude)
    assert selection is not None
    flat = selection.apply(flatten(state, root), root)
    return None if flat is None else inflate(root, flat.containers, flat.leaves)


def test_no_patterns_is_no_selection() -> None:
    assert Selection.of(None, None) is None


def test_include_keeps_matching_leaves_and_the_dicts_that_hold_them() -> None:
    state = OrderedDict(
        [("base.weight", 1), ("lora_A.weight", 2), ("block", {"lora_B.weight": 3, "norm": 4}), ("bias", 5)]
    )
    assert kept(state, include=["k/**lora*"]) == OrderedDict([("lora_A.weight", 2), ("block", {"lora_B.weight": 3})])
    assert type(kept(state, include=["k/**lora*"])) is OrderedDict


def test_exclude_wins_over_include() -> None:
    state = {"a": 1, "b": 2, "c": {"d": 3, "e": 4}}
    assert kept(state, include=["k/*"], exclude=["k/b", "k/c/e"]) == {"a": 1, "c": {"d": 3}}
    assert kept(state, exclude=["k/c/*"]) == {"a": 1, "b": 2}
    assert kept(state, exclude=["*"]) is None


def test_star_matches_slashes_like_replicated() -> None:
    state = {"x": {"y": {"z": 1}}, "w": 2}
    assert kept(state, include=["k/*z"]) == {"x": {"y": {"z": 1}}}
    assert kept(state, include=["k/?"]) == {"w": 2}


@pytest.mark.parametrize("container", [list, tuple])
def test_a_list_or_tuple_is_kept_whole_or_not_at_all(container: type) -> None:
    state = {"seq": container([1, {"a": 2, "b": 3}]), "other": 4}
    assert kept(state, exclude=["k/seq/1/b"]) == {"other": 4}
    assert kept(state, include=["k/seq/0"]) is None
    whole = kept(state, include=["k/seq/**"])
    assert whole == {"seq": container([1, {"a": 2, "b": 3}])}
    assert type(whole["seq"]) is container


def test_a_dict_below_a_dropped_list_goes_too() -> None:
    state = {"groups": [{"lr": 0.1, "params": [0, 1]}, {"lr": 0.2, "params": [2]}], "step": 3}
    # group 0 is fully kept on its own, but its list loses group 1's "lr"
    assert kept(state, exclude=["k/groups/1/lr"]) == {"step": 3}


def test_empty_containers_count_as_leaves() -> None:
    state = {"state": {}, "history": [], "n": 1}
    assert kept(state, include=["k/state"]) == {"state": {}}
    assert kept(state, exclude=["k/history"]) == {"state": {}, "n": 1}
    assert kept(state, include=["k/n"]) == {"n": 1}


def test_a_root_leaf_is_kept_by_its_own_path() -> None:
    assert kept(7, include=["k"]) == 7
    assert kept(7, include=["k/*"]) is None
    assert kept(7, exclude=["k"]) is None


def test_dict_entries_list_only_the_kept_keys_in_order() -> None:
    selection = Selection.of(["k/b", "k/d*"], None)
    assert selection is not None
    flat = selection.apply(flatten({"a": 1, "b": 2, 3: {"x": 1}, "d": [1]}, "k"), "k")
    assert flat is not None
    assert flat.containers == {"k": DictEntry(("b", "d")), "k/d": ListEntry(1)}
    assert flat.leaves == {"k/b": 2, "k/d/0": 1}


@pytest.mark.parametrize(
    ("include", "exclude", "words"),
    [
        ("model/**", None, "pass include=['model/**']"),
        (None, "model/**", "pass exclude=['model/**']"),
        ([b"model/**"], None, "got bytes"),
        ([None], None, "got NoneType"),
        (5, None, "got int 5"),
        (None, [["a"]], "got list"),
    ],
)
def test_patterns_that_are_not_lists_of_str_are_invalid_arguments(include: Any, exclude: Any, words: str) -> None:
    with pytest.raises(InvalidArgumentError, match="patterns") as info:
        Selection.of(include, exclude)
    assert words in str(info.value)
    assert isinstance(info.value, TypeError)


def test_any_iterable_of_str_is_accepted() -> None:
    assert Selection.of(("a",), iter(["b"])) == Selection(("a",), ("b",))
    assert Selection.of([], None) == Selection((), ())


# --------------------------------------------------------------------------------------------
# property: what is kept is a valid subtree with exactly the selected leaves

keys = st.sampled_from(["a", "b", "lora", "w", 1, 2])
states = st.recursive(
    st.integers(0, 9),
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(keys, children, max_size=3),
    ),
    max_leaves=12,
)
patterns = st.lists(st.sampled_from(["k/*", "k/a*", "*lora*", "k/*/1", "*/b", "k/?", "k"]), max_size=3)


def _leaves_below(flat_leaves: dict[str, Any], containers: dict[str, Any], path: str) -> list[str]:
    below = path + "/"
    return [p for p in [*flat_leaves, *(c for c, e in containers.items() if _is_empty(e))] if p.startswith(below)]


def _is_empty(entry: Any) -> bool:
    return (isinstance(entry, DictEntry) and not entry.keys) or (isinstance(entry, ListEntry) and entry.length == 0)


@settings(max_examples=300, deadline=None)
@given(state=states, include=st.none() | patterns, exclude=st.none() | patterns)
@example(state={"a": [1, {"a": 2, "b": 3}]}, include=None, exclude=["*/b"])  # a dict in a list loses a key
def test_the_kept_part_is_a_subtree_of_exactly_the_selected_leaves(
    state: Any, include: list[str] | None, exclude: list[str] | None
) -> None:
    selection = Selection.of(include, exclude)
    if selection is None:
        return
    full = flatten(state, "k")
    flat = selection.apply(full, "k")
    if flat is None:
        return
    inflate("k", flat.containers, flat.leaves)  # every container names only children that exist
    terminals = [*flat.leaves, *(p for p, e in flat.containers.items() if _is_empty(e))]
    assert all(selection.keeps(path) for path in terminals)
    for path, entry in flat.containers.items():
        if isinstance(entry, ListEntry):  # a kept list or tuple kept everything below it
            below = _leaves_below(full.leaves, full.containers, path)
            assert all(p in flat.leaves or p in flat.containers for p in below)
    dropped = [p for p in full.leaves if p not in flat.leaves and selection.keeps(p)]
    for path in dropped:  # a selected leaf goes only with a list or tuple above it that lost a leaf
        ancestors = [
            a for a in full.containers if path.startswith(a + "/") and isinstance(full.containers[a], ListEntry)
        ]
        assert any(a not in flat.containers for a in ancestors), path
