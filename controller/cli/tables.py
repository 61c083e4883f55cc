"""Print rich tables without cutting a cell, whatever the width of the output.

rich fits a table to the console by shrinking columns, and a column narrower than its number
shows `14…`: the number is lost. `print_table` never lets that happen:

1. the table as built, if it fits;
2. else without borders and with single-space padding, if that fits;
3. else, when the output is not a terminal (a pipe or a file, 80 columns unless COLUMNS says
   otherwise), at its natural width: plain columns, one row per line, longer than the width;
4. else (a narrow terminal), split into several tables of the columns that fit side by side,
   each repeating the leading key column(s).
"""

from __future__ import annotations

from rich.console import Console, RenderableType
from rich.measure import Measurement
from rich.table import Table

_UNBOUNDED = 100_000


def natural_width(console: Console, renderable: RenderableType) -> int:
    """The width `renderable` takes when nothing constrains it."""
    return Measurement.get(console, console.options.update_width(_UNBOUNDED), renderable).maximum


def _compact(table: Table) -> Table:
    table.box = None
    table.show_edge = False
    table.padding = (0, 1)
    table.pad_edge = False
    return table


def _columns_table(table: Table, indexes: list[int], first: bool, last: bool) -> Table:
    part = Table(
        title=table.title if first else None,
        caption=table.caption if last else None,
        box=None,
        padding=(0, 1),
        pad_edge=False,
        show_header=table.show_header,
        header_style=table.header_style,
        title_justify=table.title_justify,
        caption_justify=table.caption_justify,
    )
    columns = [table.columns[i] for i in indexes]
    for col in columns:
        part.add_column(
            col.header, justify=col.justify, style=col.style, header_style=col.header_style,
            no_wrap=col.no_wrap, overflow=col.overflow,
        )  # fmt: skip
    cells = [list(col.cells) for col in columns]
    for row in zip(*cells, strict=True):
        part.add_row(*row)
    return part


def split_columns(console: Console, table: Table, width: int, keep: int = 1) -> list[Table]:
    """`table` as several tables no wider than `width` (when one column allows it), each with
    the first `keep` columns and as many of the others, in order, as fit beside them."""
    keep = min(keep, len(table.columns))
    rest = list(range(keep, len(table.columns)))
    groups: list[list[int]] = []
    while rest:
        group = [rest.pop(0)]
        while rest:
            candidate = [*range(keep), *group, rest[0]]
            if natural_width(console, _columns_table(table, candidate, False, False)) > width:
                break
            group.append(rest.pop(0))
        groups.append(group)
    if not groups:
        return [_columns_table(table, list(range(keep)), True, True)]
    return [
        _columns_table(table, [*range(keep), *group], i == 0, i == len(groups) - 1)
        for i, group in enumerate(groups)
    ]


def print_table(console: Console, table: Table, keep: int = 1) -> None:
    """Print `table` with every cell whole (see the module docstring for how)."""
    width = console.width
    if natural_width(console, table) <= width:
        console.print(table)
        return
    table = _compact(table)
    needed = natural_width(console, table)
    if needed <= width:
        console.print(table)
        return
    if not console.is_terminal:
        console.width = needed
        try:
            console.print(table)
        finally:
            console.width = width
        return
    for part in split_columns(console, table, width, keep):
        console.print(part)
