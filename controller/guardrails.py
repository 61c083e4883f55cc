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
from dataclasses import dataclass

from models.samples import Sample
from sglang_hooks.contract import BS_BUCKET_EDGES, PolicyTable, Tier, bucket_upper


def _nearest_captured(depth: int, captured: Sequence[int]) -> int:
    below = [d for d in captured if d <= depth]
    return max(below) if below else min(captured)


def restrict_to_captured(table: PolicyTable, captured: Iterable[int]) -> PolicyTable:
    """Map each depth to the deepest captured depth not above it; merge equal neighbours."""
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
        if tiers and tiers[-1].depth == depth:
            continue  # same depth as the tier below: one tier
        hysteresis = t.hysteresis if tiers else 0
        if tiers:
            hysteresis = min(hysteresis, t.min_batch - tiers[-1].min_batch - 1)
        tiers.append(Tier(t.min_batch, depth, hysteresis, share, explore))
    return PolicyTable.build(tiers, version=table.version, captured_depths=caps)


def bound_change(
    live: PolicyTable | None, proposed: PolicyTable, max_move: float
) -> tuple[PolicyTable, bool]:
    """(table to push, whether any boundary was clamped)."""
    if live is None or [t.depth for t in live.tiers] != [t.depth for t in proposed.tiers]:
        return proposed, False
    clamped = False
    tiers: list[Tier] = [proposed.tiers[0]]
    for old, new in zip(live.tiers[1:], proposed.tiers[1:], strict=True):
        lo = min(math.floor(old.min_batch * (1 - max_move)), old.min_batch - 1)
        hi = max(math.ceil(old.min_batch * (1 + max_move)), old.min_batch + 1)
        m = min(max(new.min_batch, lo, 1), hi)
        m = max(m, tiers[-1].min_batch + 1)
        clamped |= m != new.min_batch
        hysteresis = min(new.hysteresis, m - tiers[-1].min_batch - 1)
        tiers.append(Tier(m, new.depth, hysteresis, new.explore_share, new.explore_depths))
    return PolicyTable.build(tiers, version=proposed.version), clamped


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
    """Buckets where the two tables' plain readings differ anywhere (None: all buckets)."""
    if old is None or new is None:
        return set(BS_BUCKET_EDGES)
    out = set()
    for lo in BS_BUCKET_EDGES:
        hi = min(bucket_upper(lo), 2048)
        if any(old.depth_for(b) != new.depth_for(b) for b in range(lo, hi + 1)):
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
