"""`specctl bench --shapes`: a shape server's captured shapes benched in turn, without a restart.

Each listed shape is held by a one-tier table (pushed and read back live; plain by an off
tier, where the server captured depth 0), then every load of the plan runs as the server runs
(`sweep_as_is`, a level's accept length from the plugin's per-depth or per-tree series: plain's
from depth 0's). The table the server had is pushed back however this ends.
The tok/s of the levels that decide something (no flag) per shape and load is what the best
shape per load as a table is made from (`specctl bench --shapes` does it with
`sims.shape_table`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.bench.server_client import ServerError, ServerState
from controller.bench.sweep import (
    LevelObserver,
    LevelResult,
    SweepPlan,
    run_cancellable,
    sweep_as_is,
)
from sglang_hooks.contract import PolicyTable, shape_tier, tier_label
from sglang_hooks.draft_shape import PLAIN, Shape, chain, label


class ShapeSweepError(ValueError):
    """A shape list this server cannot hold; the message names the fix."""


def held_table(shape: Shape, version: int) -> PolicyTable:
    """One tier running `shape` at every load (plain: an off tier)."""
    return PolicyTable.build([shape_tier(1, shape)], version=version)


def check_captured(shapes: Sequence[Shape], state: ServerState) -> None:
    """Refuse a shape the server did not capture, naming what it did."""
    trees = {t.label for t in state.captured_trees}
    for shape in shapes:
        if shape is None:
            held = 0 in state.captured_depths
        elif shape.is_chain:
            held = shape.steps in state.captured_depths
        else:
            held = shape.label in trees
        if held:
            continue
        have = [f"d{d}" for d in state.captured_depths if d > 0] + sorted(trees)
        if shape is None:  # a shape server captures off only when plain was listed
            raise ShapeSweepError(
                f"--shapes: plain (off) was not captured by the server (it holds "
                f"{', '.join(have) or 'none'}); start it with `{_with_plain(state)}`"
            )
        raise ShapeSweepError(
            f"--shapes: {shape.label} was not captured by the server (it holds "
            f"{', '.join(have) or 'none'}); start it with `specctl serve --shapes` listing "
            "every shape to bench"
        )


def _with_plain(state: ServerState) -> str:
    """The command that captures what the server does and off too: a chain server keeps
    --depths."""
    depths = sorted(d for d in state.captured_depths if d > 0)
    if not state.captured_trees:
        return f"specctl serve --depths {','.join(map(str, [0, *depths]))}"
    chains = [label(chain(d)) for d in reversed(depths)]
    trees = sorted(t.label for t in state.captured_trees)
    return "specctl serve --shapes " + ",".join([*trees, *chains, PLAIN])


@dataclass
class ShapeSweepOutcome:
    plan: SweepPlan
    shapes: list[Shape]
    before: ServerState | None = None
    results: dict[str, list[LevelResult]] = field(default_factory=dict)
    restored: str | None = None  # the table pushed back, described; None: not restored
    interrupted: str | None = None

    def tok(self) -> dict[str, list[float | None]]:
        """Each shape's output tok/s per load, None where its level decided nothing."""
        loads = list(self.plan.concurrencies)
        out: dict[str, list[float | None]] = {}
        for name, levels in self.results.items():
            by_load = {r.concurrency: r for r in levels}
            out[name] = [None if (r := by_load.get(c)) is None or r.flags
                         else r.output_tok_per_s for c in loads]  # fmt: skip
        return out

    def streamed(self) -> dict[str, list[float | None]]:
        """Each shape's output tok/s per load as its window streamed it, flagged levels too
        (None: no level there)."""
        loads = list(self.plan.concurrencies)
        out: dict[str, list[float | None]] = {}
        for name, levels in self.results.items():
            by_load = {r.concurrency: r.output_tok_per_s for r in levels}
            out[name] = [by_load.get(c) for c in loads]
        return out

    def best(self) -> list[tuple[int, str | None]]:
        tok = self.tok()
        out: list[tuple[int, str | None]] = []
        for i, c in enumerate(self.plan.concurrencies):
            scored = {n: t[i] for n, t in tok.items() if t[i] is not None}
            out.append((c, max(scored, key=lambda n: scored[n] or 0.0) if scored else None))
        return out

    def to_json(self, table: PolicyTable | None) -> dict[str, Any]:
        """Everything measured, and `table`: the best shape per load as a table, if any."""
        return {
            "url": self.plan.url, "prompt_source": self.plan.prompt_source,
            "concurrency": list(self.plan.concurrencies),
            "shapes": [label(s) for s in self.shapes],
            "table_before": None if self.before is None else self.before.describe(),
            "restored": self.restored, "interrupted": self.interrupted,
            "levels": {name: [{**r.to_json(), "flags": r.flags} for r in levels]
                       for name, levels in self.results.items()},
            "best": [{"streams": c, "shape": b} for c, b in self.best()],
            "recommended_table": None if table is None else table.to_json(),
            "recommended": None if table is None else
            " | ".join(_tier_text(table, i) for i in range(len(table.tiers))),
        }  # fmt: skip


def _tier_text(table: PolicyTable, i: int) -> str:
    tiers = table.tiers
    top = tiers[i + 1].min_batch - 1 if i + 1 < len(tiers) else math.inf
    span = f"{tiers[i].min_batch}+" if top == math.inf else f"{tiers[i].min_batch}-{top}"
    return f"{span}: {tier_label(tiers[i])}"


async def sweep_shapes(plan: SweepPlan, shapes: Sequence[Shape],
                       outcome: ShapeSweepOutcome,
                       observer: LevelObserver | None = None) -> None:  # fmt: skip
    """Hold each shape and run every load; the server's table is pushed back however this
    ends. Fills `outcome` as it goes, so what finished survives an interruption."""
    observer = observer or LevelObserver()
    with plan.server(plan.url) as server:
        before = server.state()
        check_captured(shapes, before)
        outcome.before = before
        observer.message(f"server table before the sweep: {before.describe()}")
        try:
            for i, shape in enumerate(shapes):
                held = server.push(held_table(shape, before.version + 1 + i))
                observer.message(f"holding {label(shape)}: {held.describe()}")
                name = label(shape)
                outcome.results[name] = []
                outcome.results[name] = await sweep_as_is(plan, name, observer)
        finally:
            try:
                outcome.restored = server.push(before.table).describe()
            except ServerError as err:
                observer.warning(f"the previous table could not be restored: {err}")


def run_shape_sweep(plan: SweepPlan, shapes: Sequence[Shape], outcome: ShapeSweepOutcome,
                    observer: LevelObserver | None = None) -> None:  # fmt: skip
    """`sweep_shapes` in a fresh event loop; SIGTERM cancels it like Ctrl-C does."""
    run_cancellable(lambda: sweep_shapes(plan, shapes, outcome, observer))
