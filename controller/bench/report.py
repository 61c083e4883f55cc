"""What a sweep means: best depth per concurrency, crossovers, the table to push, and files.

Crossovers are interpolated between measured concurrencies (linear in log2 concurrency, where
the sweep's levels are evenly spaced), and converted to batch sizes with the mean batch the
server's own counters reported at those levels. Batch size and concurrency differ once the
server caps running requests (SGLang's default with speculation is 48), and the table is keyed
by batch size.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from controller.bench.sweep import NO_SPEC, LevelResult, SweepOutcome, series_name
from sglang_hooks.contract import PolicyError, PolicyTable, Tier

# A depth change is recommended only where the new depth wins by more than this share: short
# levels are noisy, and a tier that wins by 1% is not worth a boundary the batch can flap on.
MIN_GAIN = 0.02


@dataclass(frozen=True)
class Crossover:
    from_series: str  # wins below the crossover
    to_series: str  # wins above it
    concurrency: float
    batch: float | None

    def describe(self) -> str:
        at = f"concurrency ~{self.concurrency:.3g}"
        if self.batch is not None:
            at += f" (batch ~{self.batch:.3g})"
        return f"{self.from_series} -> {self.to_series} at {at}"


def _by_series(results: Iterable[LevelResult]) -> dict[str, dict[int, LevelResult]]:
    out: dict[str, dict[int, LevelResult]] = {}
    for r in results:
        out.setdefault(r.series, {})[r.concurrency] = r
    return out


def best_depths(results: Sequence[LevelResult], min_gain: float = MIN_GAIN) -> dict[int, int]:
    """Best forced depth per concurrency; the current depth is kept unless beaten by min_gain."""
    spec = [r for r in results if r.depth is not None]
    by_c: dict[int, list[LevelResult]] = {}
    for r in spec:
        by_c.setdefault(r.concurrency, []).append(r)
    out: dict[int, int] = {}
    current: int | None = None
    for c in sorted(by_c):
        rows = {r.depth: r.output_tok_per_s for r in by_c[c] if r.depth is not None}
        best = max(rows, key=lambda d: (rows[d], -d))
        if current in rows and rows[best] <= rows[current] * (1 + min_gain):
            best = current
        out[c] = current = best
    return out


def _interpolate(lo: LevelResult, hi: LevelResult, lo_b: LevelResult, hi_b: LevelResult) -> float:
    """Fraction in [0, 1] of the way from concurrency lo to hi where series a meets series b."""
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
    a: dict[int, LevelResult], b: dict[int, LevelResult], c_lo: int, c_hi: int, to: str
) -> Crossover:
    frac = _interpolate(a[c_lo], a[c_hi], b[c_lo], b[c_hi])
    conc = _at(frac, c_lo, c_hi, log=True)
    batches = [r.mean_batch for r in (a[c_lo], b[c_lo], a[c_hi], b[c_hi])]
    batch = None
    if all(x is not None for x in batches):
        b_lo = (batches[0] + batches[1]) / 2  # type: ignore[operator]
        b_hi = (batches[2] + batches[3]) / 2  # type: ignore[operator]
        batch = _at(frac, b_lo, b_hi, log=False)
    return Crossover(next(iter(a.values())).series, to, conc, batch)


def crossovers(results: Sequence[LevelResult], min_gain: float = MIN_GAIN) -> list[Crossover]:
    """Where the best depth changes, and where no-spec overtakes the best depth (if measured)."""
    series = _by_series(results)
    best = best_depths(results, min_gain)
    cs = sorted(best)
    out = []
    for c_lo, c_hi in itertools.pairwise(cs):
        d_lo, d_hi = best[c_lo], best[c_hi]
        if d_lo != d_hi:
            a, b = series[series_name(d_lo)], series[series_name(d_hi)]
            out.append(_crossover(a, b, c_lo, c_hi, series_name(d_hi)))
    nospec = series.get(NO_SPEC)
    if nospec:
        # Compare the best speculative envelope with the no-spec server, level by level.
        envelope = {c: series[series_name(best[c])][c] for c in cs if c in nospec}
        ec = sorted(envelope)
        for c_lo, c_hi in itertools.pairwise(ec):
            lo_gap = envelope[c_lo].output_tok_per_s - nospec[c_lo].output_tok_per_s
            hi_gap = envelope[c_hi].output_tok_per_s - nospec[c_hi].output_tok_per_s
            if lo_gap > 0 >= hi_gap:
                env = {c_lo: envelope[c_lo], c_hi: envelope[c_hi]}
                cross = _crossover(env, nospec, c_lo, c_hi, NO_SPEC)
                out.append(Crossover("best spec", NO_SPEC, cross.concurrency, cross.batch))
                break
    return out


def recommend_table(
    results: Sequence[LevelResult],
    captured_depths: Iterable[int] | None = None,
    version: int = 0,
    min_gain: float = MIN_GAIN,
) -> PolicyTable | None:
    """Best depth per concurrency compressed into tiers keyed by batch size; None if no data."""
    best = best_depths(results, min_gain)
    if not best:
        return None
    changes = [c for c in crossovers(results, min_gain) if c.from_series != "best spec"]
    tiers = [Tier(min_batch=1, depth=best[min(best)])]
    for change in changes:
        edge = change.batch if change.batch is not None else change.concurrency
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


# ----------------------------------------------------------------------------- files

# bench.json's format: /2 added `servers`, `stop_rule` and per level `step_ms`, `prompt_tokens`,
# `output_tokens`, `server_ttft_ms`, `server_itl_ms` (what `specctl sim fit` needs); /1 had no
# `format` key.
BENCH_FORMAT = "specctl-bench/2"

CSV_FIELDS = [f.name for f in fields(LevelResult)]


def write_csv(results: Sequence[LevelResult], path: Path) -> None:
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for r in results:
            writer.writerow({k: _round(v) for k, v in r.to_json().items()})


def _round(v: Any) -> Any:
    return round(v, 3) if isinstance(v, float) and math.isfinite(v) else v


def outcome_json(outcome: SweepOutcome) -> dict[str, Any]:
    plan = outcome.plan
    table = recommend_table(outcome.results, outcome.before.captured_depths)
    return {
        "format": BENCH_FORMAT,
        "url": plan.url,
        "no_spec_url": plan.no_spec_url,
        "depths": list(plan.depths),
        "concurrencies": list(plan.concurrencies),
        "stop": plan.stop.describe(),
        "stop_rule": {"requests": plan.stop.requests, "duration_s": plan.stop.duration_s},
        "servers": outcome.servers,
        "prompts": plan.prompt_source,
        "table_before": None if outcome.before.table is None else outcome.before.table.to_json(),
        "table_before_source": outcome.before.source,
        "restored": outcome.restored,
        "interrupted": outcome.interrupted,
        "results": [{k: _round(v) for k, v in r.to_json().items()} for r in outcome.results],
        "best_depth_by_concurrency": {str(c): d for c, d in best_depths(outcome.results).items()},
        "crossovers": [
            {
                "from": c.from_series,
                "to": c.to_series,
                "concurrency": round(c.concurrency, 2),
                "batch": None if c.batch is None else round(c.batch, 2),
            }
            for c in crossovers(outcome.results)
        ],
        "recommended_table": None if table is None else table.to_json(),
        "recommended_table_text": None if table is None else table.describe(),
    }


def write_json(outcome: SweepOutcome, path: Path) -> None:
    path.write_text(json.dumps(outcome_json(outcome), indent=2) + "\n")


def plot(outcome: SweepOutcome, path: Path) -> None:
    """tok/s and TPOT p50 against concurrency, one line per depth (+ no-spec), crossovers marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = _by_series(outcome.results)
    fig, (ax_tok, ax_tpot) = plt.subplots(
        1, 2, figsize=(12, 4.8), gridspec_kw={"width_ratios": [3, 2]}
    )
    for name in sorted(series, key=lambda s: (s == NO_SPEC, s)):
        rows = [series[name][c] for c in sorted(series[name])]
        xs = [r.concurrency for r in rows]
        style = {"linestyle": "--", "color": "black"} if name == NO_SPEC else {}
        ax_tok.plot(xs, [r.output_tok_per_s for r in rows], marker="o", label=name, **style)
        tpot = [(r.concurrency, r.tpot_p50_ms) for r in rows if r.tpot_p50_ms is not None]
        if tpot:
            ax_tpot.plot(*zip(*tpot, strict=True), marker="o", label=name, **style)
    for cross in crossovers(outcome.results):
        ax_tok.axvline(cross.concurrency, color="grey", linestyle=":", linewidth=1)
        ax_tok.annotate(
            f"{cross.from_series}→{cross.to_series}",
            (cross.concurrency, 0.02), xycoords=("data", "axes fraction"),
            rotation=90, fontsize=8, color="dimgrey", ha="right", va="bottom",
        )  # fmt: skip
    table = recommend_table(outcome.results, outcome.before.captured_depths)
    levels = sorted({r.concurrency for r in outcome.results})
    for ax, ylabel in ((ax_tok, "output tok/s (all streams)"), (ax_tpot, "TPOT p50 (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(c) for c in levels])
        ax.minorticks_off()
        ax.set_xlabel("concurrent streams")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    title = f"specctl bench: {outcome.plan.url}"
    if table is not None:
        title += f"\nrecommended table (batch size): {table.describe()}"
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
