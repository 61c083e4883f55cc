"""Levels that several bench files measured with the same protocol: how far the server repeats
itself. A fit cannot be held closer to one bench than that bench is to its repeats, so `specctl
sim fit` prints the spread beside its own error when it is given repeated benches, and with
`--pool-repeats` fits and judges each such level as the mean of its repeats.

Two levels are repeats when they share the series, the concurrency and the request shape: mean
prompt and output tokens within 15% of the first such level's, and outputs of one length or
spread over a range alike.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from sims.fit.bench_file import Level

SHAPE_STEP = 1.15  # request shapes in one bucket are within about this ratio
SPREAD_SHARE = 0.25  # outputs spread over more than this share of their mean are "spread"


@dataclass(frozen=True)
class Repeat:
    series: str
    concurrency: int
    benches: int
    tok_spread: float  # highest / lowest tok/s - 1
    tpot_spread: float | None  # the same for TPOT p50

    @property
    def label(self) -> str:
        return f"{self.series} c={self.concurrency}"

    def to_json(self) -> dict[str, Any]:
        return {
            "level": self.label,
            "benches": self.benches,
            "tok_per_s_spread": round(self.tok_spread, 4),
            "tpot_spread": None if self.tpot_spread is None else round(self.tpot_spread, 4),
        }


def _spread_outputs(level: Level) -> bool | None:
    lo, hi, mean = level.output_tokens_min, level.output_tokens_max, level.output_tokens
    if lo is None or hi is None or not mean:
        return None
    return (hi - lo) > SPREAD_SHARE * mean


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None or a <= 0 or b <= 0:
        return a == b
    return max(a, b) / min(a, b) <= SHAPE_STEP


def _same_shape(a: Level, b: Level) -> bool:
    return (
        (a.series, a.concurrency, _spread_outputs(a))
        == (b.series, b.concurrency, _spread_outputs(b))
        and _close(a.prompt_tokens, b.prompt_tokens)
        and _close(a.output_tokens, b.output_tokens)
    )


def _spread(values: Sequence[float]) -> float:
    return max(values) / min(values) - 1.0


def _alike(levels: Sequence[Level]) -> list[list[Level]]:
    """The levels in groups of the same series, concurrency and request shape, in order."""
    groups: list[list[Level]] = []
    for lv in levels:
        home = next((g for g in groups if _same_shape(g[0], lv)), None)
        if home is None:
            groups.append([lv])
        else:
            home.append(lv)
    return groups


def find_repeats(levels: Sequence[Level]) -> list[Repeat]:
    """Per level measured by two or more bench files alike, the spread of its figures."""
    out = []
    for group in _alike([lv for lv in levels if lv.tok_per_s > 0]):
        if len({lv.source for lv in group}) < 2:
            continue
        tpots = [lv.tpot_p50_ms for lv in group if lv.tpot_p50_ms]
        out.append(
            Repeat(
                series=group[0].series,
                concurrency=group[0].concurrency,
                benches=len({lv.source for lv in group}),
                tok_spread=_spread([lv.tok_per_s for lv in group]),
                tpot_spread=_spread(tpots) if len(tpots) > 1 else None,
            )
        )
    return sorted(out, key=lambda r: (r.series, r.concurrency))


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None


def _pooled(group: Sequence[Level]) -> Level:
    """One level for alike levels of several benches: tok/s over their windows together, the
    other figures the mean of those the benches reported."""
    first = group[0]
    seconds = sum(lv.elapsed_s for lv in group)
    mins = [lv.output_tokens_min for lv in group if lv.output_tokens_min is not None]
    maxes = [lv.output_tokens_max for lv in group if lv.output_tokens_max is not None]
    return replace(
        first,
        requests=sum(lv.requests for lv in group),
        errors=sum(lv.errors for lv in group),
        elapsed_s=seconds / len(group),
        tok_per_s=(
            sum(lv.tok_per_s * lv.elapsed_s for lv in group) / seconds
            if seconds > 0
            else statistics.fmean(lv.tok_per_s for lv in group)
        ),
        ttft_p50_ms=_mean([lv.ttft_p50_ms for lv in group]),
        tpot_p50_ms=_mean([lv.tpot_p50_ms for lv in group]),
        step_ms=_mean([lv.step_ms for lv in group]),
        mean_batch=_mean([lv.mean_batch for lv in group]),
        accept_length=_mean([lv.accept_length for lv in group]),
        prompt_tokens=_mean([lv.prompt_tokens for lv in group]),
        output_tokens=_mean([lv.output_tokens for lv in group]),
        foreign_traffic=any(lv.foreign_traffic for lv in group),
        server_ttft_ms=_mean([lv.server_ttft_ms for lv in group]),
        server_itl_ms=_mean([lv.server_itl_ms for lv in group]),
        warmup_s=statistics.fmean(lv.warmup_s for lv in group),
        output_tokens_min=min(mins) if mins else None,
        output_tokens_max=max(maxes) if maxes else None,
        benches=len({lv.source for lv in group}),
        prefills_per_decode=_mean([lv.prefills_per_decode for lv in group]),
    )


def pool_repeats(levels: Sequence[Level]) -> list[Level]:
    """Each level that two or more bench files measured alike replaced by one, their mean (in
    the place of the first, which lends it its file); every other level as it was."""
    pooled = []
    for group in _alike(levels):
        alone = len(group) == 1 or len({lv.source for lv in group}) < 2
        pooled.extend(group if alone else [_pooled(group)])
    return pooled


def repeats_line(repeats: Sequence[Repeat], pooled: bool = False, fitted: bool = True
                 ) -> str | None:
    """One line: how far the repeated levels moved between benches, the median and the most.
    `fitted`: the line is under a fit's replay (else under a replay of a profile as given)."""
    if not repeats:
        return None
    worst = max(repeats, key=lambda r: r.tok_spread)
    median = statistics.median(r.tok_spread for r in repeats)
    if pooled:
        then = ("each was fitted and is judged as the mean of its repeats (--pool-repeats)"
                if fitted else "each is judged as the mean of its repeats (--pool-repeats)")
    else:
        then = ("a fit cannot match every bench closer than its repeats match each other "
                "(--pool-repeats fits and judges their mean)" if fitted else
                "no profile matches every bench closer than its repeats match each other "
                "(--pool-repeats judges their mean)")
    return (
        f"the server's own spread over {len(repeats)} levels measured by several benches: "
        f"tok/s highest/lowest median +{100 * median:.1f}%, most +{100 * worst.tok_spread:.1f}% "
        f"({worst.label}, {worst.benches} benches); {then}"
    )
