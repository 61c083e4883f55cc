"""What a sweep means: best depth per level, crossovers, the table to push, and files.

Crossovers are interpolated between measured levels (linear in log2 of the concurrency or the
request rate, where the sweep's levels are evenly spaced), and converted to batch sizes with
the mean batch the server's own counters reported at those levels. Batch size and concurrency
differ once the server caps running requests (SGLang's default with speculation is 48), and
the table is keyed by batch size.

Levels flagged too short (no request finished in the window) or with too few requests (fewer
than MIN_LEVEL_REQUESTS), with other traffic on the server, or bound by the client (its
busiest load-generator process at CLIENT_BOUND_SHARE of a core or more) are shown but left out
of every comparison: their numbers are not this load's, or measure how fast the client reads
rather than how fast the server serves.

A load level decides a depth only where it can (`undecided_levels` says why not, one line per
level): every depth of the sweep has a usable measurement there (a sweep stopped part-way
lacks the later depths; a flagged level leaves its depth out), and tok/s ranks the depths. In
an open loop below the server's capacity it does not: every series serves the arrivals, so
its tok/s is the arrival rate's (`LevelResult.kept_up`), and a depth that "wins" by a token or
two wins on noise. Such a level is compared by TPOT instead, in its line, and left out of the
table. Where one depth alone kept up, it decides (the others fell behind the arrivals). With
--repeats, a depth must also beat the one chosen below by more than the two confidence
intervals together.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
import os
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from controller.bench.sweep import (
    MIN_LEVEL_REQUESTS,
    NO_SPEC,
    LevelResult,
    SweepOutcome,
    series_name,
)
from sglang_hooks.contract import PolicyError, PolicyTable, Tier

# A depth change is recommended only where the new depth wins by more than this share: short
# levels are noisy, and a tier that wins by 1% is not worth a boundary the batch can flap on.
MIN_GAIN = 0.02
BEST_SPEC = "best spec"


@dataclass(frozen=True)
class Crossover:
    from_series: str  # wins below the crossover
    to_series: str  # wins above it
    level: float  # concurrency, or request rate in open-loop mode
    batch: float | None
    rate: bool = False  # `level` is a request rate

    @property
    def concurrency(self) -> float:
        return self.level

    def describe(self) -> str:
        at = f"~{self.level:.3g} req/s" if self.rate else f"concurrency ~{self.level:.3g}"
        if self.batch is not None:
            at += f" (batch ~{self.batch:.3g})"
        return f"{self.from_series} -> {self.to_series} at {at}"


def usable(results: Iterable[LevelResult]) -> list[LevelResult]:
    """The levels a recommendation may rest on (not flagged)."""
    return [r for r in results if not r.flags]


def _by_series(results: Iterable[LevelResult]) -> dict[str, dict[float, LevelResult]]:
    out: dict[str, dict[float, LevelResult]] = {}
    for r in results:
        out.setdefault(r.series, {})[r.level] = r
    return out


@dataclass(frozen=True)
class Undecided:
    """A load level that cannot choose a depth, and why (one line)."""

    level: float
    label: str
    reason: str

    def describe(self) -> str:
        return f"{self.label}: {self.reason}"


def _names(depths: Iterable[int]) -> str:
    return ", ".join(series_name(d) for d in sorted(depths))


def _tpot(r: LevelResult) -> str:
    return "-" if r.tpot_p50_ms is None else f"{r.tpot_p50_ms:.1f} ms"


def _arrival_bound(label: str, level: float, kept: list[LevelResult]) -> Undecided:
    """Two depths or more served every arrival: tok/s cannot rank them; TPOT can."""
    kept = sorted(kept, key=lambda r: (r.tpot_p50_ms is None, r.tpot_p50_ms or 0.0, r.depth))
    toks = ", ".join(f"{r.series} {r.output_tok_per_s:.1f}" for r in sorted(kept, key=_depth))
    offered = max(r.offered_tok_per_s or 0.0 for r in kept)
    first, last = kept[0], kept[-1]
    tpots = ", ".join(f"{r.series} {_tpot(r)}" for r in kept)
    if first.tpot_p50_ms is None:
        by_tpot = "no TPOT to compare either"
    elif last.tpot_p50_ms is not None and last.tpot_p50_ms <= first.tpot_p50_ms * (1 + MIN_GAIN):
        by_tpot = f"TPOT p50 does not tell them apart either ({tpots})"
    else:
        by_tpot = f"by TPOT p50 {first.series} serves each request fastest ({tpots})"
    return Undecided(level, label, (
        f"below capacity: every depth served the arrivals (tok/s {toks}; the arrivals asked "
        f"for ~{offered:.1f}), so tok/s follows the arrival rate and ranks nothing; {by_tpot}; "
        "raise --request-rate past the server's capacity or use --concurrency to compare "
        "throughput"
    ))  # fmt: skip


def _depth(r: LevelResult) -> int:
    return -1 if r.depth is None else r.depth


def undecided_levels(
    results: Sequence[LevelResult], depths: Sequence[int] | None = None
) -> list[Undecided]:
    """The levels of the speculative series that cannot choose a depth, in level order.

    `depths` are the depths the sweep was to measure (default: every depth in `results`)."""
    spec = [r for r in results if r.depth is not None]
    expected = set(depths) if depths is not None else {r.depth for r in spec if r.depth is not None}
    by_level: dict[float, list[LevelResult]] = {}
    for r in spec:
        by_level.setdefault(r.level, []).append(r)
    out = []
    for level in sorted(by_level):
        rows = by_level[level]
        label = rows[0].label
        measured = {r.depth for r in rows if r.depth is not None}
        missing = expected - measured
        flagged = [r for r in rows if r.flags]
        if missing:
            ran = _names(measured)
            out.append(Undecided(level, label, (
                f"only {ran} measured ({_names(missing)} missing: the sweep stopped before "
                "them, or they were not asked for at this level); no depth chosen here"
            )))  # fmt: skip
            continue
        if flagged:
            few = [r for r in flagged if r.too_few]
            what = "; ".join(f"{r.series} {', '.join(r.flags)}" for r in flagged)
            advice = (
                f" (at least {MIN_LEVEL_REQUESTS} finished requests per window tell depths "
                "apart: use a longer --duration-per-level or a larger --requests-per-level)"
                if few
                else ""
            )
            out.append(Undecided(level, label, (
                f"{what}: those depths have no usable measurement here, so the depths cannot "
                f"be compared{advice}; no depth chosen here"
            )))  # fmt: skip
            continue
        kept = [r for r in rows if r.kept_up]
        if len(kept) >= 2:
            out.append(_arrival_bound(label, level, kept))
    return out


def _margin(best: LevelResult, current: LevelResult, min_gain: float) -> float:
    """How much tok/s `best` must add to displace `current`: the noise margin, and with
    --repeats also the two confidence intervals together."""
    ci = best.ci95.get("output_tok_per_s", 0.0) + current.ci95.get("output_tok_per_s", 0.0)
    return max(current.output_tok_per_s * min_gain, ci)


def best_depths(
    results: Sequence[LevelResult], min_gain: float = MIN_GAIN, depths: Sequence[int] | None = None
) -> dict[float, int]:
    """Best forced depth per level that can decide (`undecided_levels`); the current depth is
    kept unless beaten by the noise margin (`_margin`). Where one depth alone kept up with an
    open loop's arrivals, it is the best there."""
    skip = {u.level for u in undecided_levels(results, depths)}
    spec = [r for r in usable(results) if r.depth is not None and r.level not in skip]
    by_level: dict[float, list[LevelResult]] = {}
    for r in spec:
        by_level.setdefault(r.level, []).append(r)
    out: dict[float, int] = {}
    current: int | None = None
    for c in sorted(by_level):
        rows = {r.depth: r for r in by_level[c] if r.depth is not None}
        kept = [d for d, r in rows.items() if r.kept_up]
        if len(kept) == 1:
            out[c] = current = kept[0]
            continue
        best = max(rows, key=lambda d: (rows[d].output_tok_per_s, -d))
        if current in rows:
            now = rows[current]
            margin = _margin(rows[best], now, min_gain)
            if rows[best].output_tok_per_s <= now.output_tok_per_s + margin:
                best = current
        out[c] = current = best
    return out


def _interpolate(lo: LevelResult, hi: LevelResult, lo_b: LevelResult, hi_b: LevelResult) -> float:
    """Fraction in [0, 1] of the way from level lo to hi where series a meets series b."""
    d_lo = lo.output_tok_per_s - lo_b.output_tok_per_s
    d_hi = hi.output_tok_per_s - hi_b.output_tok_per_s
    if d_lo == d_hi:
        return 0.5
    return min(max(d_lo / (d_lo - d_hi), 0.0), 1.0)


def _at(frac: float, lo: float, hi: float, log: bool) -> float:
    if log:
        return float(2 ** (math.log2(lo) + frac * (math.log2(hi) - math.log2(lo))))
    return lo + frac * (hi - lo)


def _crossover(
    a: dict[float, LevelResult], b: dict[float, LevelResult], c_lo: float, c_hi: float, to: str
) -> Crossover:
    frac = _interpolate(a[c_lo], a[c_hi], b[c_lo], b[c_hi])
    level = _at(frac, c_lo, c_hi, log=True)
    batches = [r.mean_batch for r in (a[c_lo], b[c_lo], a[c_hi], b[c_hi])]
    batch = None
    if all(x is not None for x in batches):
        b_lo = (batches[0] + batches[1]) / 2  # type: ignore[operator]
        b_hi = (batches[2] + batches[3]) / 2  # type: ignore[operator]
        batch = _at(frac, b_lo, b_hi, log=False)
    first = next(iter(a.values()))
    return Crossover(first.series, to, level, batch, rate=first.request_rate is not None)


def _envelope(
    results: Sequence[LevelResult], min_gain: float, depths: Sequence[int] | None = None
) -> tuple[dict[float, LevelResult], dict[float, LevelResult]]:
    """The best depth's level per level, and the no-spec server's, where both are usable."""
    series = _by_series(usable(results))
    best = best_depths(results, min_gain, depths)
    nospec = series.get(NO_SPEC, {})
    envelope = {c: series[series_name(best[c])][c] for c in sorted(best) if c in nospec}
    return envelope, {c: nospec[c] for c in envelope}


def crossovers(
    results: Sequence[LevelResult], min_gain: float = MIN_GAIN, depths: Sequence[int] | None = None
) -> list[Crossover]:
    """Where the best depth changes, and where no-spec overtakes the best depth (if measured)."""
    series = _by_series(usable(results))
    best = best_depths(results, min_gain, depths)
    cs = sorted(best)
    out = []
    for c_lo, c_hi in itertools.pairwise(cs):
        d_lo, d_hi = best[c_lo], best[c_hi]
        a, b = series[series_name(d_lo)], series[series_name(d_hi)]
        # Interpolating needs both depths at both levels; a level left out (too short) of one
        # series leaves that change of best depth unplaced rather than guessed.
        if d_lo != d_hi and all(c in a and c in b for c in (c_lo, c_hi)):
            out.append(_crossover(a, b, c_lo, c_hi, series_name(d_hi)))
    envelope, nospec = _envelope(results, min_gain, depths)
    ec = sorted(envelope)
    for c_lo, c_hi in itertools.pairwise(ec):
        lo_gap = envelope[c_lo].output_tok_per_s - nospec[c_lo].output_tok_per_s
        hi_gap = envelope[c_hi].output_tok_per_s - nospec[c_hi].output_tok_per_s
        if lo_gap > 0 >= hi_gap:
            env = {c_lo: envelope[c_lo], c_hi: envelope[c_hi]}
            cross = _crossover(env, nospec, c_lo, c_hi, NO_SPEC)
            out.append(Crossover(BEST_SPEC, NO_SPEC, cross.level, cross.batch, cross.rate))
            break
    return out


@dataclass(frozen=True)
class PlainServerWins:
    """The server without speculation beat the best depth at every level both measured."""

    gains: dict[float, float]  # level -> no-spec tok/s / best depth's tok/s - 1
    rate: bool = False

    @property
    def low(self) -> float:
        return min(self.gains.values())

    @property
    def high(self) -> float:
        return max(self.gains.values())

    def describe(self) -> str:
        def at(level: float) -> str:
            return f"{level:g} req/s" if self.rate else f"c={level:g}"

        lo_level = min(self.gains, key=lambda c: self.gains[c])
        hi_level = max(self.gains, key=lambda c: self.gains[c])
        span = (
            f"+{100 * self.low:.0f}%"
            if len(self.gains) == 1 or round(100 * self.low) == round(100 * self.high)
            else f"+{100 * self.low:.0f}% ({at(lo_level)}) to +{100 * self.high:.0f}% "
            f"({at(hi_level)})"
        )
        return (
            f"the server without speculation is faster than every depth at every level "
            f"measured, by {span} tok/s over the best depth: serve without speculation"
        )


def plain_server_wins(
    results: Sequence[LevelResult], min_gain: float = MIN_GAIN, depths: Sequence[int] | None = None
) -> PlainServerWins | None:
    """Set when no-spec beats the best depth (by more than the noise margin) everywhere."""
    envelope, nospec = _envelope(results, min_gain, depths)
    if not envelope:
        return None
    gains = {
        c: nospec[c].output_tok_per_s / envelope[c].output_tok_per_s - 1
        for c in envelope
        if envelope[c].output_tok_per_s > 0
    }
    if len(gains) < len(envelope) or not all(g > min_gain for g in gains.values()):
        return None
    rate = next(iter(envelope.values())).request_rate is not None
    return PlainServerWins(gains, rate)


def recommend_table(
    results: Sequence[LevelResult],
    captured_depths: Iterable[int] | None = None,
    version: int = 0,
    min_gain: float = MIN_GAIN,
    depths: Sequence[int] | None = None,
) -> PolicyTable | None:
    """Best depth per level compressed into tiers keyed by batch size; None if no level can
    decide (`undecided_levels`)."""
    best = best_depths(results, min_gain, depths)
    if not best:
        return None
    changes = [c for c in crossovers(results, min_gain, depths) if c.from_series != BEST_SPEC]
    tiers = [Tier(min_batch=1, depth=best[min(best)])]
    for change in changes:
        edge = change.batch if change.batch is not None else change.level
        min_batch = max(math.ceil(edge), tiers[-1].min_batch + 1)
        # Hysteresis: ~1/8 of the edge, kept inside the tier below (the contract requires it).
        room = min_batch - tiers[-1].min_batch - 1
        hysteresis = max(0, min(round(min_batch / 8), room))
        tiers.append(
            Tier(min_batch=min_batch, depth=int(change.to_series[1:]), hysteresis=hysteresis)
        )
    try:
        return PolicyTable.build(tiers, version=version, captured_depths=captured_depths)
    except PolicyError:
        return None


def too_short_hint(results: Sequence[LevelResult], output_tokens: float | None) -> str | None:
    """What to change when levels had no finished request: a window long enough for one
    request at the slowest flagged level's per-stream speed, if it can be estimated."""
    short = [r for r in results if r.too_short]
    if not short:
        return None
    levels = ", ".join(f"{r.series} {r.label}" for r in short)
    need = []
    for r in short:
        per_stream = r.output_tok_per_s / max(r.concurrency, 1)
        if output_tokens and per_stream > 0:
            need.append(output_tokens / per_stream)
    advice = "use a longer --duration-per-level"
    if need:
        advice += f" (a request took about {max(need):.0f} s at the slowest of them)"
    return (
        f"too short: no request that started in the window finished in it ({levels}); their "
        f"tok/s are left out of the recommendation; {advice}"
    )


def paired_lines(results: Sequence[LevelResult]) -> list[str]:
    """Per depth, each load against the plain server's level of the same load: tok/s ratio and
    TPOT p50 change. For `--paired` benches, where the two served the same requests back to
    back; levels too short to finish a request are left out."""
    plain = {r.level: r for r in results if r.series == NO_SPEC and not r.too_short}
    lines = []
    for name in dict.fromkeys(r.series for r in results if r.series != NO_SPEC):
        parts = []
        for r in results:
            other = plain.get(r.level)
            if r.series != name or r.too_short or other is None or not other.output_tok_per_s:
                continue
            part = f"{r.label} {r.output_tok_per_s / other.output_tok_per_s:.3f}"
            if r.tpot_p50_ms is not None and other.tpot_p50_ms:
                part += f" ({r.tpot_p50_ms / other.tpot_p50_ms - 1:+.1%} TPOT)"
            parts.append(part)
        if parts:
            lines.append(f"{name} against the plain server, tok/s ratio by load: "
                         + ", ".join(parts))  # fmt: skip
    return lines


SERVER_NAMES = {"spec": "speculative server", "no_spec": "plain server"}


def stream_interval_hint(servers: Mapping[str, Mapping[str, Any]]) -> str | None:
    """How to read the ITL columns when a server streams several tokens per chunk."""
    chunky = {
        name: n for name, facts in servers.items()
        if isinstance(n := facts.get("stream_interval"), int) and n > 1
    }  # fmt: skip
    if not chunky:
        return None
    which = ", ".join(f"the {SERVER_NAMES.get(k, k)} every {n}" for k, n in chunky.items())
    return (
        f"ITL is the gap between streamed chunks, and the servers sent a chunk per several "
        f"tokens ({which}, SGLang's --stream-interval); TPOT and tok/s count every token"
    )


@dataclass(frozen=True)
class Repeats:
    """Prompts that came round on a server whose KV pool can hold them all."""

    prompts: int
    tokens: float  # the prompts with their outputs, from the levels' mean lengths
    pool: int  # the smallest KV pool of the servers, in tokens
    sent: dict[str, int]  # requests per server past the prompt count ("speculative", "plain")


def prompts_came_round(
    results: Sequence[LevelResult], prompts: int, servers: Mapping[str, Mapping[str, Any]]
) -> Repeats | None:
    """Where a server took more requests than there are prompts and its KV pool can hold them
    all, its prefix cache may have held repeats whole. A whole hit leaves one token to
    prefill, far cheaper than the prompt; on SGLang a server without speculation also runs
    that prefill without its prefill CUDA graph, while an EAGLE server keys its cache by token
    pairs and prefills two on the graph, so a comparison with the plain server favours
    speculation. Requests are counted from the measured windows alone (a lower bound:
    warm-ups sent more). None where no server reports its pool."""
    pools = [n for f in servers.values()
             if isinstance(n := f.get("max_total_num_tokens"), int) and n > 0]  # fmt: skip
    sized = [r for r in results if r.prompt_tokens and r.output_tokens]
    if prompts < 1 or not pools or not sized:
        return None
    tokens = prompts * statistics.fmean(
        (r.prompt_tokens or 0.0) + (r.output_tokens or 0.0) for r in sized
    )
    if tokens > min(pools):
        return None  # the pool cannot hold them all: a prompt is evicted before it comes round
    sent = {
        "speculative": sum(r.requests for r in results if r.series != NO_SPEC),
        "plain": sum(r.requests for r in results if r.series == NO_SPEC),
    }
    over = {name: n for name, n in sent.items() if n > prompts}
    return Repeats(prompts, tokens, min(pools), over) if over else None


def repeat_hint(repeats: Repeats | None) -> str | None:
    """The line under the table for prompts that came round (`prompts_came_round`)."""
    if repeats is None:
        return None
    sent = " and ".join(f"{n:,} to the {name} server" for name, n in repeats.sent.items())
    return (
        f"prompts came round: {repeats.prompts:,} prompts (about {repeats.tokens:,.0f} "
        f"tokens with their outputs, within a KV pool of {repeats.pool:,}), {sent}, so the "
        "prefix cache may have held them whole and their prefills cost less than fresh "
        "traffic's (on SGLang, a plain server's one-token prefill of a whole hit also runs "
        "without its CUDA graph, while an EAGLE server's does not); give a --dataset with "
        "more prompts (generated-shared-prefix: more --gsp-groups or --gsp-prompts-per-group)"
    )


# A level whose TTFT p99 is this many times its p50, and at least STALL_MIN_MS, had requests
# held back far beyond the rest: an admission stall rather than the load's own queueing.
STALL_FACTOR = 4.0
STALL_MIN_MS = 100.0


def stall_hint(results: Sequence[LevelResult], gc_frozen: bool) -> str | None:
    """Levels with TTFT stalls, and what to try when the servers' collectors were not frozen."""
    stalled = [
        r for r in results
        if r.ttft_p50_ms and r.ttft_p99_ms and r.ttft_p99_ms >= STALL_MIN_MS
        and r.ttft_p99_ms >= STALL_FACTOR * r.ttft_p50_ms
    ]  # fmt: skip
    if not stalled:
        return None
    levels = ", ".join(
        f"{r.series} {r.label} ({r.ttft_p99_ms:.0f} ms vs {r.ttft_p50_ms:.0f})" for r in stalled
    )
    advice = (
        "the collectors were frozen, so look for other pauses in the server's log"
        if gc_frozen
        else "if the server logs long garbage collections (start it with "
        "--gc-warning-threshold-secs 0.05), rerun with --freeze-gc"
    )
    return f"TTFT stalls: p99 at least {STALL_FACTOR:g} x p50 at {levels}; {advice}"


# A level that spent this share of its window evicting from the prefix cache paid a host cost
# that depends on what earlier levels left in it, not only on the level's own load.
EVICTION_SHARE = 0.01


def _eviction_share(r: LevelResult) -> float:
    """The share of a level's window its scheduler spent evicting (0 where not recorded)."""
    return r.evict_ms / (1000.0 * r.elapsed_s) if r.evict_ms and r.elapsed_s > 0 else 0.0


def eviction_hint(results: Sequence[LevelResult], flushed: bool) -> str | None:
    """Levels whose scheduler spent a share of the window evicting cached prefixes."""
    shares = [(r, _eviction_share(r)) for r in results]
    heavy = [(r, share) for r, share in shares if share >= EVICTION_SHARE]
    if not heavy:
        return None
    levels = ", ".join(
        f"{r.series} {r.label} ({share:.1%}, {r.evictions} calls)" for r, share in heavy
    )
    advice = (
        "even with the cache emptied before each level: the level alone filled the KV pool"
        if flushed
        else "the KV pool was full of prefixes cached by earlier levels, so what each level "
        "pays depends on what ran before it; --flush-cache starts every level from an empty "
        "cache"
    )
    return f"prefix-cache evictions took a share of the scheduler's window at {levels}; {advice}"


def suggested_processes(total_share: float, processes: int, threshold: float, cores: int) -> int:
    """Enough processes for each to stay under half the threshold at the load measured (a
    saturated client under-reports what the level would ask of it), at least one more than now,
    and no more than the machine's cores unless that is not even one more."""
    want = max(processes + 1, math.ceil(total_share / (threshold / 2)))
    return min(want, max(cores, processes + 1))


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def client_bound_hint(
    results: Sequence[LevelResult], threshold: float, cores: int | None = None
) -> str | None:
    """What to change when levels were bound by the load generator: which levels, how much of
    a core its busiest process used at each, and a --client-processes to try."""
    bound = [r for r in results if r.client_bound]
    if not bound:
        return None
    cores = available_cores() if cores is None else cores
    shares = [
        f"{r.client_process_cpu_share or r.client_cpu_share:.2f}"
        + (" of a core" if i == 0 else "")
        + f" at {r.series} {r.label}"
        for i, r in enumerate(bound)
    ]
    processes = max(r.client_processes for r in bound)
    suggest = suggested_processes(max(r.client_cpu_share for r in bound), processes, threshold,
                                  cores)  # fmt: skip
    who = (
        "the load generator"
        if processes == 1
        else f"the busiest of the load generator's {processes} processes"
    )
    where = f" on a machine with more than {cores} cores" if suggest > cores else ""
    return (
        f"client-bound: {who} used {', '.join(shares)} (at or above {threshold:g}): their "
        f"numbers measure the client, not the server, and are left out of the recommendation; "
        f"rerun with --client-processes {suggest}{where}"
    )


# ----------------------------------------------------------------------------- files

# bench.json's format: /2 added `servers`, `stop_rule` and per level `step_ms`, `prompt_tokens`,
# `output_tokens`, `server_ttft_ms`, `server_itl_ms` (what `specctl sim fit` needs); /1 had no
# `format` key. Still /2, as additions that readers of /2 ignore: `client_processes` and
# `client_bound_share`, `gc_frozen` (with --freeze-gc), and per level `client_processes`,
# `client_process_cpu_share` and `client_bound`; `paired`, and per level `prompt_offset`;
# `paired_order` ("spec-first" or "plain-first"; None unless paired); `prompt_count` and
# `prompts_came_round`; `flush_cache`, and per level `evictions`, `evict_ms` and
# `cache_flushed`; `undecided_levels`, `percentiles`, `repeats`, `endpoint`,
# `extra_request_body`, `header_names` (names only: header values may hold secrets), `seed`,
# `asked_prompt_tokens`, `exact_prompt_size`, and per level `input_tok_per_s`,
# `total_tok_per_s`, `offered_tok_per_s`, `max_concurrency`, `latency_ms` (mean, std and the
# percentiles of TTFT, TPOT, ITL and E2E), `repeats`, `ci95` and `repeat_tok_per_s`.
BENCH_FORMAT = "specctl-bench/2"

# One column per scalar field; the nested ones are spread out (`csv_row`).
_NESTED = ("latency_ms", "ci95", "repeat_tok_per_s")
CSV_FIELDS = [f.name for f in fields(LevelResult) if f.name not in _NESTED]


def csv_row(r: LevelResult) -> dict[str, Any]:
    """A level as one CSV row: its scalar fields, each latency statistic as `ttft_mean_ms`,
    `tpot_p95_ms`, ..., each confidence interval as `<figure>_ci95`, and the repeats' tok/s
    joined by `;`."""
    row = {k: _round(v) for k, v in r.to_json().items() if k not in _NESTED}
    for metric, stats in r.latency_ms.items():
        for key, value in stats.items():
            row[f"{metric}_{key}_ms"] = _round(value)
    for key, value in r.ci95.items():
        row[f"{key.replace('.', '_')}_ci95"] = _round(value)
    row["repeat_tok_per_s"] = ";".join(f"{v:.3f}" for v in r.repeat_tok_per_s)
    return row


def write_csv(results: Sequence[LevelResult], path: Path) -> None:
    rows = [csv_row(r) for r in results]
    extra = [k for row in rows for k in row if k not in CSV_FIELDS]
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=[*CSV_FIELDS, *dict.fromkeys(extra)])
        writer.writeheader()
        writer.writerows(rows)


def _round(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _round(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_round(x) for x in v]
    return round(v, 3) if isinstance(v, float) and math.isfinite(v) else v


def _level_key(level: float) -> str:
    return f"{level:g}"


def recommendation_text(outcome: SweepOutcome) -> str | None:
    """One line: the table to push, or that a server without speculation wins."""
    depths = outcome.plan.depths
    table = recommend_table(outcome.results, outcome.before.captured_depths, depths=depths)
    plain = plain_server_wins(outcome.results, depths=depths)
    if plain is not None:
        kept = "" if table is None else f" (with speculation, the best table is {table.describe()})"
        return plain.describe() + kept
    if table is None:
        return None
    return f"recommended table (batch size -> depth): {table.describe()}"


def outcome_json(outcome: SweepOutcome) -> dict[str, Any]:
    plan = outcome.plan
    results = outcome.results
    depths = plan.depths
    table = recommend_table(results, outcome.before.captured_depths, depths=depths)
    plain = plain_server_wins(results, depths=depths)
    rate = plan.mode == "rate"
    best = {_level_key(c): d for c, d in best_depths(results, depths=depths).items()}
    out: dict[str, Any] = {
        "format": BENCH_FORMAT,
        "url": plan.url,
        "no_spec_url": plan.no_spec_url,
        "depths": list(plan.depths),
        "concurrencies": list(plan.concurrencies),
        "stop": plan.stop.describe(),
        "stop_rule": {"requests": plan.stop.requests, "duration_s": plan.stop.duration_s},
        "servers": outcome.servers,
        "prompts": plan.prompt_source,
        "prompt_count": len(plan.prompts),
        # Whether a server took more requests than there are prompts, all of which its KV pool
        # could hold (`prompts_came_round`): its prefix cache may have served repeats whole.
        "prompts_came_round": prompts_came_round(results, len(plan.prompts), outcome.servers)
        is not None,
        "table_before": None if outcome.before.table is None else outcome.before.table.to_json(),
        "table_before_source": outcome.before.source,
        "restored": outcome.restored,
        "interrupted": outcome.interrupted,
        "gc_frozen": outcome.gc_frozen or None,
        "flush_cache": plan.flush_cache,
        "results": [{k: _round(v) for k, v in r.to_json().items()} for r in results],
        "best_depth_by_concurrency": {} if rate else best,
        "crossovers": [
            {
                "from": c.from_series,
                "to": c.to_series,
                ("request_rate" if c.rate else "concurrency"): round(c.level, 2),
                "batch": None if c.batch is None else round(c.batch, 2),
            }
            for c in crossovers(results, depths=depths)
        ],
        "recommended_table": None if table is None else table.to_json(),
        "recommended_table_text": None if table is None else table.describe(),
        # Added with open-loop load, warm-ups, SLOs and level flags:
        "mode": plan.mode,
        "request_rates": list(plan.request_rates),
        "burstiness": plan.burstiness if rate else None,
        "max_concurrency": plan.max_concurrency if rate else None,
        "warmup_s": plan.stop.warmup,
        "slo_ms": None if plan.slo is None else plan.slo.to_json(),
        "flagged_levels": [
            {"series": r.series, "level": r.level, "flags": r.flags} for r in results if r.flags
        ],
        # Added with load split across processes:
        "client_processes": plan.client_processes,
        "client_bound_share": plan.client_bound_share,
        "paired": plan.paired,
        "paired_order": ("plain-first" if plan.plain_first else "spec-first")
        if plan.paired
        else None,
        "no_spec_wins": None
        if plain is None
        else {
            "min_gain": round(plain.low, 4),
            "max_gain": round(plain.high, 4),
            "gain_by_level": {_level_key(c): round(g, 4) for c, g in plain.gains.items()},
        },
        "recommendation": recommendation_text(outcome),
        # Added with undecidable levels, percentiles, input/total throughput and repeats:
        "undecided_levels": [
            {"level": u.level, "label": u.label, "reason": u.reason}
            for u in undecided_levels(results, depths)
        ],
        "percentiles": list(plan.percentiles),
        "repeats": plan.repeats,
        "endpoint": plan.style.endpoint,
        "extra_request_body": plan.style.extra_body or None,
        "header_names": sorted(plan.headers) or None,
        "seed": plan.seed,
        "asked_prompt_tokens": plan.asked_prompt_tokens,
        "exact_prompt_size": plan.exact_prompt_size,
    }
    if rate:
        out["best_depth_by_request_rate"] = best
    return out


def write_json(outcome: SweepOutcome, path: Path) -> None:
    path.write_text(json.dumps(outcome_json(outcome), indent=2) + "\n")


def plot(outcome: SweepOutcome, path: Path) -> None:
    """tok/s and TPOT p50 against the level, one line per depth (+ no-spec), crossovers marked;
    flagged levels (too short, other traffic, client-bound) drawn as red crosses, left out of
    the table."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = _by_series(outcome.results)
    rate = outcome.plan.mode == "rate"
    fig, (ax_tok, ax_tpot) = plt.subplots(
        1, 2, figsize=(12, 4.8), gridspec_kw={"width_ratios": [3, 2]}
    )
    flagged_drawn = False
    for name in sorted(series, key=lambda s: (s == NO_SPEC, s)):
        rows = [series[name][c] for c in sorted(series[name])]
        xs = [r.level for r in rows]
        style = {"linestyle": "--", "color": "black"} if name == NO_SPEC else {}
        ax_tok.plot(xs, [r.output_tok_per_s for r in rows], marker="o", label=name, **style)
        tpot = [(r.level, r.tpot_p50_ms) for r in rows if r.tpot_p50_ms is not None]
        if tpot:
            ax_tpot.plot(*zip(*tpot, strict=True), marker="o", label=name, **style)
        bad = [r for r in rows if r.flags]
        if bad:
            ax_tok.scatter(
                [r.level for r in bad], [r.output_tok_per_s for r in bad], marker="x", s=90,
                color="red", zorder=5, label=None if flagged_drawn else "flagged (left out)",
            )  # fmt: skip
            for r in bad:
                ax_tok.annotate(
                    ", ".join(r.flags), (r.level, r.output_tok_per_s), textcoords="offset points",
                    xytext=(4, -10), fontsize=7, color="red",
                )  # fmt: skip
            flagged_drawn = True
    for cross in crossovers(outcome.results, depths=outcome.plan.depths):
        ax_tok.axvline(cross.level, color="grey", linestyle=":", linewidth=1)
        ax_tok.annotate(
            f"{cross.from_series}→{cross.to_series}",
            (cross.level, 0.02), xycoords=("data", "axes fraction"),
            rotation=90, fontsize=8, color="dimgrey", ha="right", va="bottom",
        )  # fmt: skip
    levels = sorted({r.level for r in outcome.results})
    xlabel = "request rate (requests/s)" if rate else "concurrent streams"
    for ax, ylabel in ((ax_tok, "output tok/s (all streams)"), (ax_tpot, "TPOT p50 (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [f"{c:g}" for c in levels])
        ax.minorticks_off()
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # no TPOT line when no request finished
            ax.legend(fontsize=8)
    title = f"specctl bench: {outcome.plan.url}"
    verdict = recommendation_text(outcome)
    undecided = undecided_levels(outcome.results, outcome.plan.depths)
    if verdict is not None:
        title += "\n" + verdict
    elif undecided:
        title += "\nno table recommended: no level could choose a depth (the report says why)"
    if verdict is not None and undecided:
        title += f"; undecided: {', '.join(u.label for u in undecided)}"
    fig.suptitle(title, fontsize=10, wrap=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
