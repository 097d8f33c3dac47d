"""The documentation site builds with ``mkdocs build --strict``, and the API guide agrees with the code.

``--strict`` turns every warning into a failure: a broken link or anchor between pages, a page
missing from the navigation, a ``:::`` reference mkdocstrings cannot resolve, a docstring griffe
cannot parse (an ``Args:`` entry naming no parameter), a snippet (CHANGELOG.md) that is missing.
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import snapshotkit
import snapshotkit.convert
import snapshotkit.diff
import snapshotkit.lightning
import snapshotkit.verify

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_mkdocs_build_strict_has_no_warning(tmp_path: Path) -> None:
    site = tmp_path / "site"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")  # mkdocs-material's notice about its successor
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(REPO / "mkdocs.yml"), "-d", str(site)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=REPO,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "WARNING" not in output, output
    # The generated reference is really there, and the changelog is the file's text, not a copy.
    reference = (site / "reference" / "snapshot" / "index.html").read_text()
    assert "async_take" in reference and ":meth:" not in reference
    changelog_title = (REPO / "CHANGELOG.md").read_text().splitlines()[0].lstrip("# ")
    assert changelog_title in (site / "changelog" / "index.html").read_text()
    # The API reference's section has a page of its own, which its header in the navigation links
    # to (a static server would list the folder's files instead).
    assert "snapshot/" in (site / "reference" / "index.html").read_text()
    assert 'href="reference/"' in (site / "index.html").read_text()


def test_reference_index_lists_every_reference_page() -> None:
    """docs/reference/index.md links every page of docs/reference/, and the navigation names the index."""
    index = (REPO / "docs" / "reference" / "index.md").read_text()
    pages = sorted(p.name for p in (REPO / "docs" / "reference").glob("*.md") if p.name != "index.md")
    assert pages, "no reference page found"
    unlisted = [page for page in pages if f"]({page})" not in index]
    assert not unlisted, f"docs/reference/index.md does not link {unlisted}"
    mkdocs_yml = (REPO / "mkdocs.yml").read_text()
    assert "- reference/index.md" in mkdocs_yml and "navigation.indexes" in mkdocs_yml


# ---------------------------------------------------------------- the hand-written API guide

_HEADING = re.compile(r"^#{2,4} `(?P<name>[\w.]+)\((?P<args>[^`]*)\)(?: -> [^`]*)?`", flags=re.MULTILINE)


def _resolve(name: str) -> Callable[..., Any]:
    """The callable an API-guide heading names: ``Snapshot.take``, ``import_snapshot``..."""
    for namespace in (snapshotkit, snapshotkit.convert):
        head, *rest = name.split(".")
        if hasattr(namespace, head):
            target: Any = getattr(namespace, head)
            for part in rest:
                target = getattr(target, part)
            return target  # type: ignore[no-any-return]
    module_name, _, attribute = name.rpartition(".")
    return getattr(sys.modules[module_name], attribute)  # type: ignore[no-any-return]


def _heading_parameters(args: str) -> list[tuple[str, bool]]:
    """(name, keyword-only) of each parameter a heading lists, split at top-level commas only."""
    parts, depth, current = [], 0, ""
    for char in args:
        depth += char in "([{"
        depth -= char in ")]}"
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    if current.strip():
        parts.append(current.strip())
    parameters, keyword_only = [], False
    for part in parts:
        if part == "*":
            keyword_only = True
            continue
        parameters.append((part.split("=", 1)[0].strip(), keyword_only))
    return parameters


def _code_parameters(target: Callable[..., Any]) -> list[tuple[str, bool]]:
    signature = inspect.signature(target.__init__ if inspect.isclass(target) else target)
    return [
        (p.name, p.kind is inspect.Parameter.KEYWORD_ONLY)
        for p in signature.parameters.values()
        if p.name not in ("self", "cls") and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    ]


def test_api_guide_signatures_match_the_code() -> None:
    """Every ``### `name(args)``` heading of docs/api.md lists the real parameters, in order."""
    headings = list(_HEADING.finditer((REPO / "docs" / "api.md").read_text()))
    assert len(headings) >= 10
    wrong = []
    for heading in headings:
        documented = _heading_parameters(heading.group("args"))
        actual = _code_parameters(_resolve(heading.group("name")))
        if documented != actual:
            wrong.append(f"{heading.group('name')}: docs/api.md {documented}, code {actual}")
    assert not wrong, "\n".join(wrong)
