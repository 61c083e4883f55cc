"""`specctl sim shapes`: each static draft shape's closed-loop tok/s per load, and the best shape
per load, the table a shape-aware policy would use.

Each point is its own simulation, as a sweep's are (`sims.sweep.run_point`): `streams` clients
in a closed loop against a server started at one shape (`sims.shape_server`), measured after a
warm-up. Per acceptance phase (a bench of shapes' prompt family) one table: the shapes' tok/s
per load and the fastest shape at each. Where a shape server could switch among the shapes
run (two or more, one of them drafting; plain is its off), the best shape per load as a table
also runs on a shape server that captured them (`sims.shape_switch`), at each load and, with
`closed_loop_step_s`, over a closed loop that steps through the loads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.table import Table

from sglang_hooks.contract import PolicyTable
from sglang_hooks.draft_shape import PLAIN
from sims.policies import FixedDepthPolicy
from sims.profile import Profile
from sims.shape_server import shape_server
from sims.shape_switch import TABLE, ClosedLoop, closed_loop, switchable, table_window
from sims.shape_table import shape_table
from sims.sweep import Point, SweepSpec, run_point
from sims.sweep import _point as window_point  # the window between two snapshots, as a point
from sims.workload import Workload


@dataclass(frozen=True)
class ShapeSweepSpec:
    shapes: list[str]
    phases: list[str]
    streams: list[int]
    duration_s: float = 300.0
    warmup_s: float = 30.0
    prompt_tokens: int = 1024
    output_tokens: int | tuple[int, int] = 256  # (low, high): each request's drawn evenly
    seed: int = 0
    closed_loop_step_s: float = 0.0  # seconds per load of the closed loop; 0: none

    @property
    def switches(self) -> bool:
        """Whether a shape server's table is run: two or more shapes to switch among, one of
        them drafting (plain is the server's off)."""
        return len(switchable(self.shapes)) >= 2

    def points(self) -> int:
        per_phase = len(self.shapes) * len(self.streams)
        if self.switches:
            per_phase += len(self.streams)
            if self.closed_loop_step_s > 0:
                per_phase += len(self.shapes) + 1
        return per_phase * len(self.phases)


@dataclass(frozen=True)
class ShapePoint:
    shape: str
    phase: str
    point: Point  # depth: the shape's steps (None: plain); mode "spec" or "nospec"

    @property
    def tok_per_s(self) -> float:
        return self.point.tok_per_s

    def to_json(self) -> dict[str, Any]:
        out = self.point.to_json()
        del out["mode"], out["depth"]
        return {"shape": self.shape, "phase": self.phase, **out}


@dataclass
class ShapeSweepResult:
    profile: str
    spec: ShapeSweepSpec
    points: list[ShapePoint]  # the static shapes'; the table's per load are `switched`
    switched: list[ShapePoint] = field(default_factory=list)
    closed: dict[str, ClosedLoop] = field(default_factory=dict)  # by phase

    def at(self, phase: str, streams: int) -> list[ShapePoint]:
        return [p for p in self.points if p.phase == phase and p.point.concurrency == streams]

    def best(self, phase: str, streams: int) -> ShapePoint | None:
        """The fastest shape at this load, if every shape was scored there (else None)."""
        here = self.at(phase, streams)
        if not here or not all(p.point.scored for p in here):
            return None
        return max(here, key=lambda p: p.tok_per_s)

    def best_line(self, phase: str) -> str:
        """The best shape per load as a policy reads it: `1-16: 3x4x16 | 64: 3x1x4 | ...`."""
        runs: list[tuple[int, int, str]] = []
        for s in self.spec.streams:
            best = self.best(phase, s)
            name = "?" if best is None else best.shape
            if runs and runs[-1][2] == name:
                runs[-1] = (runs[-1][0], s, name)
            else:
                runs.append((s, s, name))
        return " | ".join(f"{a}: {n}" if a == b else f"{a}-{b}: {n}" for a, b, n in runs)

    def _tok(self, phase: str) -> dict[str, list[float | None]]:
        return {name: [next((p.tok_per_s if p.point.scored else None) for p in self.at(phase, s)
                            if p.shape == name) for s in self.spec.streams]
                for name in self.spec.shapes}  # fmt: skip

    def table(self, phase: str) -> PolicyTable | None:
        """The best shape per load as a policy table (None when some load has no best)."""
        if any(self.best(phase, s) is None for s in self.spec.streams):
            return None
        return shape_table(self.spec.streams, self._tok(phase))

    def switch_table(self, phase: str) -> PolicyTable | None:
        """The best shape per load as the table a shape server that captured the shapes runs,
        plain as off (None: nothing to switch, or some load with no shape scored)."""
        return self.table(phase) if self.spec.switches else None

    def switched_at(self, phase: str, streams: int) -> ShapePoint | None:
        return next((p for p in self.switched
                     if p.phase == phase and p.point.concurrency == streams), None)  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        spec = self.spec
        return {
            "profile": self.profile,
            "duration_s": spec.duration_s,
            "warmup_s": spec.warmup_s,
            "prompt_tokens": spec.prompt_tokens,
            "output_tokens": (list(spec.output_tokens) if isinstance(spec.output_tokens, tuple)
                              else spec.output_tokens),
            "seed": spec.seed,
            "points": [p.to_json() for p in self.points],
            "best": {phase: [{"streams": s, "shape": b.shape if b else None,
                              "tok_per_s": round(b.tok_per_s, 2) if b else None}
                             for s in spec.streams for b in [self.best(phase, s)]]
                     for phase in spec.phases},
            "tables": {phase: None if (t := self.table(phase)) is None else t.to_json()
                       for phase in spec.phases},
            "switch_tables": {phase: None if (t := self.switch_table(phase)) is None
                              else t.to_json() for phase in spec.phases},
            "switched": [p.to_json() for p in self.switched],
            "closed_loop": {phase: c.to_json() for phase, c in self.closed.items()},
        }  # fmt: skip


def run_shape_sweep(profile: Profile, spec: ShapeSweepSpec,
                    on_point: Callable[[], None] | None = None) -> ShapeSweepResult:  # fmt: skip
    result = ShapeSweepResult(profile.name, spec, [])
    for phase in spec.phases:
        result.points += _static_points(profile, spec, phase, on_point)
        table = result.switch_table(phase)
        if table is None:
            continue
        for s in spec.streams:
            workload = Workload.closed(s, prompt_tokens=spec.prompt_tokens,
                                       output_tokens=spec.output_tokens, phase=phase)  # fmt: skip
            a, b = table_window(profile, table, spec.shapes, workload, spec.seed,
                                spec.warmup_s, spec.duration_s)  # fmt: skip
            result.switched.append(ShapePoint(TABLE, phase, window_point("spec", None, s, a, b)))
            if on_point is not None:
                on_point()
        if spec.closed_loop_step_s > 0:
            result.closed[phase] = closed_loop(
                profile, spec.shapes, table, phase, spec.streams, spec.closed_loop_step_s,
                spec.prompt_tokens, spec.output_tokens, spec.seed, on_run=on_point,
            )  # fmt: skip
    return result


def _static_points(profile: Profile, spec: ShapeSweepSpec, phase: str,
                   on_point: Callable[[], None] | None) -> list[ShapePoint]:  # fmt: skip
    points = []
    for name in spec.shapes:
        server = shape_server(profile, name)
        sweep = SweepSpec(concurrency=spec.streams, depths=[], duration_s=spec.duration_s,
                          warmup_s=spec.warmup_s, prompt_tokens=spec.prompt_tokens,
                          output_tokens=spec.output_tokens, phase=phase, seed=spec.seed)
        for s in spec.streams:
            policy = None if server.depth is None else FixedDepthPolicy(server.depth)
            a, b = run_point(server.profile, sweep, s, speculative=server.speculative,
                             policy=policy)
            mode = "spec" if server.speculative else "nospec"
            points.append(ShapePoint(name, phase, window_point(mode, server.depth, s, a, b)))
            if on_point is not None:
                on_point()
    return points


def _cell(p: ShapePoint, best: ShapePoint | None) -> str:
    if not p.point.decoded:
        return "-"
    text = f"{p.tok_per_s:,.0f}"
    if not p.point.enough_requests:
        return f"[dim]{text}?[/dim]"
    return f"[bold]{text}[/bold]" if p is best else text


def render_tables(result: ShapeSweepResult) -> list[Table]:
    """One table per phase: tok/s per shape (with its accept length) and load, the best shape.

    A point with no decode in its window shows `-`, one where fewer requests finished than
    there are streams is dimmed with `?`; a load with either has no best shape."""
    spec = result.spec
    out = []
    for phase in spec.phases:
        output = spec.output_tokens
        length = f"{output[0]}-{output[1]}" if isinstance(output, tuple) else str(output)
        table = Table(title=f"{result.profile}: closed-loop tok/s per draft shape, phase {phase} "
                      f"({spec.prompt_tokens} prompt / {length} output tokens, "
                      f"{spec.duration_s:g} s per point)")  # fmt: skip
        table.add_column("streams", justify="right")
        for name in spec.shapes:
            decoded = [p for p in result.points if p.shape == name and p.phase == phase
                       and p.point.decoded]  # fmt: skip
            accept = "" if name == PLAIN or not decoded else \
                f"\nL={decoded[0].point.accept_length:.2f}"
            table.add_column(f"{name}{accept}", justify="right")
        table.add_column("best", justify="right")
        switching = result.switch_table(phase)
        if switching is not None:
            table.add_column("table", justify="right")
            table.add_column("table\n/ best", justify="right")
        for s in spec.streams:
            best = result.best(phase, s)
            by_shape = {p.shape: p for p in result.at(phase, s)}
            cells = [_cell(by_shape[n], best) for n in spec.shapes]
            cells.append("-" if best is None else best.shape)
            if switching is not None:
                cells += _table_cells(result.switched_at(phase, s), best)
            table.add_row(str(s), *cells)
        policy = result.table(phase)
        table.caption = f"best shape per load: {result.best_line(phase)}" + (
            "" if policy is None else f"\nas a table: {policy.describe()}"
        )
        out.append(table)
        if phase in result.closed:
            out.append(closed_loop_table(result, phase))
    return out


def _table_cells(point: ShapePoint | None, best: ShapePoint | None) -> list[str]:
    if point is None or not point.point.decoded:
        return ["-", "-"]
    if best is None or best.tok_per_s <= 0:
        return [_cell(point, None), "-"]
    return [_cell(point, None), f"{point.tok_per_s / best.tok_per_s:.3f}"]


def closed_loop_table(result: ShapeSweepResult, phase: str) -> Table:
    """The closed loop over the loads: each server's tok/s over the whole trace, and the
    table's over it (whole trace and per step)."""
    loop = result.closed[phase]
    ratios, per_step = loop.ratios(), loop.step_ratios()
    table = Table(title=f"{result.profile}: closed loop over {', '.join(map(str, loop.steps))} "
                  f"streams ({loop.step_s:g} s each), phase {phase}")  # fmt: skip
    for column in ("server", "tok/s", "table over it", "per step (geo. mean)"):
        table.add_column(column, justify="right")
    for run in loop.runs:
        label = "table (switching)" if run.label == TABLE else run.label
        over = ratios.get(run.label)
        step = per_step.get(run.label)
        table.add_row(label, f"{run.tok_per_s:,.0f}", "" if over is None else f"{over:.3f}",
                      "" if step is None else f"{step:.3f}")
    envelope = loop.envelope()
    table.caption = (f"best static shape at every step, switched for free: {envelope:,.0f} "
                     f"tok/s (the table reaches {loop.run(TABLE).tok_per_s / envelope:.3f})")
    return table


def plot(result: ShapeSweepResult, path: Path) -> None:
    """One panel per phase: each shape's tok/s against the load (trees dashed), the table
    switching on a shape server (a wide grey line), the best shape per load in the title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    phases = result.spec.phases
    figure, axes = plt.subplots(1, len(phases), figsize=(6 * len(phases), 4.4), squeeze=False)
    streams = result.spec.streams
    for ax, phase in zip(axes[0], phases, strict=True):
        for name in result.spec.shapes:
            points = [(p.point.concurrency, p.tok_per_s) for p in result.points
                      if p.shape == name and p.phase == phase and p.point.decoded]
            if points:
                tree = name != PLAIN and name.split("x")[1] != "1"
                ax.plot(*zip(*points, strict=True), marker="o", label=name,
                        linestyle="--" if tree else "-")
        switched = [(p.point.concurrency, p.tok_per_s) for p in result.switched
                    if p.phase == phase and p.point.decoded]  # fmt: skip
        if switched:
            ax.plot(*zip(*switched, strict=True), color="black", linewidth=2.2, alpha=0.45,
                    label="table (one server switching)")  # fmt: skip
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(streams, [str(s) for s in streams])
        ax.minorticks_off()
        ax.set_xlabel("concurrent streams")
        ax.set_ylabel("output tok/s")
        ax.set_title(f"phase {phase}\nbest: {result.best_line(phase)}", fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    figure.suptitle(f"{result.profile}: static draft shapes\n(steps x topk x draft tokens, "
                    "trees dashed), simulated", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
