"""Plain-text help whose options are grouped under headings (a command with many options).

The CLI prints click's plain help (no rich boxes, see controller/cli/__init__.py), in which
typer's `rich_help_panel` is ignored; `PanelCommand` reads it and writes one section per panel,
in the order the panels first appear, so `specctl bench --help` reads by topic.
"""

from __future__ import annotations

import typer.core

try:  # typer vendors click since 0.2x; before, click was a dependency of its own
    from typer import _click as click
except ImportError:  # pragma: no cover
    import click  # type: ignore[no-redef]


class PanelCommand(typer.core.TyperCommand):
    """A command whose `--help` groups its options by their `rich_help_panel`."""

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        sections: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            panel = getattr(param, "rich_help_panel", None) or "Other options"
            sections.setdefault(panel, []).append(record)
        for title, rows in sections.items():
            with formatter.section(title):
                formatter.write_dl(rows)
