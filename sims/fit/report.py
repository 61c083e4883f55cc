"""How well a fitted profile replays the bench it was fitted to: per level and overall.

Each fitted level is replayed with the bench's protocol (`sims.fit.replay`) on the profile as
written (step noise included), over a few seeds, and its simulated tok/s and TPOT (medians, as
the bench reports them) are set against the measured ones. Outliers (levels the fit set aside)
are replayed too and shown, marked, outside the error figures, which are also given with
them; levels that could not be fitted are listed with the reason. Per level, the fastest
depth measured is set beside the fastest replayed: whether the fitted simulator would take the
server's decision.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from rich.table import Table

from sims.fit.bench_file import Level
from sims.fit.fitting import FitResult, Unfit
from sims.fit.framing import shape_of
from sims.fit.outliers import mean_of_known
from sims.fit.pool import Replayer
from sims.fit.repeats import repeats_line
from sims.profile import Profile

REPORT_SEEDS = (0, 1, 2)


@dataclass(frozen=True)
class Row:
    level: Level
    tok_per_s: float
    tpot_ms: float | None
    ttft_ms: float | None
    outlier: bool = False
    prefills_per_decode: float | None = None  # in the replay, as the bench counts them

    @property
    def tok_error(self) -> float:
        return self.tok_per_s / self.level.tok_per_s - 1.0

    @property
    def tpot_error(self) -> float | None:
        if self.tpot_ms is None or not self.level.tpot_p50_ms:
            return None
        return self.tpot_ms / self.level.tpot_p50_ms - 1.0


@dataclass(frozen=True)
class Summary:
    median: float
    worst: float
    worst_at: str

    def to_json(self) -> dict[str, Any]:
        return {
            "median": round(self.median, 4),
            "worst": round(self.worst, 4),
            "worst_at": self.worst_at,
        }


def replay_rows(
    profile: Profile,
    levels: Sequence[Level],
    limits: dict[str, int | None],
    replayer: Replayer | None = None,
    outliers: Sequence[Level] = (),
) -> list[Row]:
    """The fitted levels, then the outliers (marked)."""
    marked = {id(lv) for lv in outliers}
    levels = [*levels, *outliers]
    shapes = [shape_of(lv, limits[lv.source]) for lv in levels for _ in REPORT_SEEDS]
    seeds = [s for _ in levels for s in REPORT_SEEDS]
    done = (replayer or Replayer()).run(profile, shapes, seeds)
    rows = []
    for i, lv in enumerate(levels):
        runs = done[i * len(REPORT_SEEDS) : (i + 1) * len(REPORT_SEEDS)]
        rows.append(
            Row(
                level=lv,
                tok_per_s=statistics.fmean(r.tok_per_s for r in runs),
                tpot_ms=mean_of_known([r.tpot_p50_ms for r in runs]),
                ttft_ms=mean_of_known([r.ttft_p50_ms for r in runs]),
                outlier=id(lv) in marked,
                prefills_per_decode=mean_of_known(
                    [r.prefill_passes / r.decode_passes if r.decode_passes else None for r in runs]
                ),
            )
        )
    return rows


def bench_names(sources: Sequence[str]) -> dict[str, str]:
    """A short name per bench file: what tells the files apart, not their whole paths.

    The folders and file name the paths share are left out ("run6/bench_w512/bench.json" and
    "run6/bench_family/bench.json" are "bench_w512" and "bench_family").
    """
    unique = list(dict.fromkeys(sources))
    parts = [PurePath(s).parts for s in unique]
    if len(unique) < 2:
        return {s: PurePath(s).name for s in unique}
    head = 0
    while all(len(p) > head + 1 for p in parts) and len({p[head] for p in parts}) == 1:
        head += 1
    tail = 0
    while all(len(p) > head + tail + 1 for p in parts) and len({p[-1 - tail] for p in parts}) == 1:
        tail += 1
    names = {s: "/".join(p[head : len(p) - tail]) for s, p in zip(unique, parts, strict=True)}
    return names if len(set(names.values())) == len(names) else {s: s for s in unique}


def _short_names(rows: Sequence[Row]) -> dict[str, str]:
    """`bench_names` of the rows' files where there are several, else none (one bench's
    levels need no name)."""
    names = bench_names([r.level.source for r in rows])
    return names if len(names) > 1 else {}


def _level_label(level: Level, names: dict[str, str]) -> str:
    return f"{level.label}, {names[level.source]}" if names else level.label


def summarize(rows: Sequence[Row], which: str, *, outliers: bool = False) -> Summary | None:
    """Median and worst |error| over the fitted levels (with `outliers`, over every row).

    With rows from several bench files the worst level is named with its file's short name.
    """
    names = _short_names(rows)
    errs = [
        (abs(e), _level_label(r.level, names))
        for r in rows
        if (outliers or not r.outlier)
        and (e := (r.tok_error if which == "tok_per_s" else r.tpot_error)) is not None
    ]
    if not errs:
        return None
    worst = max(errs)
    return Summary(statistics.median(e for e, _ in errs), worst[0], worst[1])


@dataclass(frozen=True)
class BestDepth:
    """One bench's concurrency: the fastest depth measured, and in the replay."""

    source: str
    concurrency: int
    bench: str  # series name, e.g. "d3"
    replay: str

    @property
    def agrees(self) -> bool:
        return self.bench == self.replay

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "concurrency": self.concurrency, "bench": self.bench,
                "replay": self.replay, "agrees": self.agrees}  # fmt: skip


def best_depths(rows: Sequence[Row]) -> list[BestDepth]:
    """Per bench file and concurrency with two or more depths, the depth with the most tok/s
    as measured and as replayed (outliers included: a decision is taken on every level). The
    plain server is left out, as in `specctl bench`'s best forced depth: it is another
    deployment, not a depth a table can choose."""
    by: dict[tuple[str, int], list[Row]] = {}
    for r in rows:
        if r.level.depth is not None:
            by.setdefault((r.level.source, r.level.concurrency), []).append(r)
    return [
        BestDepth(
            source=src, concurrency=c,
            bench=max(group, key=lambda r: r.level.tok_per_s).level.series,
            replay=max(group, key=lambda r: r.tok_per_s).level.series,
        )
        for (src, c), group in sorted(by.items())
        if len(group) > 1
    ]  # fmt: skip


@dataclass(frozen=True)
class OffCost:
    """Depth 0's tok/s against the plain server's at one level of one bench (or of the pooled
    benches), measured and replayed: what speculation switched off costs there."""

    source: str
    concurrency: int
    bench: float
    replay: float

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "concurrency": self.concurrency,
                "bench": round(self.bench, 4), "replay": round(self.replay, 4)}


def off_costs(rows: Sequence[Row]) -> list[OffCost]:
    """Per level where a bench measured both depth 0 and the plain server (outliers left out)."""
    pairs: dict[tuple[str, int], dict[str, Row]] = {}
    for r in rows:
        if r.outlier or (r.level.depth not in (0, None)):
            continue
        kind = "d0" if r.level.depth == 0 else "plain"
        pairs.setdefault((r.level.source, r.level.concurrency), {})[kind] = r
    out = []
    for (source, conc), pair in sorted(pairs.items(), key=lambda item: item[0][1]):
        d0, plain = pair.get("d0"), pair.get("plain")
        if d0 is None or plain is None or not plain.level.tok_per_s or not plain.tok_per_s:
            continue
        out.append(OffCost(source, conc, d0.level.tok_per_s / plain.level.tok_per_s,
                           d0.tok_per_s / plain.tok_per_s))
    return out


def off_cost_line(costs: Sequence[OffCost], names: dict[str, str]) -> str | None:
    if not costs:
        return None
    cells = ", ".join(f"c={c.concurrency}{f' ({names[c.source]})' if names else ''} "
                      f"{c.bench:.3f}/{c.replay:.3f}" for c in costs)
    return f"depth 0 / plain tok/s, bench/replay: {cells}"


def best_depth_line(best: Sequence[BestDepth], names: dict[str, str]) -> str | None:
    """One line: the fastest depth per level, bench / replay, and whether they agree."""
    if not best:
        return None
    cells = ", ".join(
        f"c={b.concurrency}{f' ({names[b.source]})' if names else ''} {b.bench}"
        + ("" if b.agrees else f"/{b.replay}")
        for b in best
    )
    differ = [b for b in best if not b.agrees]
    verdict = (
        "the replay picks the bench's depth at every level"
        if not differ
        else f"the replay picks another depth at {len(differ)} of {len(best)} levels (bench/replay)"
    )
    return f"best depth per level: {cells}; {verdict}"


@dataclass(frozen=True)
class Report:
    result: FitResult
    base: Profile
    rows: list[Row]
    out: str
    fitted: bool = True  # False: the profile as given, only framed by the benches (replay)

    @property
    def unfit(self) -> list[Unfit]:
        return self.result.unfit

    def to_json(self) -> dict[str, Any]:
        from sims.fit.fitting import describe_fields

        res = self.result
        prof = res.profile
        tok, tpot = summarize(self.rows, "tok_per_s"), summarize(self.rows, "tpot_ms")
        return {
            "profile": prof.name,
            "fitted": self.fitted,
            "out": self.out,
            "base": self.base.name,
            "benches": sorted(
                {lv.source for lv in res.levels} | {u.level.source for u in res.unfit}
            ),
            "fields": describe_fields(res, self.base),
            "running_cap": {
                "spec": prof.scheduler.max_running_requests_spec,
                "no_spec": prof.scheduler.max_running_requests_nospec,
            },
            "accept_length": {str(d): round(v, 4) for d, v in res.accept_lengths.items()},
            "rows": [
                {
                    "series": r.level.series,
                    "depth": r.level.depth,
                    "concurrency": r.level.concurrency,
                    "source": r.level.source,
                    "benches": r.level.benches,
                    "measured": {
                        "tok_per_s": round(r.level.tok_per_s, 3),
                        "tpot_ms": _round(r.level.tpot_p50_ms),
                    },
                    "simulated": {"tok_per_s": round(r.tok_per_s, 3), "tpot_ms": _round(r.tpot_ms)},
                    "error": {
                        "tok_per_s": round(r.tok_error, 4),
                        "tpot_ms": _round(r.tpot_error, 4),
                    },
                    "outlier": r.outlier,
                    "prefills_per_decode": {
                        "measured": _round(r.level.prefills_per_decode),
                        "simulated": _round(r.prefills_per_decode),
                    },
                }
                for r in self.rows
            ],
            "outliers": [
                {
                    "series": o.level.series,
                    "concurrency": o.level.concurrency,
                    "source": o.level.source,
                    "reason": o.reason,
                }
                for o in res.outliers
            ],
            "not_fitted": [
                {
                    "series": u.level.series,
                    "concurrency": u.level.concurrency,
                    "source": u.level.source,
                    "reason": u.reason,
                }
                for u in self.unfit
            ],
            "error": {
                "tok_per_s": None if tok is None else tok.to_json(),
                "tpot_ms": None if tpot is None else tpot.to_json(),
            },
            "best_depth": [b.to_json() for b in best_depths(self.rows)],
            "depth0_vs_plain": [c.to_json() for c in off_costs(self.rows)],
            "repeats": [r.to_json() for r in res.repeats],
            "pooled_repeats": res.pooled,
            "error_with_outliers": {
                "tok_per_s": _summary_json(summarize(self.rows, "tok_per_s", outliers=True)),
                "tpot_ms": _summary_json(summarize(self.rows, "tpot_ms", outliers=True)),
            },
            "fit": {
                "evaluations": res.evaluations,
                "seconds": round(res.seconds, 2),
                "notes": res.notes,
            },
        }


def _summary_json(s: Summary | None) -> dict[str, Any] | None:
    return None if s is None else s.to_json()


def _round(v: float | None, digits: int = 3) -> float | None:
    return None if v is None else round(v, digits)


def _num(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _pct(e: float | None) -> str:
    return "-" if e is None else f"{100 * e:+.1f}%"


def render(report: Report) -> list[Any]:
    """Rich renderables: the per-level table, then the lines under it."""
    names = _short_names(report.rows)
    which = "the fitted profile" if report.fitted else "the profile as given"
    table = Table(title=f"{report.result.profile.name}: the bench replayed on {which}", box=None)
    passes = any(r.level.prefills_per_decode is not None for r in report.rows)
    for name in (
        "series",
        "conc",
        "tok/s bench",
        "tok/s sim",
        "err",
        "TPOT bench",
        "TPOT sim",
        "err ",
        *(["prefills/iter bench/sim"] if passes else []),
    ):
        table.add_column(name, justify="left" if name == "series" else "right", no_wrap=True)
    for r in report.rows:
        lv = r.level
        if lv.benches > 1:
            series = f"{lv.series} (mean of {lv.benches})"
        else:
            series = f"{lv.series} ({names[lv.source]})" if names else lv.series
        if r.outlier:
            series += " (outlier)"
        table.add_row(
            series,
            str(lv.concurrency),
            f"{lv.tok_per_s:.1f}",
            f"{r.tok_per_s:.1f}",
            _pct(r.tok_error),
            "-" if lv.tpot_p50_ms is None else f"{lv.tpot_p50_ms:.2f}",
            "-" if r.tpot_ms is None else f"{r.tpot_ms:.2f}",
            _pct(r.tpot_error),
            *([f"{_num(r.level.prefills_per_decode)}/{_num(r.prefills_per_decode)}"]
              if passes else []),
        )  # fmt: skip
    lines: list[Any] = [table]
    fitted = sum(not r.outlier for r in report.rows)
    kind = "fitted levels" if report.fitted else "levels"
    for which, label in (("tok_per_s", "tok/s"), ("tpot_ms", "TPOT")):
        s = summarize(report.rows, which)
        if s is not None:
            line = (
                f"{label} error over the {fitted} {kind}: median {100 * s.median:.1f}%, "
                f"worst {100 * s.worst:.1f}% ({s.worst_at})"
            )
            every = summarize(report.rows, which, outliers=True)
            if every is not None and fitted < len(report.rows):
                line += (
                    f"; with the outliers, median {100 * every.median:.1f}%, "
                    f"worst {100 * every.worst:.1f}% ({every.worst_at})"
                )
            lines.append(line)
    best = best_depth_line(best_depths(report.rows), names)
    if best is not None:
        lines.append(best)
    off = off_cost_line(off_costs(report.rows), names)
    if off is not None:
        lines.append(off)
    repeated = repeats_line(report.result.repeats, report.result.pooled, report.fitted)
    if repeated is not None:
        lines.append(repeated)
    if names:
        lines.append("benches: " + ", ".join(f"{n} = {src}" for src, n in names.items()))
    for o in report.result.outliers:
        lines.append(f"[yellow]outlier[/yellow]: {o.level.label} ({_source(o.level, names)}): "
                     f"{o.reason}")
    for u in report.unfit:
        lines.append(f"[yellow]not fitted[/yellow]: {u.level.label} ({_source(u.level, names)}): "
                     f"{u.reason}")
    return lines


def _source(level: Level, names: dict[str, str]) -> str:
    """The short name where the table used short names, else the file as given."""
    return names.get(level.source, level.source)
