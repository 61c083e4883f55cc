"""What the server chose on its own, as a table: the incumbent of the daemon's first push.

Before the daemon's first push the server runs SGLang's own adaptive choice, which gives the
learner evidence about one depth per batch size and nothing about the others. Waiting for a
predicted gain before taking over can then mean waiting forever (the model cannot predict a gain
for depths it has never seen). So the daemon takes over with its first fitted model, keeping
what SGLang measurably chose at each batch bucket unless the model predicts
`takeover_min_gain` more, and adds the learner's probes: from then on every depth the table may
need is measured, within the exploration cap.
"""

from __future__ import annotations

from collections.abc import Iterable

from models.samples import Sample
from sglang_hooks.contract import PolicyTable, Tier


def measured_choice(samples: Iterable[Sample]) -> PolicyTable | None:
    """The depth the server ran most (probes aside) in each batch bucket, as a table.

    Buckets without samples take the depth of the nearest measured bucket below (the lowest
    measured bucket's depth also covers the batch sizes under it). None: nothing measured.
    """
    plain: dict[int, dict[int, float]] = {}
    for s in samples:
        n = s.iterations - s.explore_iterations
        if n > 0:
            per = plain.setdefault(s.bs_bucket, {})
            per[s.depth] = per.get(s.depth, 0.0) + n
    if not plain:
        return None
    tiers: list[Tier] = []
    for bucket in sorted(plain):
        counts = plain[bucket]
        depth = max(counts, key=lambda d: (counts[d], -d))
        if tiers and tiers[-1].depth == depth:
            continue
        tiers.append(Tier(1 if not tiers else bucket, depth))
    return PolicyTable.build(tiers, version=0)
