"""Where text output goes and how it looks: rich tables, grids and trees on a terminal; when
stdout is piped or redirected, the same content as plain lines.

IMPORTANT: piped output is data someone greps, cuts or diffs, so it never wraps, truncates or
pads a value: one record per line (a table row, a header row, a tree node), table cells separated
by one tab, no line ending in a space, whatever the width of the terminal (or ``COLUMNS``). On a
terminal rich lays out for the screen (wrapping cells, colours).
"""

from __future__ import annotations

from collections.abc import Iterable

from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

__all__ = ["cell_text", "console", "is_plain", "print_lines", "print_table"]


def console() -> Console:
    """Where text output goes: stdout (plain text, never wrapped, when it is not a terminal)."""
    return Console(highlight=False, soft_wrap=True)


def is_plain(out: Console) -> bool:
    """Whether ``out`` takes plain lines (stdout piped or redirected) rather than rich layout."""
    return not out.is_terminal


def cell_text(cell: RenderableType | None) -> str:
    """A table cell as one line of text: its characters as given, except a tab, newline or carriage
    return, written ``\\t``, ``\\n``, ``\\r`` so that the cell stays one field of one line."""
    if cell is None:
        return ""
    text = cell.plain if isinstance(cell, Text) else str(cell)
    return text.replace("\t", "\\t").replace("\n", "\\n").replace("\r", "\\r")


def print_table(out: Console, table: Table) -> None:
    """Print ``table``: laid out by rich on a terminal; piped, as plain lines.

    Plain lines: the title, then (for a table with a header) the header and one line per row, the
    cells separated by a tab, then the caption. A grid (no header, no box: ``Table.grid``, a
    header of ``name  value`` rows) keeps its first column aligned (the names are padded, the
    values never are).
    """
    if not is_plain(out):
        out.print(table)
        return
    rows = [
        [cell_text(cell) for cell in cells] for cells in zip(*(column.cells for column in table.columns), strict=True)
    ]
    lines: list[str] = []
    if table.title is not None:
        lines.append(cell_text(table.title))
    if table.show_header or table.box is not None:
        if table.show_header:
            lines.append("\t".join(cell_text(column.header) for column in table.columns))
        lines.extend("\t".join(row) for row in rows)
    else:
        width = max((len(row[0]) for row in rows), default=0)
        for name, *values in rows:
            value = "  ".join(value for value in values if value)
            lines.append(f"{name:<{width}}  {value}" if value else name)
    if table.caption is not None:
        lines.append(cell_text(table.caption))
    print_lines(out, lines)


def print_lines(out: Console, lines: Iterable[str]) -> None:
    """Write ``lines`` as they are (rich would expand tabs and could wrap), each ended by a newline."""
    for line in lines:
        out.file.write(line + "\n")
