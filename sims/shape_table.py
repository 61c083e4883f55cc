"""The best shape per load as a policy table: what a server that captured these shapes would
run, tier by tier (a chain as its depth, a tree by its shape, plain as off).

Used where static shapes were measured one server at a time: `specctl sim shapes` on a profile
and the GPU harness's report of a bench of shapes. Between two measured loads whose best shapes
differ, the tier edge is where the two shapes' tok/s ratio, read linearly in log load, crosses
1 (the loads are spaced geometrically); hysteresis is about an eighth of the edge, as in the
depth table a bench recommends.

`loop_bound` reads the same figures as a closed loop over those loads: what switching to the
best shape at every step, for free, gives over the best single shape. No table on one server
does better, so it bounds what any table can win there.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from sglang_hooks.contract import PolicyError, PolicyTable, Tier, shape_tier
from sglang_hooks.draft_shape import parse_shape


def shape_table(
    streams: Sequence[int], tok: Mapping[str, Sequence[float | None]], version: int = 0
) -> PolicyTable | None:
    """`tok[label][i]`: shape `label`'s tok/s at `streams[i]` (None: not scored there). The
    table that runs the fastest shape at every load; None when some load has no scored shape."""
    best: list[str] = []
    for i in range(len(streams)):
        scored = {lb: t[i] for lb, t in tok.items() if t[i] is not None}
        if not scored:
            return None
        best.append(max(scored, key=lambda lb: scored[lb] or 0.0))
    if not best:
        return None
    tiers: list[Tier] = [shape_tier(1, parse_shape(best[0]))]
    for i in range(1, len(streams)):
        if best[i] == best[i - 1]:
            continue
        edge = _crossing(streams[i - 1], streams[i], tok[best[i - 1]], tok[best[i]], i)
        min_batch = min(max(math.ceil(edge), tiers[-1].min_batch + 1), max(streams[i], 2))
        if min_batch <= tiers[-1].min_batch:
            continue
        room = min_batch - tiers[-1].min_batch - 1
        hysteresis = max(0, min(round(min_batch / 8), room))
        tiers.append(shape_tier(min_batch, parse_shape(best[i]), hysteresis))
    try:
        return PolicyTable.build(tiers, version=version)
    except PolicyError:
        return None


def _crossing(lo: int, hi: int, was: Sequence[float | None], now: Sequence[float | None],
              i: int) -> float:  # fmt: skip
    """The load between `lo` and `hi` where the shape that was best stops being so."""
    a_lo, b_lo, a_hi, b_hi = was[i - 1], now[i - 1], was[i], now[i]
    if not (a_lo and b_lo and a_hi and b_hi) or a_lo <= b_lo or a_hi >= b_hi:
        return math.sqrt(lo * hi)  # one side unmeasured: halfway in log load
    r_lo, r_hi = math.log(a_lo / b_lo), math.log(a_hi / b_hi)
    x = r_lo / (r_lo - r_hi)
    return math.exp(math.log(lo) + x * (math.log(hi) - math.log(lo)))


def staircase(streams: Sequence[int]) -> list[int]:
    """The loads up and back down: 1, 4, 16, 4, 1 for 1, 4, 16."""
    up = sorted(set(streams))
    return up + up[-2::-1]


@dataclass(frozen=True)
class LoopBound:
    """A closed loop over `steps`, each lasting alike: each shape's tok/s held throughout
    (`held`), and the best shape at every step switched for free (`best_per_step`)."""

    steps: list[int]
    held: dict[str, float]
    best_per_step: float

    @property
    def best_single(self) -> str:
        return max(self.held, key=lambda label: self.held[label])

    @property
    def gain(self) -> float:
        """The best per step over the best single shape: the most a table can win here."""
        return self.best_per_step / self.held[self.best_single]

    def to_json(self) -> dict[str, object]:
        return {"steps": self.steps, "held_tok_per_s": self.held,
                "best_per_step_tok_per_s": self.best_per_step,
                "best_single": self.best_single, "gain": self.gain}


def loop_bound(streams: Sequence[int], tok: Mapping[str, Sequence[float | None]]
               ) -> LoopBound | None:  # fmt: skip
    """`tok[label][i]`: shape `label`'s tok/s at `streams[i]`. The bound over the loads'
    staircase; None when a shape lacks a figure at some load (or there is no shape)."""
    at = {s: i for i, s in enumerate(streams)}
    steps = staircase(streams)
    per_step: dict[str, list[float]] = {}
    for label, figures in tok.items():
        row = [figures[at[s]] for s in steps]
        if any(t is None for t in row):
            return None
        per_step[label] = [float(t) for t in row if t is not None]
    if not per_step:
        return None
    best = [max(row[i] for row in per_step.values()) for i in range(len(steps))]
    return LoopBound(steps, {lb: sum(row) / len(row) for lb, row in per_step.items()},
                     sum(best) / len(best))
