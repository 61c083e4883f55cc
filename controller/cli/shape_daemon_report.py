"""`specctl sim shapes --closed-loop S --daemon`: the daemon learning a shape server over the
same trace as the static shapes and the bench's table, and how it compares."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from rich.table import Table

    from controller.evaluation.shape_daemon import DaemonLoopRun
    from sims.profile import Profile
    from sims.shape_sweep import ShapeSweepResult, ShapeSweepSpec


def run_daemon_loops(profile: Profile, spec: ShapeSweepSpec,
                     quiet: bool) -> dict[str, DaemonLoopRun]:  # fmt: skip
    """The daemon over each phase's closed loop, from an empty store each time."""
    from controller.evaluation.shape_daemon import daemon_closed_loop
    from sims.shape_switch import switchable

    out = {}
    for phase in spec.phases:
        if not quiet:
            typer.echo(f"the daemon over phase {phase}'s closed loop ...", err=True)
        out[phase] = daemon_closed_loop(
            profile, switchable(spec.shapes), phase, spec.streams, spec.closed_loop_step_s,
            spec.prompt_tokens, spec.output_tokens, spec.seed)
    return out


def _over(result: ShapeSweepResult, phase: str, run: DaemonLoopRun) -> dict[str, float]:
    """The daemon's tok/s over each static shape's and the table's, over the whole trace."""
    loop = result.closed[phase]
    return {r.label: run.tok_per_s / r.tok_per_s for r in loop.runs if r.tok_per_s > 0}


def daemon_table(result: ShapeSweepResult, phase: str, run: DaemonLoopRun) -> Table:
    from rich.table import Table

    from sims.shape_switch import TABLE

    loop = result.closed[phase]
    over = _over(result, phase, run)
    table = Table(title=f"{result.profile}: the daemon on the shape server, from an empty "
                  f"store, over the same closed loop, phase {phase}")  # fmt: skip
    for column in ("server", "tok/s", "daemon over it"):
        table.add_column(column, justify="right")
    for r in loop.runs:
        label = "table (bench, switching)" if r.label == TABLE else r.label
        table.add_row(label, f"{r.tok_per_s:,.0f}", f"{over[r.label]:.3f}" if r.label in over
                      else "")  # fmt: skip
    table.add_row("daemon (learning)", f"{run.tok_per_s:,.0f}", "")
    final = "none" if run.final_table is None else run.final_table.describe()
    table.caption = (f"per step: {', '.join(f'{x:,.0f}' for x in run.per_step)} tok/s; "
                     f"{len(run.pushes)} pushes, {run.exploration_share:.1%} of steps probing; "
                     f"its table at the end: {final}")
    return table


def daemon_json(result: ShapeSweepResult, phase: str, run: DaemonLoopRun) -> dict[str, Any]:
    return {
        "tok_per_s": round(run.tok_per_s, 2),
        "per_step": [round(x, 2) for x in run.per_step],
        "completed_requests": run.completed,
        "over": {k: round(v, 4) for k, v in _over(result, phase, run).items()},
        "exploration_share": round(run.exploration_share, 5),
        "pushes": run.pushes,
        "final_table": None if run.final_table is None else run.final_table.to_json(),
        "final_table_text": None if run.final_table is None else run.final_table.describe(),
    }
