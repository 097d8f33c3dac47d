"""The containers check over a version-5 manifest's columns (``check_column_containers``) gives
the same verdict and the same first error as ``check_containers`` over the built entries."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from snapshotkit._format.entries import DictEntry, Entry, ListEntry, TensorEntry, check_containers
from snapshotkit._format.tensor_columns import check_column_containers
from snapshotkit.errors import ManifestError

_NAMES = ("a", "b", "0", "1", "x%2Fy", "q")
_KEYS: tuple[str | int, ...] = ("a", "b", "0", "1", "x/y", "q", 0, 1)


@st.composite
def _manifests(draw: Any) -> dict[tuple[int, str], Entry]:
    """Entries of ranks 0 and 1 at paths of depth 1 to 3: tensors (replicated or not), dicts
    naming some children (present, missing, escaped, twice) and lists."""
    out: dict[tuple[int, str], Entry] = {}
    paths = draw(
        st.lists(st.lists(st.sampled_from(_NAMES), min_size=1, max_size=3).map("/".join), min_size=1, max_size=12)
    )
    for path in paths:
        rank = draw(st.integers(0, 1))
        what = draw(st.sampled_from(("tensor", "tensor", "dict", "list")))
        if what == "tensor":
            out[(rank, path)] = TensorEntry("uint8", (0,), "raw", (), draw(st.booleans()))
        elif what == "dict":
            out[(rank, path)] = DictEntry(tuple(draw(st.lists(st.sampled_from(_KEYS), max_size=4))))
        else:
            out[(rank, path)] = ListEntry(draw(st.integers(0, 3)))
    return out


def _outcome(check: Any) -> str | None:
    try:
        check()
    except ManifestError as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


@settings(max_examples=400, deadline=None)
@given(_manifests())
def test_the_column_check_agrees_with_the_check_of_the_entries(manifest: dict[tuple[int, str], Entry]) -> None:
    ordered = sorted(manifest.items())
    paths = [path for (_, path), _ in ordered]
    rank = np.array([r for (r, _), _ in ordered], dtype=np.uint32)
    kind = np.array([1 if isinstance(e, TensorEntry) else 0 for _, e in ordered], dtype=np.uint8)
    replicated = np.array([int(getattr(e, "replicated", False)) for _, e in ordered], dtype=np.uint8)
    rows = [e for _, e in ordered if not isinstance(e, TensorEntry)]
    entries = {f"{r}/{path}": e for (r, path), e in ordered}
    expected = _outcome(lambda: check_containers(entries))
    assert _outcome(lambda: check_column_containers(paths, rank, kind, replicated, rows)) == expected
