"""``snapshotkit._text.first_few``: the one way messages name "the first five and N more"."""

from __future__ import annotations

import pytest

from snapshotkit._text import describe_paths, first_few


def test_names_all_when_they_fit() -> None:
    assert first_few([]) == ""
    assert first_few(["a"]) == "'a'"
    assert first_few(["a", "b", "c", "d", "e"]) == "'a', 'b', 'c', 'd', 'e'"


def test_counts_the_rest() -> None:
    assert first_few(["a", "b", "c", "d", "e", "f", "g"]) == "'a', 'b', 'c', 'd', 'e' and 2 more"
    assert first_few(list(range(25)), 10, show=str) == "0, 1, 2, 3, 4, 5, 6, 7, 8, 9 and 15 more"
    assert first_few(["x.pt", "y.pt"], 1, show=str) == "x.pt and 1 more"


def test_keeps_the_order_given_and_uses_the_separator() -> None:
    assert first_few(["b", "a", "b"]) == "'b', 'a', 'b'"
    items = [("a", "a str, not a tensor"), ("b", "an int"), ("c", "x"), ("d", "y")]
    shown = first_few(items, 3, show=lambda item: f"{item[0]!r}: {item[1]}", separator="; ")
    assert shown == "'a': a str, not a tensor; 'b': an int; 'c': x and 1 more"


def test_a_limit_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        first_few(["a"], 0)


def test_describe_paths_sorts_and_names_each_once() -> None:
    assert describe_paths([]) == ""
    assert describe_paths(iter(["m/b", "m/a", "m/b"])) == "'m/a', 'm/b'"
    paths = [f"m/{i:02}" for i in range(8, 0, -1)]
    assert describe_paths(paths) == "'m/01', 'm/02', 'm/03', 'm/04', 'm/05' and 3 more"
