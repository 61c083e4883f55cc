"""A shape server running a table of shapes, against each shape held on its own server.

Two questions a bench of static shapes leaves open, answered on the profile:

- **per load**: the table, switching inside one server (`sims.shape_server.switching_server`),
  against the best single shape at each load (same window and seed as the static points);
- **closed loop**: one run whose clients step through the loads in turn (each held
  `step_s`, up and back down), every static shape and the table over the same trace: output
  tokens over the whole run, and per step.

The table is what a shape server that captured the shapes can run: the best shape per load
among them. With plain among the shapes the server captured off too (`switching_server`), so
where plain is best the table turns drafting off (an `off` tier, paying spec-v2's scheduling
beside a plain server's iteration); without it the table runs the best drafting shape there
and its loss shows.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from sglang_hooks.contract import PolicyTable
from sglang_hooks.draft_shape import PLAIN
from sims.engine import Engine, Lane, SimStats
from sims.policies import DepthPolicy, FixedDepthPolicy, ShapeTablePolicy
from sims.profile import Profile
from sims.shape_server import shape_server, switching_server
from sims.shape_table import staircase
from sims.workload import Trace, Workload

TABLE = "table"  # the label of the switching server's runs beside the static shapes'


def drafting(shapes: Sequence[str]) -> list[str]:
    """The shapes that draft (all but plain)."""
    return [s for s in shapes if s != PLAIN]


def switchable(shapes: Sequence[str]) -> list[str]:
    """The shapes a shape server that captured `shapes` switches among: all of them, plain as
    its off, when one drafts (none otherwise: such a list starts no shape server)."""
    return list(shapes) if drafting(shapes) else []


@dataclass(frozen=True)
class ClosedLoopRun:
    label: str  # a static shape, or TABLE
    tok_per_s: float  # every output token over the whole trace
    per_step: list[float]  # tok/s in each step of the trace
    completed: int


@dataclass(frozen=True)
class ClosedLoop:
    phase: str
    steps: list[int]  # streams per step, in order
    step_s: float
    runs: list[ClosedLoopRun]

    def run(self, label: str) -> ClosedLoopRun:
        return next(r for r in self.runs if r.label == label)

    def ratios(self) -> dict[str, float]:
        """The table's tok/s over each static shape's, over the whole trace."""
        table = self.run(TABLE).tok_per_s
        return {r.label: table / r.tok_per_s for r in self.runs
                if r.label != TABLE and r.tok_per_s > 0}  # fmt: skip

    def step_ratios(self) -> dict[str, float]:
        """The geometric mean over the steps of the table's tok/s over each static shape's:
        every load counts alike, where the whole trace's tokens favour the busiest."""
        table = self.run(TABLE).per_step
        out = {}
        for r in self.runs:
            pairs = [(t, x) for t, x in zip(table, r.per_step, strict=True) if t > 0 and x > 0]
            if r.label != TABLE and pairs:
                out[r.label] = math.exp(sum(math.log(t / x) for t, x in pairs) / len(pairs))
        return out

    def envelope(self) -> float:
        """Output tok/s of the best static shape at every step (plain included), switched
        for free: what no one server can beat on this trace."""
        statics = [r.per_step for r in self.runs if r.label != TABLE]
        best = [max(col) for col in zip(*statics, strict=True)]
        return sum(best) / len(best)  # the steps last alike

    def to_json(self) -> dict[str, Any]:
        return {
            "phase": self.phase, "steps": self.steps, "step_s": self.step_s,
            "runs": [{"label": r.label, "tok_per_s": round(r.tok_per_s, 2),
                      "per_step": [round(x, 2) for x in r.per_step],
                      "completed_requests": r.completed} for r in self.runs],
            "table_over": {k: round(v, 4) for k, v in self.ratios().items()},
            "table_over_per_step": {k: round(v, 4) for k, v in self.step_ratios().items()},
            "best_static_per_step_tok_per_s": round(self.envelope(), 2),
        }  # fmt: skip


Server = tuple[Profile, DepthPolicy | None, dict[int, Lane] | None, bool]


def _server(profile: Profile, label: str, table: PolicyTable | None,
            shapes: Sequence[str], seed: int) -> Server:  # fmt: skip
    """(profile, policy, lanes, speculative) of the server that runs `label`."""
    if label == TABLE:
        assert table is not None
        server = switching_server(profile, switchable(shapes))
        switching = ShapeTablePolicy(table, random.Random(seed), server.keys)
        return server.profile, switching, server.lanes, True
    static = shape_server(profile, label)
    held = None if static.depth is None else FixedDepthPolicy(static.depth)
    return static.profile, held, None, static.speculative


def table_window(profile: Profile, table: PolicyTable, shapes: Sequence[str],
                 workload: Workload, seed: int, warmup_s: float,
                 duration_s: float) -> tuple[SimStats, SimStats]:  # fmt: skip
    """Stats at the end of warm-up and of the window, the table running on a shape server."""
    prof, policy, lanes, _ = _server(profile, TABLE, table, shapes, seed)
    engine = Engine(prof, workload, seed=seed, policy=policy, lanes=lanes)
    engine.run_until(warmup_s)
    start = engine.stats.copy()
    engine.run_until(warmup_s + duration_s)
    return start, engine.stats.copy()


def closed_loop(profile: Profile, shapes: Sequence[str], table: PolicyTable, phase: str,
                streams: Sequence[int], step_s: float, prompt_tokens: int,
                output_tokens: int | tuple[int, int], seed: int,
                on_run: Callable[[], None] | None = None) -> ClosedLoop:  # fmt: skip
    """Every static shape and the table over one staircase of loads."""
    steps = staircase(streams)
    trace = Trace(points=[(i * step_s, float(s)) for i, s in enumerate(steps)],
                  interpolation="step")  # fmt: skip
    runs = []
    for label in [*shapes, TABLE]:
        prof, policy, lanes, speculative = _server(profile, label, table, shapes, seed)
        workload = Workload.closed(trace, prompt_tokens=prompt_tokens,
                                   output_tokens=output_tokens, phase=phase)  # fmt: skip
        engine = Engine(prof, workload, seed=seed, speculative=speculative, policy=policy,
                        lanes=lanes)  # fmt: skip
        marks = [engine.stats.copy()]
        for i in range(1, len(steps) + 1):
            engine.run_until(i * step_s)
            marks.append(engine.stats.copy())
        per_step = [b.tok_per_s_since(a) for a, b in itertools.pairwise(marks)]
        runs.append(ClosedLoopRun(label, marks[-1].tok_per_s_since(marks[0]), per_step,
                                  marks[-1].completed_requests))  # fmt: skip
        if on_run is not None:
            on_run()
    return ClosedLoop(phase, steps, step_s, runs)
