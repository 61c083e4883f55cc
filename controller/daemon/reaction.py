"""When to re-decide at once instead of at the next scheduled decision.

The scheduled loop (fit every `fit_interval_s`, decide every `decide_interval_s`, no push within
`min_dwell_s` of the last) is right while the load stays where the live table was decided. Two
changes make it too slow, and each is visible in a single scrape:

- **the load moved**: a large share of the last interval's decode time fell in batch buckets
  that carried (almost) no load when the live table was last decided (`novel_share`). A flash
  crowd that pins the batch at the running cap is the typical case;
- **acceptance moved**: a depth's accepted drafts per request-step over the last interval are
  many standard errors from what the learner predicts for it (`acceptance_surprise`), in either
  direction.

Either starts a *reaction*: for `react_window_s` the daemon refits and decides after every
scrape, without the dwell time, so that the first interval of evidence at the new load and
every one after it reach a table at once (the learner's change-point test needs a few intervals
after a change of acceptance before it cuts the old evidence).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping

from models.samples import Sample

NOVEL_FLOOR = 0.02  # a bucket with less than this share of the decided-on load counts as new


def decode_time_histogram(samples: Iterable[Sample]) -> dict[int, float]:
    """Share of decode seconds per batch bucket (all depths, probes included)."""
    acc: dict[int, float] = {}
    for s in samples:
        acc[s.bs_bucket] = acc.get(s.bs_bucket, 0.0) + s.gpu_seconds
    total = sum(acc.values())
    return {b: v / total for b, v in sorted(acc.items())} if total > 0 else {}


def novel_share(current: Mapping[int, float], decided: Mapping[int, float]) -> float:
    """Share of `current` load in buckets that held under NOVEL_FLOOR of the decided-on load."""
    return sum(w for b, w in current.items() if decided.get(b, 0.0) < NOVEL_FLOOR)


def acceptance_surprise(
    samples: Iterable[Sample],
    mean_length: Callable[[int], float],
    std_length: Callable[[int], float],
    dispersion: float,
    min_shift: float,
) -> float:
    """The largest z, over depths >= 1, of the measured accepted drafts per request-step in
    `samples` against the learner's prediction; 0 when no depth moved by `min_shift` of its
    accept length. Over-dispersion: `dispersion` request-steps count as one observation."""
    steps: dict[int, float] = {}
    accepted: dict[int, float] = {}
    for s in samples:
        if s.depth <= 0:
            continue
        steps[s.depth] = steps.get(s.depth, 0.0) + s.request_steps
        accepted[s.depth] = accepted.get(s.depth, 0.0) + s.tokens - s.request_steps
    worst = 0.0
    for d, n in steps.items():
        if n <= 0:
            continue
        predicted = mean_length(d) - 1.0
        observed = accepted[d] / n
        if abs(observed - predicted) < min_shift * (1.0 + predicted):
            continue
        # Accepted drafts of one request-step: variance about m (1 + m) (a leading run of
        # successes), inflated by the dispersion; plus the learner's own uncertainty.
        m = max(predicted, 0.05)
        var = dispersion * m * (1.0 + m) / n + std_length(d) ** 2
        worst = max(worst, abs(observed - predicted) / math.sqrt(var))
    return worst
