"""Guardrails between a learner's proposal and a push.

- `restrict_to_captured`: a table may only name depths the server captured CUDA graphs for
  (an uncaptured depth would run eagerly, several times slower).
- `bound_change`: when the proposal keeps the live table's depth sequence, each boundary moves
  at most `max_boundary_move` of its live value per push, so one bad fit cannot throw the
  thresholds across the range. A proposal with a different depth sequence (a tier added or
  removed) is a structural change: it is not clamped, it waits for the dwell time like every
  push and it is checked after the push like every push.
- `compare_after_push`: measured tok/s at batch buckets whose depth the push changed, before
  versus after; a drop beyond `rollback_drop` rolls the push back.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from models.samples import Sample
from sglang_hooks.contract import BS_BUCKET_EDGES, PolicyTable, Tier, bucket_upper, tier_label


def _nearest_captured(depth: int, captured: Sequence[int]) -> int:
    below = [d for d in captured if d <= depth]
    return max(below) if below else min(captured)


def restrict_to_captured(table: PolicyTable, captured: Iterable[int]) -> PolicyTable:
    """Map each depth to the deepest captured depth not above it; merge identical neighbours."""
    caps = sorted(set(captured))
    if not caps:
        raise ValueError("the server reports no captured depths")
    tiers: list[Tier] = []
    for t in table.tiers:
        depth = _nearest_captured(t.depth, caps)
        explore = tuple(
            d
            for d in dict.fromkeys(_nearest_captured(e, caps) for e in t.explore_depths)
            if d != depth
        )
        share = t.explore_share if explore else 0.0
        if tiers and (tiers[-1].depth, tiers[-1].explore_share, tiers[-1].explore_depths) == (
            depth,
            share,
            explore,
        ):
            continue  # runs exactly like the tier below: one tier
        hysteresis = t.hysteresis if tiers else 0
        if tiers:
            hysteresis = min(hysteresis, t.min_batch - tiers[-1].min_batch - 1)
        tiers.append(Tier(t.min_batch, depth, hysteresis, share, explore))
    return PolicyTable.build(tiers, version=table.version, captured_depths=caps)


def decision_runs(table: PolicyTable) -> list[tuple[int, int]]:
    """(first batch size, depth) of each run of one shape: the table's decisions, ignoring
    tiers that only split a run to explore differently (a tree and the chain of its steps are
    two runs of one depth)."""
    return [(lo, table.tiers[i].depth) for lo, i in _runs(table)]


def _runs(table: PolicyTable) -> list[tuple[int, int]]:
    """(first batch size, index of its first tier) of each run of one shape."""
    runs: list[tuple[int, int]] = []
    for i, t in enumerate(table.tiers):
        if not runs or tier_label(table.tiers[runs[-1][1]]) != tier_label(t):
            runs.append((t.min_batch, i))
    return runs


def _run_shapes(table: PolicyTable) -> list[str]:
    return [tier_label(table.tiers[i]) for _, i in _runs(table)]


def bound_change(
    live: PolicyTable | None, proposed: PolicyTable, max_move: float
) -> tuple[PolicyTable, bool]:
    """(table to push, whether any boundary was clamped).

    When the proposal keeps the live sequence of decisions (same depths in the same order),
    each boundary between two depths moves at most `max_move` of its live value (at least one
    batch size); tiers inside a run (exploration splits) keep their place when it still lies
    inside the clamped run. Otherwise (a depth added or removed) the proposal is returned as is.
    """
    if live is None:
        return proposed, False
    old_runs, new_runs = decision_runs(live), decision_runs(proposed)
    if _run_shapes(live) != _run_shapes(proposed):
        return proposed, False
    starts = [1]
    clamped = False
    for (old, _), (new, _) in zip(old_runs[1:], new_runs[1:], strict=True):
        lo = min(math.floor(old * (1 - max_move)), old - 1)
        hi = max(math.ceil(old * (1 + max_move)), old + 1)
        m = max(min(max(new, lo, 1), hi), starts[-1] + 1)
        clamped |= m != new
        starts.append(m)
    if not clamped:
        return proposed, False
    tiers: list[Tier] = []
    run = -1
    for t in proposed.tiers:
        if run + 1 < len(new_runs) and t.min_batch == new_runs[run + 1][0]:
            run += 1
            start = starts[run]
        else:
            start = t.min_batch
            next_start = starts[run + 1] if run + 1 < len(starts) else None
            if start <= starts[run] or (next_start is not None and start >= next_start):
                continue  # an exploration split that fell outside its clamped run
        hysteresis = 0 if not tiers else min(t.hysteresis, start - tiers[-1].min_batch - 1)
        tiers.append(replace(t, min_batch=start, hysteresis=hysteresis))
    return PolicyTable.build(tiers, version=proposed.version), True


# ----------------------------------------------------------------------------- rollback check


@dataclass(frozen=True)
class BucketRate:
    iterations: float
    tokens: float
    gpu_seconds: float

    @property
    def tok_per_s(self) -> float:
        return self.tokens / self.gpu_seconds


def bucket_rates(samples: Iterable[Sample]) -> dict[int, BucketRate]:
    """Measured decode tok/s per batch bucket, all depths together (exploration included)."""
    acc: dict[int, list[float]] = {}
    for s in samples:
        a = acc.setdefault(s.bs_bucket, [0.0, 0.0, 0.0])
        a[0] += s.iterations
        a[1] += s.tokens
        a[2] += s.gpu_seconds
    return {b: BucketRate(*v) for b, v in acc.items() if v[2] > 0}


def changed_buckets(old: PolicyTable | None, new: PolicyTable | None) -> set[int]:
    """Buckets where the two tables' plain readings (the shape run) differ anywhere (None: all
    buckets)."""
    if old is None or new is None:
        return set(BS_BUCKET_EDGES)
    out = set()
    for lo in BS_BUCKET_EDGES:
        hi = min(bucket_upper(lo), 2048)
        if any(old.tier_for(b).shape != new.tier_for(b).shape for b in range(lo, hi + 1)):
            out.add(lo)
    return out


@dataclass(frozen=True)
class PushComparison:
    matched_buckets: tuple[int, ...]
    before_tok_per_s: float | None  # weighted by the after-window's time share per bucket
    after_tok_per_s: float | None

    @property
    def drop(self) -> float | None:
        if not self.before_tok_per_s or self.after_tok_per_s is None:
            return None
        return 1.0 - self.after_tok_per_s / self.before_tok_per_s


def compare_after_push(
    before: Sequence[Sample],
    after: Sequence[Sample],
    buckets: set[int],
    min_iterations: int,
) -> PushComparison:
    """Compare tok/s at matched buckets (same load) the push changed."""
    rb, ra = bucket_rates(before), bucket_rates(after)
    matched = sorted(
        b
        for b in buckets
        if b in rb
        and b in ra
        and rb[b].iterations >= min_iterations
        and ra[b].iterations >= min_iterations
    )
    if not matched:
        return PushComparison((), None, None)
    weight = {b: ra[b].gpu_seconds for b in matched}
    total = sum(weight.values())
    before_rate = sum(weight[b] * rb[b].tok_per_s for b in matched) / total
    after_rate = sum(weight[b] * ra[b].tok_per_s for b in matched) / total
    return PushComparison(tuple(matched), before_rate, after_rate)
