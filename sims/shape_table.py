"""The best shape per load as a policy table: what a server that captured these shapes would
run, tier by tier (a chain as its depth, a tree by its shape, plain as off).

Used where static shapes were measured one server at a time: `specctl sim shapes` on a profile
and the GPU harness's report of a bench of shapes. Between two measured loads whose best shapes
differ, the tier edge is where the two shapes' tok/s ratio, read linearly in log load, crosses
1 (the loads are spaced geometrically); hysteresis is about an eighth of the edge, as in the
depth table a bench recommends.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

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
