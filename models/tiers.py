"""From per-batch-size predictions to a contract tier table: runs, crossovers, gain, hysteresis.

Pure functions over arrays indexed by batch size (index i is batch size i + 1), so the rules
that shape a table can be tested without a model behind them.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass
class Run:
    """Batch sizes [lo, hi] (inclusive) that run `depth`."""

    lo: int
    hi: int
    depth: int


def runs_of(best: np.ndarray) -> list[Run]:
    """Maximal runs of equal depth; `best[i]` is the depth for batch size i + 1."""
    runs: list[Run] = []
    for i, d in enumerate(best.tolist()):
        if runs and runs[-1].depth == d:
            runs[-1].hi = i + 1
        else:
            runs.append(Run(i + 1, i + 1, int(d)))
    return runs


def crossovers(runs: Sequence[Run], tok: Mapping[int, np.ndarray]) -> list[tuple[int, int, float]]:
    """(from_depth, to_depth, batch size) at each run boundary, linearly interpolated."""
    out = []
    for left, right in itertools.pairwise(runs):
        a, b, i = left.depth, right.depth, left.hi - 1  # i: index of batch size left.hi
        # diff > 0 at batch left.hi (a wins), <= 0 one batch later (b wins): the zero between.
        d0 = tok[a][i] - tok[b][i]
        d1 = tok[a][i + 1] - tok[b][i + 1]
        frac = d0 / (d0 - d1) if d0 != d1 else 0.5
        out.append((a, b, float(left.hi + min(max(frac, 0.0), 1.0))))
    return out


def merge_small_gain_runs(
    runs: list[Run],
    tok: Mapping[int, np.ndarray],
    min_gain: float,
    *,
    load: np.ndarray | None = None,
    loaded_share: float = 1.0,
    loaded_min_gain: float | None = None,
) -> list[Run]:
    """Relabel runs whose depth never beats its neighbours' depths by `min_gain`.

    A run's gain is the largest relative margin, over its batch sizes, of its depth over the
    better of the adjacent runs' depths. The weakest run below its bar takes the neighbour
    depth that loses least over the run; repeat until every run earns its place.

    `load` (share of the load per batch size, same indexing as `tok`): a run carrying at least
    `loaded_share` of it is held to `loaded_min_gain` instead. Its gain is earned on that
    load, so the bar that keeps tables simple where little runs must not give it away.
    """
    runs = [Run(r.lo, r.hi, r.depth) for r in runs]
    low = min_gain if loaded_min_gain is None else min(loaded_min_gain, min_gain)
    while len(runs) > 1:
        shortfall = []
        for i, r in enumerate(runs):
            sl = slice(r.lo - 1, r.hi)
            neigh = {runs[j].depth for j in (i - 1, i + 1) if 0 <= j < len(runs)}
            rival = np.max([tok[d][sl] for d in neigh], axis=0)
            gain = float(np.max(tok[r.depth][sl] / rival - 1.0))
            loaded = load is not None and float(np.sum(load[sl])) >= loaded_share
            shortfall.append(gain - (low if loaded else min_gain))
        weakest = int(np.argmin(shortfall))
        if shortfall[weakest] >= 0.0:
            break
        r = runs[weakest]
        sl = slice(r.lo - 1, r.hi)
        neigh_idx = [j for j in (weakest - 1, weakest + 1) if 0 <= j < len(runs)]
        take = max(neigh_idx, key=lambda j: float(np.sum(tok[runs[j].depth][sl])))
        r.depth = runs[take].depth
        runs = _coalesce(runs)
    return runs


def _coalesce(runs: Sequence[Run]) -> list[Run]:
    out: list[Run] = []
    for r in runs:
        if out and out[-1].depth == r.depth:
            out[-1].hi = r.hi
        else:
            out.append(Run(r.lo, r.hi, r.depth))
    return out


def hysteresis_for(min_batch: int, prev_min: int, fraction: float) -> int:
    """Hysteresis of a boundary at `min_batch`: a fraction of it, inside the tier below."""
    if prev_min <= 0:
        return 0
    h = round(fraction * min_batch)
    return max(0, min(h, min_batch - prev_min - 1))
