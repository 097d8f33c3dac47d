"""A griffe extension for the documentation site: Sphinx roles in docstrings become code spans.

snapshotkit's docstrings are Google style, but cross-references are written as Sphinx roles
(``:class:`~snapshotkit.RNGState```, ``:meth:`take```), which mkdocstrings would print literally.
This rewrites each role to a Markdown code span of what it names (the last dotted component when
the target starts with ``~``), and reStructuredText's double backquotes to Markdown's single ones.
Loaded by ``mkdocs.yml`` (``plugins.mkdocstrings.handlers.python.options.extensions``).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:class|meth|func|attr|mod|exc|data|obj):`(~?)([^`]+)`")
_DOUBLE_BACKQUOTES = re.compile(r"``([^`]+)``")


def _code_span(match: re.Match[str]) -> str:
    short, target = match.group(1), match.group(2)
    return f"`{target.rsplit('.', 1)[-1] if short else target}`"


def markdown_of(docstring: str) -> str:
    """The docstring with Sphinx roles and double backquotes turned into Markdown code spans."""
    return _DOUBLE_BACKQUOTES.sub(r"`\1`", _ROLE.sub(_code_span, docstring))


class SphinxRolesToCode(griffe.Extension):
    """Rewrites every docstring griffe loads with :func:`markdown_of`."""

    def on_object(self, *, obj: griffe.Object, loader: griffe.GriffeLoader, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown_of(obj.docstring.value)
