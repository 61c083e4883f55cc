"""`specctl sim fit`: a profile fitted to one or more `specctl bench` results.

What comes straight from the bench (no fitting, `sims.fit.framing`): the running-request caps,
KV pool, prefill budget and context length the servers reported, the captured depths, the
off path (what depth 0 ran), and the acceptance per depth the server's counters measured.

What is fitted, in two passes, each by scipy.optimize:

1. In closed form (`sims.fit.closed_form`), by least_squares (trust-region reflective, bounds
   at zero, soft-L1 loss on relative errors): the step costs against the server's counters,
   the plain server against depth 0, and TTFT against one wave's prefill. Fast, and a start.
2. Through the simulator (`sims.fit.replay_cost`), by minimize's Powell method (derivative
   free: a replay's figures move in steps, as requests do, and the host floor is a hinge that
   shows only where it exceeds the forward, so finite differences mislead): each level is
   replayed with the bench's own protocol and its tok/s, TPOT, TTFT, mean step, mean batch
   and the server's own TTFT and inter-token latency are matched to the measured ones, on two
   seeds. This is what accounts for the closed loop: prefills of new requests stalling
   decoding, the start-up wave, the front end, the client's own time, the host floor. It fits
   those fields; the step fields too when the first pass could not see every step directly.

Both passes add a weak prior towards the base profile (`sims.fit.params`), which decides only
the fields the bench cannot see. A level that the fit of the others still misses by more than
`OUTLIER_ERROR` is an outlier (`sims.fit.outliers`): left out, and named with the reason.
docs/simulator.md describes the fit and its limits.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.optimize import least_squares, minimize

from sims.fit.bench_file import BenchRun, Level
from sims.fit.closed_form import (
    client_time_caps,
    client_time_guess,
    closed_form_residuals,
    depth0_references,
    host_floor_guesses,
    largest_batch,
    largest_forward_tokens,
    prefill_split,
    steps_measured,
    typical_step_ms,
)
from sims.fit.framing import (
    FitError,
    active_keys,
    frame,
    measured_accept_lengths,
    off_path_note,
    repeat_note,
)
from sims.fit.outliers import OUTLIER_ERROR, Outlier, level_errors, outlier_reason
from sims.fit.params import LOOP_KEYS, PARAMS, Vector, read, with_values
from sims.fit.pool import Replayer
from sims.fit.repeats import Repeat, find_repeats, pool_repeats
from sims.fit.replay_cost import ROBUST_SCALE, replay_cost, robust_cost
from sims.profile import Profile

PRIOR_WEIGHT = 0.005  # a field e times its base costs as much as a 0.5% misfit on one figure
SEARCH_SEEDS = (0, 1)
SEARCH_EVALUATIONS = 300  # replays of every level (per seed) the second pass may spend
OUTLIER_SHARE = 0.1  # at most this share of the levels (and at least one) may be set aside
CANDIDATES = 3  # the worst-missed levels tried as the outlier, each refitted without
START_MARGIN = 0.05  # a second pass from another start must cost this much less to be taken
# The closed loop's shape, which the replay alone tells apart: the first pass holds them.
SHAPE_KEYS = (
    "scheduler.frontend_ms",
    "scheduler.dispatch_ms",
    "scheduler.client_us_per_stream",
    "scheduler.request_overhead_cv",
)

__all__ = ["FitError", "FitResult", "Outlier", "Unfit", "fit_profile"]


@dataclass(frozen=True)
class Unfit:
    level: Level
    reason: str


@dataclass
class FitResult:
    profile: Profile
    levels: list[Level]  # the fitted ones
    unfit: list[Unfit]
    keys: tuple[str, ...]  # fitted fields
    kept: dict[str, str]  # field -> why it kept the base value
    evaluations: int
    seconds: float
    accept_lengths: dict[int, float]
    notes: list[str] = field(default_factory=list)
    outliers: list[Outlier] = field(default_factory=list)  # left out of the fit, with why
    cost: float = math.nan  # the second pass's last cost (replay misfit and prior)
    repeats: list[Repeat] = field(default_factory=list)  # levels several benches measured alike
    pooled: bool = False  # those levels fitted as the mean of their repeats


def framed_only(
    runs: Sequence[BenchRun],
    profile: Profile,
    *,
    off_path: str | None = None,
    pool: bool = False,
) -> FitResult:
    """`profile` as the benches frame it (their limits, acceptance, request shape and depth-0
    mode, as a fit frames its base) with no cost fitted: what `specctl sim replay` sets
    against the benches. Raises FitError where no level can be replayed."""
    t0 = time.perf_counter()
    levels, unfit, repeats = chosen_levels(runs, pool, "replayed")
    framed = frame(profile, runs, levels, profile.name, off_path)
    notes = [note] if (note := off_path_note(runs, profile, off_path)) else []
    notes += [repeat_note(run.path) for run in runs if run.prompts_came_round]
    return FitResult(
        profile=framed, levels=levels, unfit=unfit, keys=(), kept={}, evaluations=0,
        seconds=time.perf_counter() - t0, accept_lengths=measured_accept_lengths(levels),
        notes=notes, repeats=repeats, pooled=pool,
    )  # fmt: skip


def chosen_levels(runs: Sequence[BenchRun], pool: bool, doing: str
                  ) -> tuple[list[Level], list[Unfit], list[Repeat]]:
    """The levels a fit or a replay works on (`pool`: repeats as their mean), those it cannot,
    and the repeats among them. Raises FitError, saying what cannot be `doing`, where none is
    left."""
    levels, unfit = split_levels(runs)
    repeats = find_repeats(levels)
    if pool:
        levels = pool_repeats(levels)
    if not levels:
        reasons = "; ".join(f"{u.level.label}: {u.reason}" for u in unfit[:5])
        raise FitError(f"no level can be {doing} ({reasons})")
    return levels, unfit, repeats


def split_levels(runs: Sequence[BenchRun]) -> tuple[list[Level], list[Unfit]]:
    fit: list[Level] = []
    unfit: list[Unfit] = []
    for run in runs:
        for lv in run.levels:
            reason = lv.unfit_reason()
            if reason is None:
                fit.append(lv)
            else:
                unfit.append(Unfit(lv, reason))
    return fit, unfit


def _least_squares(
    residuals: Callable[[np.ndarray], np.ndarray], vec: Vector, start: Profile, **options: Any
) -> Any:
    lo, hi = vec.bounds()
    return least_squares(
        residuals,
        vec.encode(start),
        bounds=(lo, hi),
        method="trf",
        loss="soft_l1",
        f_scale=ROBUST_SCALE,
        **options,
    )


@dataclass
class _Fitter:
    """One fit of `levels`: the framed profile, what sizes the fields, what was spent."""

    runs: Sequence[BenchRun]
    levels: list[Level]
    framed: Profile
    keys: list[str]
    replayer: Replayer
    say: Callable[[str], None]
    evaluations: int = 0
    cost: float = math.nan

    def __post_init__(self) -> None:
        self.limits = {run.path: run.request_limit for run in self.runs}
        self.step_ms = typical_step_ms(self.levels)
        self.tokens = largest_forward_tokens(self.framed, self.levels)
        self.requests = largest_batch(self.framed, self.levels)
        self.caps = client_time_caps(self.levels, self.step_ms)
        self.refs = depth0_references(self.levels)

    def vector(self, start: Profile, keys: Sequence[str]) -> Vector:
        return Vector.around(
            self.framed, start, keys, self.step_ms, self.tokens, self.caps, self.requests
        )

    def closed_form(self) -> Profile:
        """Pass 1, then closed-form starts for the client's fields and the host floor."""
        keys = [k for k in self.keys if k not in SHAPE_KEYS]
        vec = self.vector(self.framed, keys)

        def residuals(z: np.ndarray) -> np.ndarray:
            self.evaluations += 1
            prof = with_values(self.framed, vec.values(z))
            fit = closed_form_residuals(prof, self.levels, self.refs)
            return np.array(fit + vec.prior_residuals(z, PRIOR_WEIGHT), dtype=float)

        self.say(f"pass 1: closed-form step costs ({len(self.levels)} levels, {len(keys)} fields)")
        first = _least_squares(residuals, vec, self.framed, max_nfev=200)
        start = with_values(self.framed, vec.values(first.x))
        guesses = client_time_guess(start, self.levels)
        guesses.update(host_floor_guesses(start, self.levels))
        return with_values(start, {k: v for k, v in guesses.items() if k in self.keys})

    def search(self, start: Profile, keys: Sequence[str], budget: int, stage: str) -> Profile:
        """Pass 2 over `keys` from `start` (step noise off: the same fields, the same figures)."""
        vec = self.vector(start, keys)
        frozen = start.model_copy(update={"step_time_cv": 0.0})

        def cost(x: np.ndarray) -> float:
            self.evaluations += 1
            values = vec.log_values(x)
            prof = with_values(frozen, values)
            prior = robust_cost(vec.prior_of(values, PRIOR_WEIGHT))
            fit = replay_cost(prof, self.levels, self.limits, SEARCH_SEEDS, self.replayer)
            return fit + prior

        self.say(f"pass 2 ({stage}): replaying {len(self.levels)} levels per evaluation")
        found = minimize(
            cost,
            np.asarray(vec.log_encode(start)),
            method="Powell",
            bounds=vec.log_bounds(),
            options={"maxfev": budget, "xtol": 0.02, "ftol": 1e-3},
        )
        self.cost = float(found.fun)
        return with_values(start, vec.log_values(found.x))


def _fit_levels(
    runs: Sequence[BenchRun],
    base: Profile,
    name: str,
    levels: list[Level],
    unfit: list[Unfit],
    *,
    budget: int,
    say: Callable[[str], None],
    replayer: Replayer,
    off_path: str | None,
    keep: Sequence[str] = (),
    warm: Profile | None = None,
) -> FitResult:
    """One fit of `levels` (both passes). `warm`: a fit of most of the same levels, whose
    closed-loop fields start the second pass (an outlier's refit). `keep`: fields held at the
    base's value whatever the benches could tell."""
    t0 = time.perf_counter()
    framed = frame(base, runs, levels, name, off_path)
    keys, kept = active_keys(levels, framed.draft.extend_at_depth0,
                             framed.draft.prefill_at_depth0,
                             framed.draft.plain_decode_at_depth0)
    for key in keep:
        kept.setdefault(key, "held at the base's value (--keep)")
    keys = [k for k in keys if k not in keep]
    fitter = _Fitter(runs, levels, framed, keys, replayer, say)
    start = fitter.closed_form()
    loop = [k for k in keys if k in LOOP_KEYS]
    starts = [start]
    if warm is not None:
        starts = [with_values(start, {k: read(warm, k) for k in loop})]
    elif "scheduler.dispatch_ms" in loop and (split := prefill_split(start, levels)):
        # A kept field stays as it is in every start, the split's too.
        starts.append(with_values(start, {k: v for k, v in split.items() if k in keys}))
    current = start
    if loop:
        # From each start; a later one is taken only if it fits clearly better (the first is
        # the closed form's, which the others only rearrange).
        best_cost = math.inf
        for i, begin in enumerate(starts, 1):
            stage = "the closed loop" + (f", start {i} of {len(starts)}" if len(starts) > 1 else "")
            found = fitter.search(begin, loop, budget, stage)
            if fitter.cost < (1.0 - START_MARGIN) * best_cost:
                current, best_cost = found, fitter.cost
        fitter.cost = best_cost
    if not steps_measured(levels, fitter.refs):
        current = fitter.search(current, keys, budget // 2, "every field")
    notes = [note] if (note := off_path_note(runs, base, off_path)) else []
    notes += [repeat_note(run.path) for run in runs if run.prompts_came_round]
    return FitResult(
        profile=current.model_copy(update={"step_time_cv": framed.step_time_cv}),
        levels=levels,
        unfit=unfit,
        keys=tuple(keys),
        kept=kept,
        evaluations=fitter.evaluations,
        seconds=time.perf_counter() - t0,
        accept_lengths=measured_accept_lengths(levels),
        notes=notes,
        cost=fitter.cost,
    )


def fit_profile(
    runs: Sequence[BenchRun],
    base: Profile,
    name: str,
    *,
    budget: int = SEARCH_EVALUATIONS,
    progress: Callable[[str], None] | None = None,
    replayer: Replayer | None = None,
    off_path: str | None = None,
    set_aside: bool = True,
    pool: bool = False,
    keep: Sequence[str] = (),
) -> FitResult:
    """Fit `base`'s costs to the benches; see the module docstring.

    With `pool`, a level that several bench files measured alike is fitted (and judged) as
    their mean (`sims.fit.repeats.pool_repeats`) instead of once per bench. Fields in `keep`
    hold the base's value (a term the user has reason to pin, or to test the fit without).

    With `set_aside`, the level that the fit misses worst, by more than `OUTLIER_ERROR` in
    tok/s or TPOT, is refitted without: if the fit of the others still misses it by that much
    it is an outlier, left out (so that it does not bend the others) and reported with the
    reason; then the next, at most `OUTLIER_SHARE` of the levels. A level the refit
    reproduces is kept, and the search stops."""
    t0 = time.perf_counter()
    say = progress or (lambda _msg: None)
    replayer = replayer or Replayer()
    levels, unfit, repeats = chosen_levels(runs, pool, "fitted")
    spec_caps = {run.spec.cap for run in runs}
    if len(spec_caps) > 1:
        raise FitError(
            f"the benches ran speculative servers with different running caps {sorted(spec_caps)}; "
            "fit one server configuration at a time"
        )
    limits = {run.path: run.request_limit for run in runs}
    unknown = [k for k in keep if k not in PARAMS]
    if unknown:
        raise FitError(
            f"--keep {unknown[0]}: not a fitted field; one of {', '.join(PARAMS)}"
        )
    options: dict[str, Any] = {
        "say": say, "replayer": replayer, "off_path": off_path, "keep": tuple(keep)
    }  # fmt: skip
    result = _fit_levels(runs, base, name, levels, unfit, budget=budget, **options)
    evaluations = result.evaluations
    outliers: list[Outlier] = []
    most = max(1, int(OUTLIER_SHARE * len(levels)))
    while set_aside and len(outliers) < most and len(result.levels) > 2:
        errors = level_errors(result.profile, result.levels, limits, replayer, SEARCH_SEEDS)
        missed = sorted((e for e in errors if e.worst > OUTLIER_ERROR), key=lambda e: -e.worst)
        if not missed:
            break
        # An anomalous level can bend the fit so far that another is missed worse: each of
        # the worst few is refitted without, and the one whose absence fits the rest best goes.
        trials = []
        for candidate in missed[:CANDIDATES]:
            say(f"refitting without {candidate.level.label}, which the fit misses by "
                f"{100 * candidate.worst:.0f}%")  # fmt: skip
            rest = [lv for lv in result.levels if lv is not candidate.level]
            refit = _fit_levels(
                runs, base, name, rest, unfit, budget=budget // CANDIDATES,
                warm=result.profile, **options,
            )  # fmt: skip
            evaluations += refit.evaluations
            trials.append((refit.cost, candidate.level, refit))
        _, level, refit = min(trials, key=lambda trial: trial[0])
        again = level_errors(refit.profile, [level], limits, replayer, SEARCH_SEEDS)[0]
        if again.worst <= OUTLIER_ERROR:
            break  # the others bent the fit; without them it holds: not an outlier
        outliers.append(Outlier(level, outlier_reason(again, result.levels)))
        result = refit
    result.outliers = outliers
    result.repeats, result.pooled = repeats, pool
    result.evaluations = evaluations
    result.seconds = time.perf_counter() - t0
    return result


def describe_fields(result: FitResult, base: Profile) -> list[dict[str, Any]]:
    rows = []
    for key, p in PARAMS.items():
        rows.append(
            {
                "field": key,
                "value": round(read(result.profile, key), 5),
                "base": round(read(base, key), 5),
                "fitted": key in result.keys,
                "kept_because": result.kept.get(key),
                "meaning": p.meaning,
            }
        )
    return rows
