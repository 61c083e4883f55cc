"""`specctl curves`: what the model has learned, and what it rests on (controller/cli/learned.py
does the work; this module only declares the command, so `--help` loads nothing heavy)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from controller.cli import app
from controller.cli.args import fail, plot_path_problem

STORE_HELP = (
    "The daemon's SQLite store (store.path). Default: the production store if there is one, "
    "else the newer of those `specctl daemon` (no --config) and `specctl demo` write."
)
CONFIG_HELP = "Read the store at the store.path of this controller.yaml."


def locate_store(store: Path | None, config: Path | None) -> tuple[Path, str | None]:
    """The store to read (see controller/cli/stores.py), or a one-line error and exit 2."""
    from controller.cli.stores import StoreNotFound, find_store
    from controller.daemon.config import ConfigError

    if store is not None and config is not None:
        raise typer.BadParameter("give --store or --config, not both", param_hint="--config")
    try:
        return find_store(store, config)
    except (StoreNotFound, ConfigError) as err:
        raise fail(str(err)) from None


@app.command("curves")
def curves(
    store: Annotated[Path | None, typer.Option(help=STORE_HELP)] = None,
    config: Annotated[Path | None, typer.Option(help=CONFIG_HELP)] = None,
    group: Annotated[str | None, typer.Option(help="Target group (default: the only one).")] = None,
    target: Annotated[str | None, typer.Option(help="Only this target's samples.")] = None,
    plot: Annotated[Path | None, typer.Option(help="Write a figure (PNG/SVG/PDF) here.")] = None,
    snapshot: Annotated[
        bool, typer.Option("--snapshot", help="Use the daemon's last learner snapshot, no refit.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")] = False,
) -> None:
    """Show the learned tok/s per depth, its evidence and the tables.

    Per batch size: each depth's predicted decode tok/s with its band, the measured points
    behind it, the depth the model prefers and the one the live table runs. On a server that
    switches draft shapes, each tree's measured tok/s stands beside the depths.

    \b
    Examples:
      specctl demo && specctl curves
      specctl curves --config controller.yaml --plot curves.png
      specctl curves --store /var/lib/specctl/specctl.sqlite --group kimi-k25
      specctl curves --target gpu1 --json | jq .crossovers
    """
    problem = None if plot is None else plot_path_problem(plot)
    if problem is not None:
        raise fail(problem)
    path, why = locate_store(store, config)
    from rich.console import Console

    from controller.cli.learned import (
        CurvesError,
        curves_json,
        curves_table,
        load_group_model,
        plot_curves,
        when,
    )
    from controller.cli.tables import print_table

    try:
        model = load_group_model(path, group, target, snapshot)
    except CurvesError as err:
        raise fail(str(err)) from None
    proposal = model.propose()
    console = Console(soft_wrap=True)
    if as_json:
        typer.echo(json.dumps(curves_json(model, proposal), indent=2))
    else:
        if why is not None:
            console.print(f"store {path} ({why})", highlight=False)
        start, end = model.window
        console.print(
            f"group [bold]{model.group}[/bold] (targets: {', '.join(model.targets)}), "
            f"{len(model.samples)} samples over {end - start:,.0f} s "
            f"(until {when(end)}); learner: {model.source}"
        )
        if model.trees:
            trees = ", ".join(sorted({s.tree for s in model.trees}))
            console.print(f"draft trees, measured and not learned: {len(model.trees)} samples "
                          f"of {trees}")  # fmt: skip
        print_table(console, curves_table(model, proposal))
        cross = ", ".join(f"d{a}->d{b} at batch {x:.1f}" for a, b, x in proposal.crossovers)
        console.print(f"crossovers: {cross or 'none'}")
        live = model.live_table.describe() if model.live_table else "none pushed yet"
        console.print(f"live table ({model.live_target or '-'}): {live}")
        console.print(
            f"proposed now: [bold]{proposal.table.describe()}[/bold]  ({proposal.reason})"
        )
    if plot is not None:
        try:
            plot_curves(model, proposal, plot)
        except OSError as err:
            raise fail(f"--plot {plot}: cannot write it ({err.strerror or err})") from None
        if not as_json:
            console.print(f"wrote {plot}")
