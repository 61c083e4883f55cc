"""Every level of several benches in the order they ran: does a server drift over its life?

    python -m benchmarks.gpu.timeline DIR1 DIR2 ... [--json timeline.json]

Each DIR is a `specctl bench` result (its bench.json, or the folder holding it). The levels of
all of them are put in the order their windows opened (`window_start_unix`) and printed one a
line: seconds since the first window, the bench, the series and concurrency, tok/s, the
server's measured ms per forward pass (prefill batches and decode iterations together), the
plugin's GPU-timed decode forward (depth 0 only), SGLang's prefill batches per decode
iteration, the prefix cache's eviction ms per pass and whether the cache was emptied before
the level (`--flush-cache`). A last table takes each server at each concurrency and says how its
ms per pass moved over the benches: the rank correlation with time (Spearman) and the change
from the first level to the mean of the last third. Paired benches judge each level against
the other server's, which cancels drift only where both servers drift alike; a pooled
verdict over benches spread across a server's life carries whatever they do not share.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from scipy.stats import spearmanr

from benchmarks.gpu import bench_file

# A drift row needs this many levels of one server at one concurrency.
MIN_LEVELS = 3


class TimelineError(ValueError):
    """A bench that cannot be read; the message names the file."""


@dataclass(frozen=True)
class Level:
    """One measured level, placed in time."""

    at_s: float  # window opened, seconds after the first level's
    bench: str
    series: str
    concurrency: int
    tok_per_s: float
    ms_per_pass: float | None
    decode_forward_ms: float | None
    prefills_per_decode: float | None
    evict_ms_per_pass: float | None
    flushed: bool | None


@dataclass(frozen=True)
class Drift:
    """One server at one concurrency over the benches."""

    series: str
    concurrency: int
    levels: int
    first_ms: float
    last_third_ms: float
    rho_time: float | None  # Spearman's rho of ms per pass against time

    @property
    def change(self) -> float:
        return self.last_third_ms / self.first_ms - 1.0


def _per_pass(row: dict[str, Any], value: float | None) -> float | None:
    passes = (row.get("prefill_passes") or 0) + (row.get("decode_passes") or 0)
    return None if value is None or not passes else value / passes


def levels_of(paths: Sequence[Path]) -> list[Level]:
    """The timed levels of every bench, oldest first (a level without its window's time, from
    a bench before `specctl bench` recorded it, cannot be placed and is left out)."""
    found: list[tuple[float, str, dict[str, Any]]] = []
    for path in paths:
        name = (path if path.is_dir() else path.parent).name
        for row in bench_file.level_rows(path, error=TimelineError):
            start = row.get("window_start_unix")
            if isinstance(start, int | float) and isinstance(row.get("output_tok_per_s"),
                                                             int | float):  # fmt: skip
                found.append((float(start), name, row))
    if not found:
        raise TimelineError("no level with its window's time (window_start_unix) in any bench")
    found.sort(key=lambda item: item[0])
    origin = found[0][0]
    out = []
    for start, name, row in found:
        decodes = row.get("decode_passes")
        out.append(Level(
            at_s=round(start - origin, 1), bench=name, series=str(row.get("series")),
            concurrency=int(row.get("concurrency") or 0),
            tok_per_s=float(row["output_tok_per_s"]),
            ms_per_pass=_per_pass(row, 1000.0 * float(row.get("elapsed_s") or 0.0)),
            decode_forward_ms=row.get("step_ms"),
            prefills_per_decode=None if not decodes
            else (row.get("prefill_passes") or 0) / decodes,
            evict_ms_per_pass=_per_pass(row, row.get("evict_ms")),
            flushed=row.get("cache_flushed"),
        ))  # fmt: skip
    return out


def drifts(levels: Sequence[Level]) -> list[Drift]:
    """Per (series, concurrency) with at least MIN_LEVELS timed levels, in the levels' order."""
    groups: dict[tuple[str, int], list[Level]] = {}
    for level in levels:
        if level.ms_per_pass is not None:
            groups.setdefault((level.series, level.concurrency), []).append(level)
    out = []
    for (series, concurrency), group in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        if len(group) < MIN_LEVELS:
            continue
        ms = [lv.ms_per_pass for lv in group if lv.ms_per_pass is not None]
        times = [lv.at_s for lv in group]
        rho = None
        if len(set(ms)) > 1 and len(set(times)) > 1:
            rho = round(float(spearmanr(times, ms).statistic), 2)
        tail = ms[-max(1, len(ms) // 3):]
        out.append(Drift(series=series, concurrency=concurrency, levels=len(ms),
                         first_ms=round(ms[0], 3), last_third_ms=round(statistics.fmean(tail), 3),
                         rho_time=rho))  # fmt: skip
    return out


def _f(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def report(levels: Sequence[Level], drift: Sequence[Drift]) -> str:
    width = max(len(lv.bench) for lv in levels)
    lines = [
        f"{'at s':>7} {'bench':<{width}} {'series':<8} {'conc':>5} {'tok/s':>8} "
        f"{'ms/pass':>8} {'forward':>8} {'pf/dec':>7} {'evict/pass':>10} {'flushed':>8}"
    ]
    for lv in levels:
        flushed = "-" if lv.flushed is None else ("yes" if lv.flushed else "no")
        lines.append(
            f"{lv.at_s:>7.0f} {lv.bench:<{width}} {lv.series:<8} {lv.concurrency:>5} "
            f"{lv.tok_per_s:>8.0f} {_f(lv.ms_per_pass, '.2f'):>8} "
            f"{_f(lv.decode_forward_ms, '.2f'):>8} {_f(lv.prefills_per_decode, '.3f'):>7} "
            f"{_f(lv.evict_ms_per_pass, '.3f'):>10} {flushed:>8}"
        )
    if drift:
        lines += [
            "ms per pass over the benches, per server and load: first level, mean of the last "
            "third, change, rank correlation with time",
            f"{'series':<8} {'conc':>5} {'levels':>6} {'first':>7} {'last 1/3':>8} "
            f"{'change':>7} {'rho':>5}",
        ]
        for d in drift:
            lines.append(
                f"{d.series:<8} {d.concurrency:>5} {d.levels:>6} {d.first_ms:>7.2f} "
                f"{d.last_third_ms:>8.2f} {d.change:>+7.1%} {_f(d.rho_time, '+.2f'):>5}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu.timeline", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("runs", nargs="+", type=Path, help="bench.json files or their folders")
    ap.add_argument("--json", type=Path, help="also write the levels and drifts as JSON")
    args = ap.parse_args(argv)
    try:
        levels = levels_of(args.runs)
    except TimelineError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    drift = drifts(levels)
    print(report(levels, drift))
    if args.json:
        args.json.write_text(json.dumps({
            "runs": [str(p) for p in args.runs], "levels": [asdict(lv) for lv in levels],
            "drift": [{**asdict(d), "change": round(d.change, 4)} for d in drift],
        }, indent=2) + "\n")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
