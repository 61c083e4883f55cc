"""Latency percentiles of a level, their mean and spread, and goodput under a latency SLO.

Each level reports, for TTFT, TPOT (per request: time per output token after the first), ITL
(every gap between streamed chunks that carried tokens) and E2E latency, the mean, the standard
deviation (of the population, as `sglang.bench_serving` prints it) and the percentiles asked
for (`--percentiles`, default 50, 90, 95, 99; linear between the nearest ranks, so a percentile
never leaves the range measured), over the requests that started in the measured window and
completed in it.

The SLO keys are those of `sglang.bench_serving --goodput` and `vllm bench serve --goodput`:
`ttft`, `tpot` and `e2el` (end-to-end latency), in milliseconds. A request is good when it
completed and met every SLO given; goodput is good requests per second of the window, and
attainment the share of the window's finished requests (completed or failed) that were good.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from controller.bench.loadgen import RequestResult

SLO_KEYS = ("ttft", "tpot", "e2el")


class SloError(ValueError):
    """An SLO string is malformed; the message names the part and the fix."""


@dataclass(frozen=True)
class Slo:
    """Latency bounds in milliseconds; None: not part of the SLO."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None

    def describe(self) -> str:
        parts = [
            f"{key}:{value:g}"
            for key, value in zip(SLO_KEYS, (self.ttft_ms, self.tpot_ms, self.e2el_ms), strict=True)
            if value is not None
        ]
        return " ".join(parts) + " ms"

    def to_json(self) -> dict[str, float]:
        values = (self.ttft_ms, self.tpot_ms, self.e2el_ms)
        return {k: v for k, v in zip(SLO_KEYS, values, strict=True) if v is not None}

    def met_by(self, r: RequestResult) -> bool:
        if not r.complete or r.error is not None:
            return False
        if self.ttft_ms is not None and (r.ttft_s is None or 1000 * r.ttft_s > self.ttft_ms):
            return False
        # A one-token answer has no time per output token; like bench_serving, it counts as 0.
        tpot = r.tpot_s or 0.0
        if self.tpot_ms is not None and 1000 * tpot > self.tpot_ms:
            return False
        return not (self.e2el_ms is not None and 1000 * r.e2e_s > self.e2el_ms)


def parse_slo(items: Sequence[str]) -> Slo:
    """`["ttft:500", "tpot:50"]` or `["ttft:500,tpot:50"]` -> Slo; SloError names the part."""
    values: dict[str, float] = {}
    for part in (p.strip() for item in items for p in item.replace(" ", ",").split(",")):
        if not part:
            continue
        key, sep, raw = part.partition(":")
        key = key.strip().lower()
        if not sep or key not in SLO_KEYS:
            raise SloError(
                f"{part!r}: expected KEY:MILLISECONDS with KEY one of {', '.join(SLO_KEYS)} "
                "(e.g. ttft:500,tpot:50)"
            )
        try:
            value = float(raw)
        except ValueError:
            raise SloError(f"{part!r}: {raw!r} is not a number of milliseconds") from None
        if not value > 0:
            raise SloError(f"{part!r}: the bound must be > 0 ms")
        if key in values:
            raise SloError(f"{part!r}: {key} is given twice")
        values[key] = value
    if not values:
        raise SloError("no SLO given (e.g. ttft:500,tpot:50)")
    return Slo(values.get("ttft"), values.get("tpot"), values.get("e2el"))


def percentile_ms(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0 < q < 100) of seconds, in ms; None without values."""
    if not values:
        return None
    if len(values) == 1:
        return 1000.0 * values[0]
    # Inclusive: a percentile never leaves the range of what was measured.
    return 1000.0 * statistics.quantiles(values, n=100, method="inclusive")[round(q) - 1]


LATENCY_METRICS = ("ttft", "tpot", "itl", "e2e")
DEFAULT_PERCENTILES = (50.0, 90.0, 95.0, 99.0)


def percentile_key(q: float) -> str:
    """50 -> 'p50', 99.9 -> 'p99.9': the key a percentile has in bench.json."""
    return f"p{q:g}"


def summary_ms(values: Sequence[float], percentiles: Sequence[float]) -> dict[str, float | None]:
    """Mean, standard deviation and `percentiles` of seconds, in ms (None without values)."""
    out: dict[str, float | None] = {"mean": None, "std": None}
    out.update({percentile_key(q): None for q in percentiles})
    if not values:
        return out
    data = np.asarray(values, dtype=float) * 1000.0
    out["mean"] = float(data.mean())
    out["std"] = float(data.std())
    for q, v in zip(percentiles, np.percentile(data, list(percentiles)), strict=True):
        out[percentile_key(q)] = float(v)
    return out


def latency_values(done: Sequence[RequestResult]) -> dict[str, list[float]]:
    """The seconds behind each latency metric of `done` (completed requests)."""
    return {
        "ttft": [r.ttft_s for r in done if r.ttft_s is not None],
        "tpot": [t for r in done if (t := r.tpot_s) is not None],
        "itl": [gap for r in done for gap in r.chunk_gaps_s],
        "e2e": [r.e2e_s for r in done],
    }


def latency_summary(
    done: Sequence[RequestResult], percentiles: Sequence[float] = DEFAULT_PERCENTILES
) -> dict[str, dict[str, float | None]]:
    """{metric: {"mean", "std", "p50", ...}} in ms, for TTFT, TPOT, ITL and E2E."""
    return {m: summary_ms(v, percentiles) for m, v in latency_values(done).items()}


def parse_percentiles(text: str) -> tuple[float, ...]:
    """'50,90,99.9' -> (50.0, 90.0, 99.9): sorted, unique, each in (0, 100)."""
    values = []
    for part in (p.strip() for p in text.split(",")):
        try:
            q = float(part)
        except ValueError:
            raise ValueError(f"{part!r} is not a number; write them like 50,90,95,99") from None
        if not (0 < q < 100) or not math.isfinite(q):
            raise ValueError(f"{part} is out of range: percentiles are between 0 and 100")
        values.append(q)
    return tuple(sorted(set(values)))


@dataclass(frozen=True)
class Latencies:
    """p50 / p90 / p99 of a level's completed requests (ms)."""

    ttft: tuple[float | None, float | None, float | None]
    tpot: tuple[float | None, float | None, float | None]
    itl: tuple[float | None, float | None, float | None]
    e2e: tuple[float | None, float | None, float | None]


def _p50_90_99(values: Sequence[float]) -> tuple[float | None, float | None, float | None]:
    return percentile_ms(values, 50), percentile_ms(values, 90), percentile_ms(values, 99)


def latencies(done: Sequence[RequestResult]) -> Latencies:
    ttft = [r.ttft_s for r in done if r.ttft_s is not None]
    tpot = [t for r in done if (t := r.tpot_s) is not None]
    itl = [gap for r in done for gap in r.chunk_gaps_s]
    e2e = [r.e2e_s for r in done]
    return Latencies(_p50_90_99(ttft), _p50_90_99(tpot), _p50_90_99(itl), _p50_90_99(e2e))


@dataclass(frozen=True)
class Goodput:
    req_per_s: float
    attainment: float | None  # None: no request finished in the window


def goodput(slo: Slo, finished: Sequence[RequestResult], window_s: float) -> Goodput:
    good = sum(1 for r in finished if slo.met_by(r))
    return Goodput(
        req_per_s=good / window_s if window_s > 0 else 0.0,
        attainment=good / len(finished) if finished else None,
    )
