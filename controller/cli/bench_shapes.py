"""`specctl bench --shapes`: run the shape sweep, print each level, write the report."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.table import Table

from controller.bench.loadgen import LoadError
from controller.bench.server_client import ServerError
from controller.bench.shape_sweep import (
    ShapeSweepError,
    ShapeSweepOutcome,
    run_shape_sweep,
)
from controller.bench.sweep import LevelObserver, LevelResult, SweepPlan
from controller.cli.args import fail
from controller.cli.bench_run import level_line
from controller.cli.tables import print_table
from sglang_hooks.contract import PolicyTable
from sglang_hooks.draft_shape import PLAIN, Shape, label, parse_shape
from sims.shape_table import LoopBound, loop_bound, shape_table

JSON_NAME = "shapes.json"
TABLE_NAME = "shapes-table.yaml"
PLOT_NAME = "shapes.png"


class _Lines(LevelObserver):
    def __init__(self, console: Console) -> None:
        self.console = console

    def level_finished(self, result: LevelResult) -> None:
        accept = "" if result.accept_length is None else f"  accept {result.accept_length:.2f}"
        self.console.print(level_line(result) + accept, highlight=False)

    def message(self, text: str) -> None:
        self.console.print(f"[dim]{text}[/dim]")

    def warning(self, text: str) -> None:
        self.console.print(f"[yellow]warning:[/yellow] {text}", soft_wrap=True)


def best_table(outcome: ShapeSweepOutcome) -> PolicyTable | None:
    """The best shape per load as a table (None: some load has no level that decides)."""
    if not outcome.results:
        return None
    return shape_table(list(outcome.plan.concurrencies), outcome.tok())


def shapes_table(outcome: ShapeSweepOutcome) -> Table:
    """Output tok/s per shape and load (its accept length in the header), the best per load;
    a level that decides nothing is dimmed with `?`."""
    table = Table(title=f"output tok/s per draft shape held ({outcome.plan.url})")
    table.add_column("streams", justify="right")
    for name, levels in outcome.results.items():
        accepts = [r.accept_length for r in levels if r.accept_length is not None]
        header = name + ("" if not accepts else f"\nL={sum(accepts) / len(accepts):.2f}")
        table.add_column(header, justify="right")
    table.add_column("best", justify="right")
    best = dict(outcome.best())
    for c in outcome.plan.concurrencies:
        cells = []
        for levels in outcome.results.values():
            r = next((x for x in levels if x.concurrency == c), None)
            if r is None:
                cells.append("-")
                continue
            text = f"{r.output_tok_per_s:,.0f}"
            cells.append(f"[dim]{text}?[/dim]" if r.flags else text)
        table.add_row(str(c), *cells, best.get(c) or "-")
    recommended = outcome.to_json(best_table(outcome))["recommended"]
    table.caption = ("as a table: " + recommended) if recommended else \
        "no table: some load has no level that decides (see the flags in shapes.json)"
    bound = closed_loop_bound(outcome)
    if bound is not None and len(outcome.results) > 1:
        table.caption += (
            f"\nover a closed loop of {'-'.join(map(str, bound.steps))} streams, steps "
            f"alike, the best shape per step gives x{bound.gain:.3f} the best single one "
            f"({bound.best_single}): the most any table can win there")
    return table


def closed_loop_bound(outcome: ShapeSweepOutcome) -> LoopBound | None:
    """What the best shape per load, switched for free over the loads up and back down,
    gives over the best single shape (streamed tok/s, flagged levels too)."""
    return loop_bound(list(outcome.plan.concurrencies), outcome.streamed())


def _plot(outcome: ShapeSweepOutcome, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, ax = plt.subplots(figsize=(6.4, 4.4))
    for name, levels in outcome.results.items():
        points = sorted((r.concurrency, r.output_tok_per_s) for r in levels)
        if points:
            ax.plot(*zip(*points, strict=True), marker="o", label=name,
                    linestyle=_line_style(parse_shape(name)))  # fmt: skip
    loads = list(outcome.plan.concurrencies)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(loads, [str(c) for c in loads])
    ax.minorticks_off()
    ax.set_xlabel("concurrent streams")
    ax.set_ylabel("output tok/s")
    recommended = outcome.to_json(best_table(outcome))["recommended"] or "no table"
    styles = "trees dashed, plain dotted" if PLAIN in outcome.results else "trees dashed"
    ax.set_title(f"draft shapes held on one server ({styles})\n{recommended}", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _line_style(shape: Shape) -> str:
    if shape is None:
        return ":"
    return "-" if shape.is_chain else "--"


def _write(outcome: ShapeSweepOutcome, out_dir: Path, console: Console) -> None:
    from controller.daemon.policy_file import PolicyFile, Provenance, dump

    table = best_table(outcome)
    bound = closed_loop_bound(outcome)
    doc = {**outcome.to_json(table), "closed_loop_bound": bound and bound.to_json()}
    paths = [out_dir / JSON_NAME]
    paths[0].write_text(json.dumps(doc, indent=1) + "\n")
    if table is not None:
        provenance = Provenance(
            created_at=dt.datetime.now(dt.UTC).replace(microsecond=0),
            created_by="specctl bench --shapes", fingerprint=table.fingerprint,
            url=outcome.plan.url,  # type: ignore[call-arg]  # extra keys are kept
            streams=list(outcome.plan.concurrencies), shapes=doc["shapes"],
        )  # fmt: skip
        dump(PolicyFile(table=table, provenance=provenance), out_dir / TABLE_NAME)
        paths.append(out_dir / TABLE_NAME)
    _plot(outcome, out_dir / PLOT_NAME)
    paths.append(out_dir / PLOT_NAME)
    console.print("wrote " + ", ".join(str(p) for p in paths))


def run_shape_bench(plan: SweepPlan, shapes: Sequence[Shape], out_dir: Path) -> int:
    """Hold each shape, run every level, print and write what finished; the exit status."""
    console = Console(soft_wrap=True)
    loads = ", ".join(map(str, plan.concurrencies))
    console.print(f"benching {', '.join(label(s) for s in shapes)} held in turn on {plan.url}, "
                  f"{loads} streams", highlight=False)  # fmt: skip
    outcome = ShapeSweepOutcome(plan, list(shapes))
    code = 0
    try:
        run_shape_sweep(plan, shapes, outcome, _Lines(console))
    except ShapeSweepError as err:
        raise fail(str(err)) from None
    except (KeyboardInterrupt, asyncio.CancelledError):
        console.print("[yellow]interrupted[/yellow]: writing the levels that finished")
        outcome.interrupted = "interrupted"
        code = 130
    except (ServerError, LoadError) as err:
        console.print(f"[red]error:[/red] {err}")
        outcome.interrupted = str(err)
        code = 2
    if outcome.restored is not None:
        console.print(f"server table restored: {outcome.restored}")
    elif outcome.before is not None:
        console.print("[red]the previous table could not be restored[/red]; check the server")
    if any(outcome.results.values()):
        print_table(console, shapes_table(outcome))
        _write(outcome, out_dir, console)
    return code
