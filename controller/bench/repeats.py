"""One level measured several times (`specctl bench --repeats N`): its figures and their spread.

Each repeat is a whole level (warm-up, measured window, drain) run back to back with the others
at the same depth and load. The level's figure is the mean of the repeats' figures (tok/s, each
latency's mean and percentiles, the server's step time, ...), and its 95% confidence interval is
Student's t across the repeats: mean ± t(0.975, N-1) · s / √N, with s the repeats' sample
standard deviation. It says how far the figure moves from one window to the next on this server
(drift, the batch's phase, the client), which one window's percentiles cannot; it assumes the
repeats are independent draws, which back-to-back windows on a steady server roughly are.
Counts (requests, errors, forward passes, evictions) are summed, and a flag holds where any
repeat raised it, except `too_short`, which holds where no repeat finished a request.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import fields, replace
from typing import Any, TypeVar

from scipy import stats

# A level's result (controller.bench.sweep.LevelResult, which imports this module).
R = TypeVar("R")

# Figures whose interval is reported (the others are averaged without one).
CI_FIELDS = (
    "output_tok_per_s", "input_tok_per_s", "total_tok_per_s", "request_per_s",
    "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "itl_p50_ms", "itl_p99_ms",
    "e2e_p50_ms", "e2e_p99_ms", "goodput_req_per_s", "mean_batch", "accept_length", "step_ms",
)  # fmt: skip
_SUMMED = {"requests", "errors", "prefill_passes", "decode_passes", "evictions", "elapsed_s",
           "warmup_s"}  # fmt: skip
_MAXED = {"concurrency", "client_processes", "output_tokens_max", "window_end_unix"}
_MINNED = {"output_tokens_min", "window_start_unix"}
_ANY = {"foreign_traffic", "client_bound", "drain_timed_out"}
_FIRST = {"series", "depth", "request_rate", "burstiness", "prompt_offset"}


def ci95_half_width(values: Sequence[float]) -> float | None:
    """The 95% confidence interval's half-width of the mean of `values` (Student's t), or None
    with fewer than two."""
    if len(values) < 2:
        return None
    s = statistics.stdev(values)
    return float(stats.t.ppf(0.975, len(values) - 1)) * s / math.sqrt(len(values))


def _mean(values: Sequence[Any]) -> Any:
    known = [v for v in values if v is not None]
    if not known:
        return None
    if all(isinstance(v, bool) for v in known):
        return all(known)
    if all(isinstance(v, int) for v in known):
        return round(statistics.fmean(known))
    return statistics.fmean(known)


def _merge_latency(
    repeats: Sequence[Any],
) -> tuple[dict[str, dict[str, float | None]], dict[str, float]]:
    merged: dict[str, dict[str, float | None]] = {}
    ci: dict[str, float] = {}
    for metric, stats_ms in repeats[0].latency_ms.items():
        merged[metric] = {}
        for key in stats_ms:
            values = [
                v for r in repeats if (v := r.latency_ms.get(metric, {}).get(key)) is not None
            ]
            merged[metric][key] = statistics.fmean(values) if values else None
            half = ci95_half_width(values) if len(values) == len(repeats) else None
            if half is not None:
                ci[f"{metric}.{key}"] = half
    return merged, ci


def merge(repeats: Sequence[R]) -> R:
    """One level (a LevelResult) from its repeats (one repeat: itself)."""
    if not repeats:
        raise ValueError("no repeats to merge")
    if len(repeats) == 1:
        return repeats[0]
    values: dict[str, Any] = {}
    for f in fields(repeats[0]):  # type: ignore[arg-type]
        column = [getattr(r, f.name) for r in repeats]
        if f.name in _FIRST:
            values[f.name] = column[0]
        elif f.name in _SUMMED:
            known = [v for v in column if v is not None]
            values[f.name] = sum(known) if known else None
        elif f.name in _MAXED:
            known = [v for v in column if v is not None]
            values[f.name] = max(known) if known else None
        elif f.name in _MINNED:
            known = [v for v in column if v is not None]
            values[f.name] = min(known) if known else None
        elif f.name in _ANY:
            values[f.name] = any(column)
        elif f.name in ("latency_ms", "ci95", "repeat_tok_per_s", "repeats"):
            continue
        else:
            values[f.name] = _mean(column)
    values["too_short"] = all(getattr(r, "too_short", False) for r in repeats)
    latency, ci = _merge_latency(repeats)
    for name in CI_FIELDS:
        known = [getattr(r, name) for r in repeats]
        if all(v is not None for v in known):
            half = ci95_half_width(known)
            if half is not None:
                ci[name] = half
    return replace(  # type: ignore[type-var]
        repeats[0], **values, latency_ms=latency, ci95=ci, repeats=len(repeats),
        repeat_tok_per_s=tuple(getattr(r, "output_tok_per_s") for r in repeats),  # noqa: B009
    )  # fmt: skip
