"""The real trace against the simulated one: per policy both tok/s, their ratio and ranks, the
two checks (the same ranking; tok/s within 5% per policy), and the real runs' own noise: each
real mean's 95% interval, from the run-to-run spread pooled over the policies
(benchmarks/gpu/seeded/criterion.py), and whether the simulated figure falls inside it. Where
the real means are not known to 5%, the 5% check is answered by that interval."""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from statistics import fmean

from scipy import stats

from benchmarks.gpu.seeded import criterion
from benchmarks.gpu.seeded.trace import Phase

TOLERANCE = 0.05  # "tok/s within 5% per policy"


@dataclass(frozen=True)
class Row:
    policy: str
    real: float  # mean over the repeats
    sim: float | None  # mean over the seeds; None: not simulated
    note: str = ""
    real_rank: int | None = None  # among the policies both ran; 1 the fastest
    sim_rank: int | None = None

    @property
    def ratio(self) -> float | None:
        return None if self.sim is None or self.real <= 0 else self.sim / self.real


@dataclass(frozen=True)
class Check:
    met: bool
    worst: str  # the policy furthest from meeting it, with the figures


def _ranks(values: dict[str, float]) -> dict[str, int]:
    """1 for the fastest; equal tok/s share a rank (1, 2, 2, 4), so a tie the other trace
    does not have counts as a different ranking."""
    return {name: 1 + sum(other > v for other in values.values()) for name, v in values.items()}


def rows(real: dict[str, list[float]], sim: dict[str, list[float]],
         notes: dict[str, str]) -> list[Row]:  # fmt: skip
    """One row per policy of the real trace, in its order; ranks among those simulated."""
    both = [p for p in real if sim.get(p)]
    real_rank = _ranks({p: fmean(real[p]) for p in both})
    sim_rank = _ranks({p: fmean(sim[p]) for p in both})
    return [Row(p, fmean(real[p]), fmean(sim[p]) if sim.get(p) else None, notes.get(p, ""),
                real_rank.get(p), sim_rank.get(p)) for p in real]  # fmt: skip


def ranking_check(table: list[Row]) -> Check:
    """Met when every simulated policy has its real rank; the worst moved the most."""
    moved = {r.policy: (abs(r.real_rank - r.sim_rank), r) for r in table
             if r.real_rank is not None and r.sim_rank is not None}  # fmt: skip
    if not moved:
        return Check(False, "no policy was simulated")
    gap, worst = max(moved.values(), key=lambda m: (m[0], -(m[1].real_rank or 0)))
    return Check(gap == 0, f"{worst.policy}, real rank {worst.real_rank}, "
                           f"simulated {worst.sim_rank}")  # fmt: skip


def tolerance_check(table: list[Row], tolerance: float = TOLERANCE) -> Check:
    """Met when every simulated policy is within `tolerance` of its real tok/s."""
    off = {r.policy: (abs(r.ratio - 1.0), r.ratio) for r in table if r.ratio is not None}
    if not off:
        return Check(False, "no policy was simulated")
    worst = max(off, key=lambda p: off[p][0])
    return Check(off[worst][0] <= tolerance,
                 f"{worst}, simulated / real {off[worst][1]:.3f}")  # fmt: skip


def noise_check(table: list[Row], real: Mapping[str, Sequence[float]],
                same_runs: Collection[str] = ()) -> tuple[Check, str] | None:
    """Met when every simulated policy lies inside its real mean's 95% interval; with the
    spread it was read from. None where no policy has two real runs."""
    try:
        sd, df = criterion.pooled_spread(real, same_runs)
    except criterion.CriterionError:
        return None
    t = float(stats.t.ppf(0.975, df))
    ratios = {r.policy: r.ratio for r in table
              if r.ratio is not None and r.real > 0 and real.get(r.policy)}
    if not ratios:
        return None
    # each interval's half-width as a share of the real mean
    half = {p: t * sd / math.sqrt(len(real[p])) / fmean(real[p]) for p in ratios}
    # the policy whose simulated figure lies furthest out, in units of its interval
    worst = max(ratios, key=lambda p: abs(ratios[p] - 1.0) / half[p])
    grand = fmean(v for name, runs in real.items() if name not in same_runs for v in runs)
    spread = (f"the real runs' spread, pooled over the policies: sd {sd:,.0f} tok/s "
              f"({sd / grand:.1%} of a run), {df} degrees of freedom; each real mean's 95% "
              f"interval is +-{min(half.values()):.1%} to +-{max(half.values()):.1%}")
    met = all(abs(ratios[p] - 1.0) <= half[p] for p in ratios)
    return Check(met, f"{worst}, simulated / real {ratios[worst]:.3f} against "
                      f"+-{half[worst]:.1%}"), spread  # fmt: skip


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def render(table: list[Row], header: list[str],
           real: Mapping[str, Sequence[float]] | None = None,
           same_runs: Collection[str] = ()) -> str:  # fmt: skip
    lines = [*header, "",
             "| policy | real tok/s | simulated tok/s | sim / real | real rank | sim rank |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for r in table:
        ratio = "-" if r.ratio is None else f"{r.ratio:.3f}"
        lines.append(f"| {r.policy} | {_num(r.real)} | {_num(r.sim)} | {ratio} | "
                     f"{r.real_rank or '-'} | {r.sim_rank or '-'} |")  # fmt: skip
    skipped = [r for r in table if r.sim is None]
    if skipped:
        lines.append("")
        lines += [f"{r.policy}: not simulated: {r.note}" for r in skipped]
    rank, close = ranking_check(table), tolerance_check(table)
    lines += ["",
              f"- the simulated trace ranks the policies as the real one does: "
              f"{'met' if rank.met else 'not met'} (worst: {rank.worst})",
              f"- tok/s within {TOLERANCE:.0%} per policy: {'met' if close.met else 'not met'} "
              f"(worst: {close.worst})"]  # fmt: skip
    noise = noise_check(table, real, same_runs) if real else None
    if noise is not None:
        check, spread = noise
        lines.append(f"- tok/s inside the real mean's 95% interval per policy: "
                     f"{'met' if check.met else 'not met'} (worst: {check.worst}); {spread}")
    return "\n".join(lines)


def render_phases(phases: Sequence[Phase], real: dict[str, list[float]],
                  sim: dict[str, list[float]]) -> str:  # fmt: skip
    """Per policy and phase, the real tok/s (mean of its repeats), the simulated one and their
    ratio: where the simulator parts from the server."""
    names = [f"{p.seconds:g} s, {p.concurrency} on {p.dataset}" for p in phases]
    lines = ["Per phase, real / simulated tok/s (simulated over real):", "",
             "| policy | " + " | ".join(names) + " |",
             "| --- |" + " ---: |" * len(names)]  # fmt: skip
    for policy, values in real.items():
        cells = []
        for i, value in enumerate(values):
            got = sim.get(policy)
            cells.append(f"{value:,.0f} / -" if not got else
                         f"{value:,.0f} / {got[i]:,.0f} ({got[i] / value:.2f})" if value > 0
                         else f"0 / {got[i]:,.0f}")  # fmt: skip
        lines.append(f"| {policy} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
