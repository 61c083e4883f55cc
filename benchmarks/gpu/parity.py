"""Depth 0 against the plain server over several bench series: is off as fast as no speculation?

    python -m benchmarks.gpu.parity DIR1 DIR2 DIR3 [--series d0] [--json parity.json]

Each DIR is a `specctl bench --depths 0 --no-spec-url PLAIN` result (its bench.json, or the
folder holding it). One 5-10 s level of a closed loop is a noisy sample (streams of equal-length
requests move in waves, and one late admission costs a stream a whole request), so the verdict
is taken on all series together: per concurrency, both servers' output tokens over their
measured seconds summed across series (the pooled ratio), beside each series' own ratio, the
median TPOT p50 of each server, and the levels whose TTFT p99 shows a stall. With three runs
or more, a 90% bootstrap interval of the pooled ratio (the runs resampled) says how far
another set of as many runs could land, and a last line names the levels where the target
ratio lies inside it: there these runs cannot tell which side it is on, and the next line
how many runs in all would, at the runs' spread and the pooled ratio as it is, narrow the
interval enough to tell (it narrows as one over the root of the runs). Where both servers
ran with SGLang's device timer (SGLANG_ENABLE_METRICS_DEVICE_TIMER=1), a second table says where
the time went, pooled the same way: prefill GPU ms per completed request, decode GPU ms per
output token, the share of the window the GPU ran nothing, and the mean running requests.
A last table goes run by run: in how many runs the series was slower per token, the median of
its TTFT minus the plain server's, and each server's measured ms per forward pass. Beside
it, the spread between runs: each server's lowest and highest ms per forward pass, and the
series' decode forward on its own (the plugin's GPU timer). Where a level's passes spread far
wider than its decode forward, the runs differ in time outside the decode forward (prefill
forwards, host work the overlap scheduler did not hide), not in what speculation-off costs.
With three runs or more timed and counted, a table says what the runs under the target share:
the series' decode forward and its time per pass outside it, in them against the rest, and
the rank correlation of the runs' ratios with it and with the plain server's ms per pass.
Where paired runs of both orders pooled (`specctl bench --paired`, with and without
`--plain-first`), a table splits each level by which server went first at its load, and
weighs the two orders equally (the geometric mean of their pooled ratios): with more runs of
one order than the other, the pooled ratio carries the order's own effect.
A folder without bench.json (a bench cut before it wrote it) is left out, with a note.

`--decode-only` judges benches whose levels admitted nothing inside the window (every request
longer than a level decodes), where no request finishes and so
no TPOT is measured: per level, the pooled tok/s ratio and each run's, both servers' decode
passes per second in the window and SGLang's own inter-token latency (its histogram's mean over
the window), pooled the same way. A level with a prefill pass in its window is refused there.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from scipy.stats import bootstrap, spearmanr

from benchmarks.gpu import bench_file
from controller.bench.report import STALL_FACTOR

PLAIN = "no-spec"
INTERVAL = 0.9  # confidence of the pooled ratio's bootstrap interval over the runs
MIN_RUNS = 3  # fewer runs give no interval worth printing
RESAMPLES = 2000
T = TypeVar("T")


@dataclass(frozen=True)
class Pair:
    """One concurrency: the series' numbers beside the plain server's, over every bench run."""

    concurrency: int
    ratios: list[float]  # per bench run, series tok/s / plain tok/s
    pooled_ratio: float
    tpot_series_ms: float  # median TPOT p50 over the runs
    tpot_plain_ms: float
    tpot_change: float
    stalls_series: int  # levels with TTFT p99 >= STALL_FACTOR x p50
    stalls_plain: int
    # Where the time went (None where some run lacks the device timer): (series, plain).
    time: tuple[TimeSplit, TimeSplit] | None = None
    # The pooled ratio's bootstrap interval over the runs (None with fewer than MIN_RUNS).
    interval: tuple[float, float] | None = None
    # Prefill batches per decode iteration, pooled over the runs that counted them (SGLang's
    # pass counter): (series, plain), None where either server has no count.
    prefills_per_decode: tuple[float, float] | None = None
    # Run by run: in how many the series' TPOT p50 was above the plain server's, the median
    # of its TTFT minus the plain server's (SGLang's own where both have it, else the
    # client's p50), and each server's measured ms per forward pass (prefill batches and
    # decode iterations together), pooled. In paired benches (`--paired`) each run's two
    # levels served the same requests back to back, so these are like-for-like.
    slower_runs: int = 0
    ttft_change_ms: float | None = None
    ms_per_pass: tuple[float, float] | None = None
    # Lowest and highest over the runs: each server's ms per forward pass, (series, plain),
    # and the series' decode forward alone (ms per iteration by the plugin's GPU timer).
    pass_ms_range: tuple[tuple[float, float], tuple[float, float]] | None = None
    decode_ms_range: tuple[float, float] | None = None
    # Paired runs of both orders at this level: per order ("spec-first", "plain-first"), the
    # pooled tok/s ratio, the runs where the series' TPOT p50 was above the plain server's,
    # and the runs. None unless both orders ran here.
    by_order: dict[str, tuple[float, int, int]] | None = None
    # What the runs that lost share (None with fewer than MIN_RUNS runs timed and counted).
    tracks: Tracks | None = None
    # The scheduler's ms evicting from the prefix cache per forward pass, pooled over the runs
    # that recorded SGLang's eviction histogram: (series, plain), None where either has none.
    evict_ms_per_pass: tuple[float, float] | None = None

    @property
    def worst_ratio(self) -> float:
        return min(self.ratios)


@dataclass(frozen=True)
class TimeSplit:
    """One server at one concurrency, pooled over the runs."""

    prefill_ms_per_request: float  # prefill GPU time over completed requests
    decode_ms_per_token: float  # decode-phase GPU time (verify, drafting) over output tokens
    idle_share: float  # of the window, neither prefill nor decode on the GPU
    running: float | None  # mean of SGLang's running-request gauge


@dataclass(frozen=True)
class Tracks:
    """One concurrency, run by run: whether the series' ratio moved with its own decode forward
    (the plugin's GPU timer: GPU time per iteration, idle gaps inside the iteration included)
    or with the plain server's time per forward pass."""

    runs_below: int  # runs whose ratio was under the target
    decode_ms_below: float | None  # the series' mean decode forward ms in those runs
    decode_ms_rest: float | None  # ... and in the runs at or above the target
    # The series' ms per forward pass less its decode forward: prefill forwards and the host
    # work the overlap scheduler did not hide, in the runs under the target and in the rest.
    outside_ms_below: float | None
    outside_ms_rest: float | None
    rho_decode: float | None  # Spearman rank correlation, ratio against the series' decode ms
    rho_plain_pass: float | None  # ... ratio against the plain server's ms per forward pass


def _seconds(rows: Sequence[dict[str, Any]]) -> float:
    return sum(r["elapsed_s"] for r in rows)


def _over_seconds(rows: Sequence[dict[str, Any]], key: str) -> float:
    """A per-second figure times each row's measured seconds, summed: the rows' total."""
    return sum(r[key] * r["elapsed_s"] for r in rows)


def time_split(rows: Sequence[dict[str, Any]]) -> TimeSplit | None:
    """None unless every row has the device timer's figures."""
    keys = ("gpu_prefill_busy", "gpu_decode_busy")
    if not rows or not all(isinstance(r.get(k), int | float) for r in rows for k in keys):
        return None
    seconds = _seconds(rows)
    prefill_s = _over_seconds(rows, "gpu_prefill_busy")
    decode_s = _over_seconds(rows, "gpu_decode_busy")
    tokens = _over_seconds(rows, "output_tok_per_s")
    requests = sum(int(r.get("requests") or 0) for r in rows)
    running = [r for r in rows if isinstance(r.get("running_mean"), int | float)]
    return TimeSplit(
        prefill_ms_per_request=round(1000.0 * prefill_s / requests, 3) if requests else 0.0,
        decode_ms_per_token=round(1000.0 * decode_s / tokens, 4) if tokens else 0.0,
        idle_share=round(max(0.0, 1.0 - (prefill_s + decode_s) / seconds), 4),
        running=round(_over_seconds(running, "running_mean") / _seconds(running), 2)
        if running else None,
    )  # fmt: skip


class ParityError(ValueError):
    """A bench file that cannot be compared; the message names the file and the fix."""


def _load(path: Path) -> Any:
    return bench_file.read(path, ParityError)


def paired_order(data: Any) -> str | None:
    """"spec-first" or "plain-first" for a paired bench's bench.json, None otherwise. Paired
    benches before `--plain-first` existed ran the speculative server first."""
    if not isinstance(data, dict) or not data.get("paired"):
        return None
    order = data.get("paired_order")
    return order if isinstance(order, str) else "spec-first"


def _rows(path: Path, measured_only: bool = True, data: Any = None) -> list[dict[str, Any]]:
    """The closed-loop levels of `path`'s bench.json (`data`, when it is already read)."""
    return [
        r
        for r in bench_file.level_rows(path, data, ParityError)
        if r.get("request_rate") is None and (_measured(r) or not measured_only)
    ]


def _measured(row: dict[str, Any]) -> bool:
    """A level with tok/s and TPOT (a window too short to finish a request has no TPOT)."""
    keys = ("output_tok_per_s", "elapsed_s", "tpot_p50_ms")
    return not row.get("too_short") and all(isinstance(row.get(k), int | float) for k in keys)


def _pooled_tok_s(rows: list[dict[str, Any]]) -> float:
    """Output tokens over measured seconds, summed across runs."""
    return _over_seconds(rows, "output_tok_per_s") / _seconds(rows)


def pooled_interval(got: Sequence[tuple[dict[str, Any], dict[str, Any]]]
                    ) -> tuple[float, float] | None:
    """The pooled ratio's INTERVAL bootstrap interval, the runs resampled with replacement
    (percentile method, a fixed seed): how far another set of as many runs could land."""
    if len(got) < MIN_RUNS:
        return None

    def pooled(idx: np.ndarray) -> float:
        pick = [got[int(i)] for i in idx]
        return _pooled_tok_s([s for s, _ in pick]) / _pooled_tok_s([p for _, p in pick])

    found = bootstrap(
        (np.arange(len(got)),), pooled, vectorized=False, n_resamples=RESAMPLES,
        confidence_level=INTERVAL, method="percentile", random_state=np.random.default_rng(0),
    )  # fmt: skip
    low, high = found.confidence_interval
    return round(float(low), 4), round(float(high), 4)


def _stalled(row: dict[str, Any]) -> bool:
    p50, p99 = row.get("ttft_p50_ms"), row.get("ttft_p99_ms")
    return bool(p50 and p99 and p99 >= STALL_FACTOR * p50)


def _rank_correlation(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Spearman's rho, None where either side does not vary (no ranking to compare)."""
    if len(set(a)) < 2 or len(set(b)) < 2:
        return None
    return round(float(spearmanr(a, b).statistic), 2)


def _mean(values: Sequence[float]) -> float | None:
    return round(statistics.fmean(values), 3) if values else None


def tracks_of(got: Sequence[tuple[dict[str, Any], dict[str, Any]]], min_ratio: float
           ) -> Tracks | None:
    """Run by run, the ratio beside the series' decode forward and the plain server's ms per
    pass (None unless MIN_RUNS runs or more have both)."""
    rows = []
    for s, p in got:
        decode, own_pass, plain_pass = s.get("step_ms"), _ms_per_pass([s]), _ms_per_pass([p])
        if isinstance(decode, int | float) and decode > 0 and own_pass is not None \
                and plain_pass is not None:
            rows.append((s["output_tok_per_s"] / p["output_tok_per_s"], float(decode),
                         plain_pass, own_pass - float(decode)))  # fmt: skip
    if len(rows) < MIN_RUNS:
        return None
    ratios, decode, plain, outside = ([r[i] for r in rows] for i in range(4))

    def split(values: list[float], below: bool) -> float | None:
        return _mean([v for r, v in zip(ratios, values, strict=True)
                      if (r < min_ratio) == below])  # fmt: skip

    return Tracks(
        runs_below=sum(r < min_ratio for r in ratios),
        decode_ms_below=split(decode, True), decode_ms_rest=split(decode, False),
        outside_ms_below=split(outside, True), outside_ms_rest=split(outside, False),
        rho_decode=_rank_correlation(ratios, decode),
        rho_plain_pass=_rank_correlation(ratios, plain),
    )


Row = dict[str, Any]


def _paired_levels(runs: Sequence[dict[tuple[str, int], Row]], series: str
                   ) -> list[tuple[int, list[tuple[Row, Row]]]]:
    """Per concurrency either server measured beside the other in some run: the (series, plain)
    rows of every run that has both."""
    levels = sorted({c for by in runs for s, c in by if s == series and (PLAIN, c) in by})
    return [(c, [(by[(series, c)], by[(PLAIN, c)]) for by in runs
                 if (series, c) in by and (PLAIN, c) in by]) for c in levels]  # fmt: skip


def compare_runs(paths: Sequence[Path], series: str = "d0", min_ratio: float = 0.98
                 ) -> list[Pair]:
    """Per concurrency, pooled over the runs that measured it for both the series and the
    plain server (a level too short to finish a request in a run leaves that run out of it),
    so benches of different level sets (1-16 streams, then long 64-128) pool together."""
    runs = []
    orders = []
    for path in paths:
        data = _load(path)
        orders.append(paired_order(data))
        rows = _rows(path, data=data)
        by = {(str(r.get("series")), int(r.get("concurrency") or 0)): r for r in rows}
        if not any(s == PLAIN for s, _ in by):
            raise ParityError(f"{path}: no plain-server series; bench with --no-spec-url PLAIN")
        if not any(s == series for s, _ in by):
            raise ParityError(f"{path}: no series {series!r}; bench with --depths 0")
        runs.append(by)
    pairs = []
    for c, got in _paired_levels(runs, series):
        ordered = [(order, by[(series, c)], by[(PLAIN, c)])
                   for by, order in zip(runs, orders, strict=True)
                   if order is not None and (series, c) in by and (PLAIN, c) in by]
        series_rows, plain_rows = [s for s, _ in got], [p for _, p in got]
        ratios = [s["output_tok_per_s"] / p["output_tok_per_s"] for s, p in got]
        pooled = _pooled_tok_s(series_rows) / _pooled_tok_s(plain_rows)
        tpot_s = statistics.median(s["tpot_p50_ms"] for s in series_rows)
        tpot_p = statistics.median(p["tpot_p50_ms"] for p in plain_rows)
        pairs.append(Pair(
            concurrency=c, ratios=[round(r, 4) for r in ratios],
            pooled_ratio=round(pooled, 4), tpot_series_ms=tpot_s, tpot_plain_ms=tpot_p,
            tpot_change=round(tpot_s / tpot_p - 1.0, 4),
            stalls_series=sum(_stalled(s) for s, _ in got),
            stalls_plain=sum(_stalled(p) for _, p in got),
            time=_both(time_split, series_rows, plain_rows),
            interval=pooled_interval(got),
            prefills_per_decode=_both(_per_decode, series_rows, plain_rows),
            slower_runs=sum(s["tpot_p50_ms"] > p["tpot_p50_ms"] for s, p in got),
            ttft_change_ms=_ttft_change(got),
            ms_per_pass=_both(_ms_per_pass, series_rows, plain_rows),
            pass_ms_range=_both(_pass_ms_range, series_rows, plain_rows),
            decode_ms_range=_range([r.get("step_ms") for r in series_rows]),
            by_order=_by_order(ordered),
            tracks=tracks_of(got, min_ratio),
            evict_ms_per_pass=_both(_evict_ms_per_pass, series_rows, plain_rows),
        ))  # fmt: skip
    if not pairs:
        raise ParityError("no concurrency level is measured for both servers in any run")
    return pairs


def _counted(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows with SGLang's pass counts (benches since the tenth run)."""
    return [r for r in rows if r.get("prefill_passes") is not None and r.get("decode_passes")]


def _per_decode(rows: list[dict[str, Any]]) -> float | None:
    counted = _counted(rows)
    if not counted:
        return None
    return round(
        sum(r["prefill_passes"] for r in counted) / sum(r["decode_passes"] for r in counted), 4
    )


def _evict_ms_per_pass(rows: list[dict[str, Any]]) -> float | None:
    """Eviction ms over forward passes (prefill batches and decode iterations), pooled over
    the rows that have both (benches that record SGLang's eviction histogram)."""
    timed = [r for r in _counted(rows) if r.get("evict_ms") is not None]
    passes = sum(r["prefill_passes"] + r["decode_passes"] for r in timed)
    return round(sum(r["evict_ms"] for r in timed) / passes, 4) if passes else None


def _both(
    measure: Callable[[list[dict[str, Any]]], T | None],
    series: list[dict[str, Any]],
    plain: list[dict[str, Any]],
) -> tuple[T, T] | None:
    """`measure` of each server's rows, or None where either has none."""
    a, b = measure(series), measure(plain)
    return None if a is None or b is None else (a, b)


def _ttft_ms(row: dict[str, Any], key: str) -> float | None:
    value = row.get(key)
    return float(value) if isinstance(value, int | float) else None


def _ttft_change(got: Sequence[tuple[dict[str, Any], dict[str, Any]]]) -> float | None:
    """Median over the runs of the series' TTFT minus the plain server's, in ms."""
    diffs = []
    for s, p in got:
        for key in ("server_ttft_ms", "ttft_p50_ms"):
            a, b = _ttft_ms(s, key), _ttft_ms(p, key)
            if a is not None and b is not None:
                diffs.append(a - b)
                break
    return round(statistics.median(diffs), 2) if diffs else None


def _ms_per_pass(rows: list[dict[str, Any]]) -> float | None:
    counted = _counted(rows)
    if not counted:
        return None
    passes = sum(r["prefill_passes"] + r["decode_passes"] for r in counted)
    return round(1000.0 * _seconds(counted) / passes, 3)


def _range(values: Sequence[Any]) -> tuple[float, float] | None:
    numbers = [float(v) for v in values if isinstance(v, int | float) and v > 0]
    return (round(min(numbers), 3), round(max(numbers), 3)) if numbers else None


def _pass_ms_range(rows: list[dict[str, Any]]) -> tuple[float, float] | None:
    return _range([_ms_per_pass([r]) for r in rows])


def run_by_run_table(pairs: Sequence[Pair], series: str) -> str:
    """Per level: how often the series was slower per token, its TTFT against the plain
    server's, and each server's time per forward pass. A per-token cost shows as slower in
    every run; a server that admits requests more slowly as a longer TTFT and, where
    requests decode beside the admissions, a longer time per pass."""
    lines = [
        f"run by run ({series} against plain)",
        f"{'conc':>5} {'TPOT above plain':>17} {'TTFT change':>12} {'ms per forward pass':>22}",
    ]
    for p in pairs:
        measured = len(p.ratios)
        ttft = "-" if p.ttft_change_ms is None else f"{p.ttft_change_ms:+.1f} ms"
        per_pass = "-" if p.ms_per_pass is None else (
            f"{p.ms_per_pass[0]:.3f} / {p.ms_per_pass[1]:.3f}")
        lines.append(f"{p.concurrency:>5} {f'{p.slower_runs} of {measured}':>17} {ttft:>12} "
                     f"{per_pass:>22}")
    return "\n".join(lines)


def tracks_table(pairs: Sequence[Pair], series: str, min_ratio: float) -> str | None:
    """Per level: the series' decode forward and its time per pass outside it, in the runs
    under the target against the rest, and the ratio's rank correlation with the decode
    forward and with the plain server's ms per pass. A ratio that falls as the series' own
    decode forward grows (rho near -1) lost inside the series' iterations (a slower GPU, or
    the host launching late inside them); one that rises with the plain server's ms per pass
    lost to the plain server's good runs."""
    rows = [p for p in pairs if p.tracks is not None]
    if not rows:
        return None

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    def rho(value: float | None) -> str:
        return "-" if value is None else f"{value:+.2f}"

    lines = [
        f"what the runs under {min_ratio:g} share: {series}'s decode forward ms (GPU timer) and "
        f"its ms per pass outside it, in them / in the rest; the ratio's rank correlation with "
        f"the decode forward and with the plain server's ms per pass",
        f"{'conc':>5} {'runs under':>11} {'decode forward ms':>18} {'outside it ms':>14} "
        f"{'rho decode':>11} {'rho plain pass':>15}",
    ]
    for p in rows:
        t = p.tracks
        assert t is not None
        lines.append(f"{p.concurrency:>5} {f'{t.runs_below} of {len(p.ratios)}':>11} "
                     f"{ms(t.decode_ms_below) + ' / ' + ms(t.decode_ms_rest):>18} "
                     f"{ms(t.outside_ms_below) + ' / ' + ms(t.outside_ms_rest):>14} "
                     f"{rho(t.rho_decode):>11} {rho(t.rho_plain_pass):>15}")
    return "\n".join(lines)


ORDERS = ("spec-first", "plain-first")


def _by_order(
    ordered: Sequence[tuple[str, dict[str, Any], dict[str, Any]]],
) -> dict[str, tuple[float, int, int]] | None:
    out = {}
    for order in ORDERS:
        got = [(s, p) for o, s, p in ordered if o == order]
        if not got:
            return None
        ratio = _pooled_tok_s([s for s, _ in got]) / _pooled_tok_s([p for _, p in got])
        slower = sum(s["tpot_p50_ms"] > p["tpot_p50_ms"] for s, p in got)
        out[order] = (round(ratio, 4), slower, len(got))
    return out


def balanced_ratio(by_order: dict[str, tuple[float, int, int]]) -> float:
    """The two orders' pooled ratios weighed equally (their geometric mean): what the pooled
    ratio would be with as many runs of each order, where going first helps either server."""
    return round(math.prod(by_order[o][0] for o in ORDERS) ** (1 / len(ORDERS)), 4)


def order_table(pairs: Sequence[Pair], series: str) -> str | None:
    """Per level with paired runs of both orders: the pooled ratio and the runs where the
    series was slower per token, with it first and with the plain server first, and both
    orders weighed equally. A gap that follows the order is the bench's; one that stays is
    the servers'."""
    both = [p for p in pairs if p.by_order is not None]
    if not both:
        return None
    lines = [
        f"by order within each paired load: pooled tok/s ratio ({series} slower per token in)",
        f"{'conc':>5} {series + ' first':>22} {'plain first':>22} {'orders equal':>13}",
    ]
    for p in both:
        assert p.by_order is not None
        cells = [f"{r:.3f} ({slower} of {n})" for r, slower, n in
                 (p.by_order[o] for o in ORDERS)]  # fmt: skip
        lines.append(f"{p.concurrency:>5} {cells[0]:>22} {cells[1]:>22} "
                     f"{balanced_ratio(p.by_order):>13.3f}")
    return "\n".join(lines)


def spread_table(pairs: Sequence[Pair], series: str) -> str | None:
    """Per level, lowest-highest over the runs of each server's ms per forward pass and of the
    series' decode forward (None unless some level has pass counts from two runs or more)."""
    spread = [p for p in pairs if p.pass_ms_range is not None and len(p.ratios) > 1]
    if not spread:
        return None
    lines = [
        f"spread between runs, lowest-highest ({series} / plain)",
        f"{'conc':>5} {'ms per forward pass':>27} {series + ' decode forward ms':>22}",
    ]
    for p in spread:
        assert p.pass_ms_range is not None
        (a_lo, a_hi), (b_lo, b_hi) = p.pass_ms_range
        passes = f"{a_lo:.2f}-{a_hi:.2f} / {b_lo:.2f}-{b_hi:.2f}"
        decode = "-" if p.decode_ms_range is None else (
            f"{p.decode_ms_range[0]:.2f}-{p.decode_ms_range[1]:.2f}")
        lines.append(f"{p.concurrency:>5} {passes:>27} {decode:>22}")
    return "\n".join(lines)


def passes_line(pairs: Sequence[Pair], series: str) -> str | None:
    """Prefill batches per decode iteration, per concurrency (None when no run counted them):
    at high load, what lifts TPOT above the decode iteration on each server."""
    counted = [(p.concurrency, p.prefills_per_decode) for p in pairs if p.prefills_per_decode]
    if not counted:
        return None
    levels = ", ".join(f"c={c} {a:.2f} / {b:.2f}" for c, (a, b) in counted)
    return f"prefill batches per decode iteration ({series} / plain): {levels}"


def evictions_line(pairs: Sequence[Pair], series: str) -> str | None:
    """The scheduler's ms a pass evicting cached prefixes, per concurrency (None when no run
    recorded it): host work that grows with what earlier levels left in the cache."""
    timed = [(p.concurrency, p.evict_ms_per_pass) for p in pairs if p.evict_ms_per_pass]
    if not timed:
        return None
    levels = ", ".join(f"c={c} {a:.3f} / {b:.3f}" for c, (a, b) in timed)
    return f"prefix-cache eviction ms per forward pass ({series} / plain): {levels}"


def time_table(pairs: Sequence[Pair], series: str) -> str | None:
    """Where the time went, per concurrency (None when no level has the device timer)."""
    timed = [(p.concurrency, p.time) for p in pairs if p.time is not None]
    if not timed:
        return None
    lines = [
        f"where the time went (SGLang's device timer; {series} / plain)",
        f"{'conc':>5} {'prefill ms/req':>16} {'decode ms/token':>17} {'GPU idle':>13} "
        f"{'running':>13}",
    ]
    for concurrency, (a, b) in timed:
        prefill = f"{a.prefill_ms_per_request:>7.2f} / {b.prefill_ms_per_request:<6.2f}"
        lines.append(
            f"{concurrency:>5} {prefill} "
            f"{a.decode_ms_per_token:>8.4f} / {b.decode_ms_per_token:<6.4f} "
            f"{a.idle_share:>5.1%} / {b.idle_share:<5.1%} {_running(a):>6} / {_running(b):<6}"
        )
    return "\n".join(lines)


def _running(split: TimeSplit) -> str:
    return "-" if split.running is None else f"{split.running:.1f}"


def left_out(paths: Sequence[Path], pairs: Sequence[Pair]) -> list[int]:
    """Levels some run swept that are not compared (too short, or one server only, in every
    run that swept them)."""
    swept = {int(r.get("concurrency") or 0) for p in paths for r in _rows(p, measured_only=False)}
    return sorted(swept - {p.concurrency for p in pairs} - {0})


def report(
    pairs: Sequence[Pair], runs: int, series: str, min_ratio: float, tpot_within: float
) -> str:
    lines = [
        f"{series} against the plain server over {runs} bench runs, each level pooled over "
        f"the runs that measured it (stall: TTFT p99 >= {STALL_FACTOR:g} x p50)",
        f"{'conc':>5} {'pooled':>7} {f'{INTERVAL:.0%} interval':>13} {'per run':<24} "
        f"{'TPOT ' + series:>10} {'TPOT plain':>10} {'change':>7} {'stalls':>7}",
    ]
    for p in pairs:
        per_run = " ".join(f"{r:.3f}" for r in p.ratios)
        interval = "-" if p.interval is None else f"{p.interval[0]:.3f}-{p.interval[1]:.3f}"
        lines.append(
            f"{p.concurrency:>5} {p.pooled_ratio:>7.3f} {interval:>13} {per_run:<24} "
            f"{p.tpot_series_ms:>10.3f} {p.tpot_plain_ms:>10.3f} {p.tpot_change:>+7.1%} "
            f"{p.stalls_series:>3}/{p.stalls_plain:<3}"
        )
    # Off must not cost per token; the two-sided check also flags a plain server that was
    # slower, which at high load is as often its own spread between benches as anything else.
    checks = (
        (f"pooled tok/s >= {min_ratio:g} of plain", lambda p: p.pooled_ratio < min_ratio),
        (f"median TPOT p50 within {tpot_within:.0%} of plain",
         lambda p: abs(p.tpot_change) > tpot_within),
        (f"median TPOT p50 at most {tpot_within:.0%} above plain",
         lambda p: p.tpot_change > tpot_within),
    )  # fmt: skip
    for label, misses in checks:
        failed = [p.concurrency for p in pairs if misses(p)]
        verdict = "yes" if not failed else f"no (c={', '.join(map(str, failed))})"
        lines.append(f"{label} at every level: {verdict}")
    unsure = [p.concurrency for p in pairs
              if p.interval is not None and p.interval[0] < min_ratio <= p.interval[1]]  # fmt: skip
    if unsure:
        lines.append(
            f"{min_ratio:g} lies inside the pooled ratio's {INTERVAL:.0%} interval at "
            f"c={', '.join(map(str, unsure))}: these runs cannot tell which side it is on"
        )
        needs = [(p.concurrency, runs_to_resolve(p, min_ratio)) for p in pairs
                 if p.concurrency in unsure]  # fmt: skip
        lines.append(
            "runs in all that would, at this spread, put it outside the interval: "
            + ", ".join(f"c={c} {'~' + str(n) if n is not None else 'too close to call'}"
                        for c, n in needs))
    return "\n".join(lines)


def runs_to_resolve(pair: Pair, target: float) -> int | None:
    """About how many runs in all would put `target` outside the pooled ratio's interval, if
    the runs kept their spread and the pooled ratio its value: the interval narrows as one
    over the root of the runs. None where the ratio is within 0.002 of the target."""
    if pair.interval is None:
        return None
    gap = abs(pair.pooled_ratio - target)
    if gap < 0.002:
        return None
    half = (pair.interval[1] - pair.interval[0]) / 2
    return max(len(pair.ratios) + 1, math.ceil(len(pair.ratios) * (half / gap) ** 2))


@dataclass(frozen=True)
class DecodeOnlyPair:
    """One concurrency of decode-only benches: the series beside the plain server."""

    concurrency: int
    ratios: list[float]
    pooled_ratio: float
    interval: tuple[float, float] | None
    passes_per_s: tuple[float, float]  # decode passes a second in the window (series, plain)
    itl_ms: tuple[float | None, float | None]  # SGLang's own inter-token latency, mean


def _decode_only_rows(path: Path) -> dict[tuple[str, int], dict[str, Any]]:
    rows = _rows(path, measured_only=False)
    out = {}
    for r in rows:
        if not all(isinstance(r.get(k), int | float) for k in ("output_tok_per_s", "elapsed_s")):
            continue
        if r.get("prefill_passes") != 0 or not r.get("decode_passes"):
            raise ParityError(
                f"{path}: {r.get('series')} at c={r.get('concurrency')} ran "
                f"{r.get('prefill_passes')} prefill passes in its window: not decode-only "
                f"(give every request more tokens than a level decodes, or drop --decode-only)")
        out[(str(r.get("series")), int(r.get("concurrency") or 0))] = r
    return out


def _mean_itl(rows: list[dict[str, Any]]) -> float | None:
    got = [(r["server_itl_ms"], r["elapsed_s"]) for r in rows
           if isinstance(r.get("server_itl_ms"), int | float)]  # fmt: skip
    return round(sum(v * w for v, w in got) / sum(w for _, w in got), 3) if got else None


def compare_decode_only(paths: Sequence[Path], series: str = "d0") -> list[DecodeOnlyPair]:
    levels = _paired_levels([_decode_only_rows(p) for p in paths], series)
    if not levels:
        raise ParityError("no decode-only level measured for both servers in any run")
    pairs = []
    for c, got in levels:
        own, plain = [s for s, _ in got], [p for _, p in got]
        pairs.append(DecodeOnlyPair(
            concurrency=c,
            ratios=[round(s["output_tok_per_s"] / p["output_tok_per_s"], 4) for s, p in got],
            pooled_ratio=round(_pooled_tok_s(own) / _pooled_tok_s(plain), 4),
            interval=pooled_interval(got),
            passes_per_s=tuple(  # type: ignore[arg-type]
                round(sum(r["decode_passes"] for r in rows) / _seconds(rows), 1)
                for rows in (own, plain)),
            itl_ms=(_mean_itl(own), _mean_itl(plain)),
        ))  # fmt: skip
    return pairs


def decode_only_report(pairs: Sequence[DecodeOnlyPair], runs: int, series: str,
                       min_ratio: float) -> str:
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    lines = [
        f"{series} against the plain server, decode-only levels (no admission in the window), "
        f"over {runs} bench runs",
        f"{'conc':>5} {'pooled':>7} {f'{INTERVAL:.0%} interval':>13} {'per run':<20} "
        f"{'passes/s ' + series + ' / plain':>24} {'ITL ms ' + series + ' / plain':>22}",
    ]
    for p in pairs:
        interval = "-" if p.interval is None else f"{p.interval[0]:.3f}-{p.interval[1]:.3f}"
        lines.append(
            f"{p.concurrency:>5} {p.pooled_ratio:>7.3f} {interval:>13} "
            f"{' '.join(f'{r:.3f}' for r in p.ratios):<20} "
            f"{f'{p.passes_per_s[0]:.1f} / {p.passes_per_s[1]:.1f}':>24} "
            f"{ms(p.itl_ms[0]) + ' / ' + ms(p.itl_ms[1]):>22}")
    failed = [p.concurrency for p in pairs if p.pooled_ratio < min_ratio]
    lines.append(f"pooled tok/s >= {min_ratio:g} of plain at every level: "
                 + ("yes" if not failed else f"no (c={', '.join(map(str, failed))})"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu.parity", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("runs", nargs="+", type=Path, help="bench.json files or their folders")
    ap.add_argument("--series", default="d0", help="the speculative server's series (d0)")
    ap.add_argument("--min-ratio", type=float, default=0.98, help="tok/s share to meet (0.98)")
    ap.add_argument("--tpot-within", type=float, default=0.03, help="TPOT p50 change (0.03)")
    ap.add_argument("--json", type=Path, help="also write the comparison as one JSON object")
    ap.add_argument("--decode-only", action="store_true",
                    help="benches whose windows admitted nothing (see above)")
    args = ap.parse_args(argv)
    cut = [p for p in args.runs if p.is_dir() and not (p / "bench.json").exists()]
    for path in cut:
        print(f"left out {path}: no bench.json (its bench was cut before it wrote one)",
              file=sys.stderr)
    args.runs = [p for p in args.runs if p not in cut]
    try:
        if not args.runs:
            raise ParityError("no bench.json in any folder given")
        if args.decode_only:
            decode_pairs = compare_decode_only(args.runs, args.series)
        else:
            pairs = compare_runs(args.runs, args.series, args.min_ratio)
    except ParityError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.decode_only:
        print(decode_only_report(decode_pairs, len(args.runs), args.series, args.min_ratio))
        if args.json:
            args.json.write_text(json.dumps({
                "runs": [str(p) for p in args.runs], "series": args.series, "decode_only": True,
                "min_ratio": args.min_ratio, "levels": [asdict(p) for p in decode_pairs],
            }, indent=2) + "\n")  # fmt: skip
        return 0
    print(report(pairs, len(args.runs), args.series, args.min_ratio, args.tpot_within))
    for extra in (time_table(pairs, args.series), passes_line(pairs, args.series),
                  evictions_line(pairs, args.series),
                  run_by_run_table(pairs, args.series), spread_table(pairs, args.series),
                  order_table(pairs, args.series),
                  tracks_table(pairs, args.series, args.min_ratio)):
        if extra is not None:
            print(extra)
    missing = left_out(args.runs, pairs)
    if missing:
        print(f"left out (too short to finish a request, or one server only, wherever swept): "
              f"c={missing}")
    if args.json:
        args.json.write_text(json.dumps({
            "runs": [str(p) for p in args.runs], "series": args.series,
            "min_ratio": args.min_ratio, "tpot_within": args.tpot_within,
            "levels": [{**asdict(p), "worst_ratio": p.worst_ratio,
                        "orders_equal_ratio": None if p.by_order is None
                        else balanced_ratio(p.by_order)} for p in pairs],
            "left_out": missing, "cut": [str(p) for p in cut],
        }, indent=2) + "\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
