"""Levels that several bench files measured with the same protocol: how far the server repeats
itself. A fit cannot be held closer to one bench than that bench is to its repeats, so `specctl
sim fit` prints the spread beside its own error when it is given repeated benches.

Two levels are repeats when they share the series, the concurrency and the request shape: mean
prompt and output tokens within 15% of the first such level's, and outputs of one length or
spread over a range alike.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
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


def find_repeats(levels: Sequence[Level]) -> list[Repeat]:
    """Per level measured by two or more bench files alike, the spread of its figures."""
    groups: list[list[Level]] = []
    for lv in levels:
        if lv.tok_per_s <= 0:
            continue
        home = next((g for g in groups if _same_shape(g[0], lv)), None)
        if home is None:
            groups.append([lv])
        else:
            home.append(lv)
    out = []
    for group in groups:
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


def repeats_line(repeats: Sequence[Repeat]) -> str | None:
    """One line: how far the repeated levels moved between benches, the median and the most."""
    if not repeats:
        return None
    worst = max(repeats, key=lambda r: r.tok_spread)
    median = statistics.median(r.tok_spread for r in repeats)
    return (
        f"the server's own spread over {len(repeats)} levels measured by several benches: "
        f"tok/s highest/lowest median +{100 * median:.1f}%, most +{100 * worst.tok_spread:.1f}% "
        f"({worst.label}, {worst.benches} benches); a fit cannot match every bench closer than "
        "its repeats match each other"
    )
