"""Latency percentiles of a level, and goodput under a latency SLO.

The SLO keys are those of `sglang.bench_serving --goodput` and `vllm bench serve --goodput`:
`ttft`, `tpot` and `e2el` (end-to-end latency), in milliseconds. A request is good when it
completed and met every SLO given; goodput is good requests per second of the window, and
attainment the share of the window's finished requests (completed or failed) that were good.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

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
