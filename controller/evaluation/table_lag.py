"""How long the server runs a table that is not good for the load of the moment.

Every tick of an evaluation scores what the server decides for the load it is running *now*
(the batch buckets of the last scrape interval) at the acceptance mix of the requests it is
running (their phases, smoothed over ~30 s: the evaluation's tracker reads them from the
simulator), against the best depth at each of those batch sizes (the simulator's own cost
model):

- with a specctl table: the table's plain decisions (probes aside);
- with SGLang's own choice (no table yet): the depths SGLang actually ran there, in the shares
  it ran them (from the per-depth counters).

A tick is *good* when that score is >= `LAG_GOOD_FRACTION` (0.98: within 2% of the oracle).
A *bad episode* is a maximal run of ticks that are not good: its length is how long the server
ran a not-good table after the load or the acceptance moved somewhere the table did not cover
(or after a push made it worse). Using only the last interval's load makes a change visible at
the first scrape after it, so an episode starts within one scrape interval of the change that
caused it.

The first episode of a run is the cold start (nothing learned yet); it is reported on its own
(`cold_start_s`), and every later episode is a reaction to a change (`worst_change_lag_s`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from models.samples import Sample

LAG_GOOD_FRACTION = 0.98

TokAt = Callable[[int], dict[int, float]]  # batch size -> {depth: decode tok/s}


def current_load(samples: Sequence[Sample]) -> dict[int, tuple[float, float]]:
    """bucket -> (decode seconds, mean batch) of the samples given (all depths)."""
    acc: dict[int, list[float]] = {}
    for s in samples:
        a = acc.setdefault(s.bs_bucket, [0.0, 0.0, 0.0])
        a[0] += s.gpu_seconds
        a[1] += s.request_steps
        a[2] += s.iterations
    return {b: (v[0], v[1] / v[2]) for b, v in acc.items() if v[2] > 0 and v[0] > 0}


def decision_score(
    samples: Sequence[Sample], tok_at: TokAt, depth_for: Callable[[int], int] | None
) -> float | None:
    """Decode tok/s of the decisions over the samples' load, as a fraction of the best depths'.

    `depth_for`: the table's plain decision per batch size; None scores the depths that ran
    (iterations minus probes, per bucket), which is what SGLang's own choice decided.
    """
    load = current_load(samples)
    if not load:
        return None
    ran: dict[int, dict[int, float]] = {}
    if depth_for is None:
        for s in samples:
            plain = s.iterations - s.explore_iterations
            if plain > 0:
                per = ran.setdefault(s.bs_bucket, {})
                per[s.depth] = per.get(s.depth, 0.0) + plain
    got = best = 0.0
    total = sum(w for w, _ in load.values())
    for bucket, (weight, mean_batch) in load.items():
        batch = max(round(mean_batch), 1)
        tok = tok_at(batch)
        top = max(tok.values())
        if depth_for is not None:
            value = tok[depth_for(batch)]
        else:
            shares = ran.get(bucket)
            if not shares:
                continue
            n = sum(shares.values())
            value = sum(tok.get(d, 0.0) * k / n for d, k in shares.items())
        got += weight / total * value
        best += weight / total * top
    return got / best if best > 0 else None


@dataclass
class Episode:
    start: float  # first tick that was not good
    end: float | None  # first good tick after it (None: still bad at the end of the run)
    worst: float  # lowest score in it

    def duration(self, run_end: float) -> float:
        return (self.end if self.end is not None else run_end) - self.start


@dataclass
class LagTracker:
    """Scores every tick and cuts the run into bad episodes."""

    good: float = LAG_GOOD_FRACTION
    trace: list[tuple[float, float | None]] = field(default_factory=list)
    episodes: list[Episode] = field(default_factory=list)
    _open: Episode | None = None

    def observe(self, now: float, score: float | None) -> None:
        self.trace.append((now, score))
        if score is None:
            return  # no decode in the interval: nothing decided, nothing to score
        if score < self.good:
            if self._open is None:
                self._open = Episode(now, None, score)
                self.episodes.append(self._open)
            else:
                self._open.worst = min(self._open.worst, score)
        elif self._open is not None:
            self._open.end = now
            self._open = None

    def report(self, run_end: float) -> dict[str, Any]:
        """Cold start, the worst later episode and every episode (seconds)."""
        first_scored = next((t for t, s in self.trace if s is not None), None)
        eps = list(self.episodes)
        cold: Episode | None = None
        if eps and first_scored is not None and eps[0].start <= first_scored:
            cold = eps.pop(0)
        lags = [e.duration(run_end) for e in eps]
        return {
            "good_fraction": self.good,
            "cold_start_s": 0.0 if cold is None else round(cold.duration(run_end), 1),
            "worst_change_lag_s": round(max(lags, default=0.0), 1),
            "bad_time_share": round(
                sum(e.duration(run_end) for e in self.episodes) / max(run_end, 1e-9), 4
            ),
            "episodes": [
                {
                    "start": e.start,
                    "end": e.end,
                    "duration_s": round(e.duration(run_end), 1),
                    "worst": round(e.worst, 4),
                    "cold_start": e is cold,
                }
                for e in self.episodes
            ],
        }
