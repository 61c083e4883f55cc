"""How well a profile's shapes replay a bench of shapes: per shape, family and load, and overall.

Every level is replayed with the bench's protocol (`sims.fit.shape_fit.replay_level`) on the
profile as written (step noise included) over a few seeds, and its simulated tok/s and TPOT are
set against the measured ones. Levels the bench flagged are replayed and shown too, marked,
outside the error figures (their measured tok/s is what a window streamed before any request
of it finished). Per family and load, the fastest shape measured (over the unflagged levels, as
the bench's report decides) is set beside the fastest replayed among the same shapes: would
the simulator pick the shape the server did?
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sims.fit.shape_fit import ShapeFit, family_requests, replay_level, usable
from sims.fit.shape_folder import ShapeBench, ShapeLevel
from sims.profile import Profile

CHECK_SEEDS = (0, 1, 2)


@dataclass(frozen=True)
class ShapeRow:
    level: ShapeLevel
    tok_per_s: float
    tpot_ms: float | None
    left_out: str | None  # why the fit left it out (None: fitted)

    @property
    def tok_error(self) -> float | None:
        measured = self.level.level.tok_per_s
        # None for a level that streamed nothing (flagged, never fitted)
        return self.tok_per_s / measured - 1.0 if measured > 0 else None

    @property
    def tpot_error(self) -> float | None:
        measured = self.level.level.tpot_p50_ms
        return None if self.tpot_ms is None or not measured else self.tpot_ms / measured - 1.0


@dataclass(frozen=True)
class BestAt:
    family: str
    streams: int
    measured: str
    simulated: str
    margin: float  # how much faster the measured best ran than the simulator's pick did

    @property
    def agrees(self) -> bool:
        return self.measured == self.simulated


def replay_rows(profile: Profile, bench: ShapeBench) -> list[ShapeRow]:
    """Every level of the bench, replayed on `profile` over CHECK_SEEDS."""
    requests = family_requests(bench)
    rows = []
    for sl in bench.levels:
        runs = [replay_level(profile, sl, requests, seed) for seed in CHECK_SEEDS]
        tpots = [r.tpot_p50_ms for r in runs if r.tpot_p50_ms is not None]
        rows.append(ShapeRow(sl, statistics.fmean(r.tok_per_s for r in runs),
                             statistics.fmean(tpots) if tpots else None, usable(sl)))
    return rows


def best_shapes(rows: Sequence[ShapeRow]) -> list[BestAt]:
    """Per family and load where two or more shapes have unflagged levels: the fastest
    measured and the fastest replayed among those shapes."""
    groups: dict[tuple[str, int], list[ShapeRow]] = {}
    for r in rows:
        if r.left_out is None:
            groups.setdefault((r.level.family, r.level.level.concurrency), []).append(r)
    out = []
    for (family, streams), here in sorted(groups.items()):
        if len(here) < 2:
            continue
        measured = max(here, key=lambda r: r.level.level.tok_per_s)
        simulated = max(here, key=lambda r: r.tok_per_s)
        margin = measured.level.level.tok_per_s / simulated.level.level.tok_per_s - 1.0
        out.append(BestAt(family, streams, measured.level.shape, simulated.level.shape, margin))
    return out


@dataclass(frozen=True)
class Worst:
    median: float
    worst: float
    worst_at: str
    levels: int


def tok_errors(rows: Sequence[ShapeRow]) -> Worst:
    """The tok/s error over the fitted (unflagged) levels: median and worst, by size."""
    errors = [(r, e) for r in rows if r.left_out is None and (e := r.tok_error) is not None]
    worst, worst_error = max(errors, key=lambda pair: abs(pair[1]))
    return Worst(statistics.median(abs(e) for _, e in errors), worst_error, worst.level.label,
                 len(errors))


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def render(rows: Sequence[ShapeRow], fit: ShapeFit | None = None) -> list[str]:
    """The shapes' terms (when `fit` is given), every level, the error figures, the best shapes
    and the levels left out, as lines."""
    lines = []
    if fit is not None and fit.profile.shapes:
        lines.append(f"{'shape':<8} {'fixed_ms':>9} {'us/position':>12}  accept length")
        for name, cost in fit.profile.shapes.items():
            accept = ", ".join(f"{f} {v:.2f}" for f, v in cost.accept_length.items()) or "-"
            lines.append(f"{name:<8} {cost.fixed_ms:>+9.3f} {cost.us_per_position:>+12.2f}  "
                         f"{accept}")
        lines.append("")
    lines.append(f"{'shape':<8} {'family':<6} {'streams':>7} {'tok/s bench':>12} {'tok/s sim':>10} "
                 f"{'err':>7} {'TPOT bench':>11} {'TPOT sim':>9} {'err':>7}")
    for r in rows:
        lv = r.level.level
        mark = "  left out" if r.left_out else ""
        lines.append(
            f"{r.level.shape:<8} {r.level.family:<6} {lv.concurrency:>7} {lv.tok_per_s:>12,.0f} "
            f"{r.tok_per_s:>10,.0f} {_num(r.tok_error, '+.1%'):>7} "
            f"{_num(lv.tpot_p50_ms, '.2f'):>11} {_num(r.tpot_ms, '.2f'):>9} "
            f"{_num(r.tpot_error, '+.1%'):>7}{mark}")
    errors = tok_errors(rows)
    lines.append(f"tok/s error over the {errors.levels} unflagged levels: median "
                 f"{errors.median:.1%}, worst {errors.worst:+.1%} ({errors.worst_at})")
    best = best_shapes(rows)
    agree = sum(b.agrees for b in best)
    lines.append(f"best shape per load, bench/sim (among the shapes unflagged there): {agree} of "
                 f"{len(best)} agree")
    for b in best:
        differs = f"  differs: the bench ran {b.measured} {b.margin:.1%} faster"
        lines.append(f"  {b.family} c={b.streams}: {b.measured}/{b.simulated}"
                     f"{'' if b.agrees else differs}")
    left = [r for r in rows if r.left_out]
    if left:
        lines.append(f"left out of the fit ({len(left)} levels): " + "; ".join(
            f"{r.level.label} {r.left_out}" for r in left))
    return lines


def to_json(rows: Sequence[ShapeRow], fit: ShapeFit | None = None) -> dict[str, Any]:
    errors = tok_errors(rows)
    return {
        "shapes": {} if fit is None or not fit.profile.shapes else {
            name: cost.model_dump() for name, cost in fit.profile.shapes.items()},
        "rows": [{"shape": r.level.shape, "family": r.level.family,
                  "streams": r.level.level.concurrency,
                  "tok_per_s": {"bench": round(r.level.level.tok_per_s, 2),
                                "sim": round(r.tok_per_s, 2),
                                "error": None if r.tok_error is None else round(r.tok_error, 4)},
                  "tpot_ms": {"bench": r.level.level.tpot_p50_ms, "sim": r.tpot_ms,
                              "error": r.tpot_error},
                  "left_out": r.left_out} for r in rows],
        "tok_error": {"median": round(errors.median, 4), "worst": round(errors.worst, 4),
                      "worst_at": errors.worst_at, "levels": errors.levels},
        "best_shape": [{"family": b.family, "streams": b.streams, "bench": b.measured,
                        "sim": b.simulated, "agrees": b.agrees, "margin": round(b.margin, 4)}
                       for b in best_shapes(rows)],
        "notes": [] if fit is None else fit.notes,
    }  # fmt: skip
