"""`specctl sim fit`: a profile fitted to one or more `specctl bench` results.

What comes straight from the bench (no fitting): the running-request caps, KV pool, prefill
budget and context length the servers reported, the captured depths, and the acceptance per
depth the server's counters measured (tokens per request per iteration at each forced depth,
turned into per-position rates).

What is fitted, in two least-squares passes (scipy.optimize.least_squares, trust-region
reflective, bounds at zero, soft-L1 loss on relative errors):

1. In closed form (`closed_form_residuals`): the step costs against the server's counters,
   the plain server against depth 0, and TTFT against one wave's prefill. Fast, and a start.
2. Through the simulator: each level is replayed with the bench's own protocol
   (`sims.fit.replay`) and the replay's tok/s, TPOT, TTFT, mean step and the server's own TTFT
   and inter-token latency are matched to the measured ones. This is what accounts for the
   closed loop: prefills of new requests stalling decoding, the start-up wave, the running
   cap, the client's own time. It fits the prefill and client fields; the step fields too when
   the first pass could not see every step directly.

Both passes add a weak prior towards the base profile (`sims.fit.params`), which decides only
the fields the bench cannot see. docs/simulator.md describes the fit and its limits.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.optimize import brentq, least_squares

from sims.fit.bench_file import BenchRun, Level
from sims.fit.params import LOOP_KEYS, PARAMS, STEP_KEYS, Vector, read, with_values
from sims.fit.pool import Replayer
from sims.fit.replay import PHASE, LevelShape, Replayed
from sims.policies import graph_batch_sizes, pad_batches
from sims.profile import Profile

PRIOR_WEIGHT = 0.005  # a field e times its base costs as much as a 0.5% misfit on one figure
ROBUST_SCALE = 0.05  # misfits beyond 5% count linearly, not squared (soft L1): outliers
TTFT_WEIGHT = 0.5  # TTFT is the noisiest figure (one prefill decides it)
MISSING = 3.0  # residual of a figure the replay could not produce (nothing finished)
DIFF_STEP = 0.05  # finite differences of the replay: 5% of a field's unit, a visible change


class FitError(ValueError):
    """The benches hold nothing to fit (every level unfit), or contradict each other."""


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


# ----------------------------------------------------------------------------- what is known


def shape_of(level: Level, run_limit: int | None) -> LevelShape:
    assert level.prompt_tokens is not None and level.output_tokens is not None
    return LevelShape(
        depth=level.depth,
        concurrency=level.concurrency,
        prompt_tokens=max(1, round(level.prompt_tokens)),
        output_tokens=max(1, round(level.output_tokens)),
        duration_s=level.elapsed_s,
        request_limit=run_limit,
    )


def measured_accept_lengths(levels: Sequence[Level]) -> dict[int, float]:
    """Mean accept length per forced depth (bonus token included), weighted by requests."""
    sums: dict[int, list[float]] = {}
    for lv in levels:
        if lv.depth is None or lv.accept_length is None:
            continue
        acc = sums.setdefault(lv.depth, [0.0, 0.0])
        acc[0] += lv.accept_length * lv.requests
        acc[1] += lv.requests
    return {d: s / n for d, (s, n) in sorted(sums.items()) if n > 0}


def _rate_over(gain: float, survive: float, steps: int) -> float:
    """The constant per-position rate r with survive * (r + r^2 + ... + r^steps) = gain."""
    if survive <= 0 or gain <= 0:
        return 0.0
    target = gain / survive
    if target >= steps:
        return 1.0
    return float(brentq(lambda r: sum(r**k for k in range(1, steps + 1)) - target, 0.0, 1.0))


def acceptance_rates(lengths: dict[int, float], deepest: int) -> list[float]:
    """Per-position conditional rates p[i] whose chain gives the measured accept lengths.

    L(s) = 1 + S_1 + ... + S_s with S_k = p_1 * ... * p_k. Between two measured depths the
    rate is taken constant (the one that gives the measured gain); past the deepest measured
    depth the last rate holds."""
    known = sorted((d, max(v, 1.0)) for d, v in lengths.items() if d > 0)
    rates: list[float] = []
    depth, ell, survive = 0, 1.0, 1.0
    for d, length in known:
        if d <= depth:
            continue
        r = _rate_over(length - ell, survive, d - depth)
        rates += [r] * (d - depth)
        survive *= r ** (d - depth)
        depth, ell = d, max(length, ell)
    last = rates[-1] if rates else 0.0
    rates += [last] * (deepest - len(rates))
    return [round(r, 4) for r in rates[:deepest]]


def frame(base: Profile, runs: Sequence[BenchRun], levels: Sequence[Level], name: str) -> Profile:
    """The base profile with everything the benches state outright (not fitted)."""
    first = runs[0]
    spec = first.spec
    captured = sorted(
        set(spec.captured_depths) | {lv.depth for lv in levels if lv.depth is not None}
    )
    if not captured:
        captured = list(base.captured_depths)
    deepest = max(max(captured), 1)
    lengths = measured_accept_lengths(levels)
    rates = acceptance_rates(lengths, deepest)
    phases = {PHASE: rates}
    for other, probs in base.acceptance.phases.items():
        if other != PHASE:  # kept so that scenarios naming them still run; not measured
            phases[other] = (list(probs) + [probs[-1]] * deepest)[:deepest]
    positive = [d for d in captured if d > 0]
    full = spec.full_depth if spec.full_depth in positive else (max(positive) if positive else 1)
    if full not in captured:
        captured = sorted({*captured, full})
    prompts = [lv.prompt_tokens for lv in levels if lv.prompt_tokens]
    outputs = [lv.output_tokens for lv in levels if lv.output_tokens]
    prompt = round(float(np.median(prompts))) if prompts else base.reference_workload.prompt_tokens
    output = round(float(np.median(outputs))) if outputs else base.reference_workload.output_tokens
    sched = base.scheduler.model_dump()
    sched["max_running_requests_spec"] = spec.cap
    if first.no_spec is not None:
        sched["max_running_requests_nospec"] = first.no_spec.cap
    for key, value in (
        ("max_total_tokens", spec.max_total_tokens),
        ("max_prefill_tokens", spec.max_prefill_tokens),
        ("context_length", spec.context_length),
    ):
        if value is not None:
            sched[key] = value
    data = base.model_dump()
    data.update(
        name=name,
        scheduler=sched,
        acceptance={"phases": phases, "default_phase": PHASE},
        captured_depths=captured,
        full_depth=full,
        context_tokens=max(1, round(prompt + output / 2)),
        reference_workload={"prompt_tokens": prompt, "output_tokens": output},
    )
    return Profile.model_validate(data)


def active_keys(levels: Sequence[Level]) -> tuple[list[str], dict[str, str]]:
    """The fields these levels can inform, and why each other one keeps the base value."""
    keys = list(STEP_KEYS) + list(LOOP_KEYS)
    kept: dict[str, str] = {}
    contexts = [
        lv.prompt_tokens + lv.output_tokens / 2
        for lv in levels
        if lv.prompt_tokens and lv.output_tokens
    ]
    if not contexts or max(contexts) < 1.5 * min(contexts):
        kept["target.kv_us_per_req_per_1k_ctx"] = (
            "every level ran at about one context length; bench a second prompt length "
            "(--prompt-tokens) and pass both files"
        )
    spec_depths = {lv.depth for lv in levels if lv.depth is not None}
    plain = any(lv.depth is None for lv in levels)
    if len(spec_depths) < 2 or not any(d and d > 0 for d in spec_depths):
        for k in ("draft.step_fixed_ms", "draft.step_us_per_req"):
            kept[k] = "the bench forced fewer than two depths, one of them above 0"
    if not plain or not spec_depths:
        for k in ("draft.extend_fixed_ms", "draft.extend_us_per_req"):
            kept[k] = "needs both servers (the bench had no --no-spec-url)"
    timed = [lv for lv in levels if lv.depth is not None and lv.step_ms]
    if not any(lv.depth == 0 and lv.concurrency == 1 and _per_token_ms(lv) for lv in timed):
        kept["scheduler.untimed_ms"] = (
            "needs depth 0 at concurrency 1 with the server's step counters"
        )
    if not any(lv.ttft_p50_ms or lv.server_ttft_ms for lv in levels):
        for k in (
            "scheduler.prefill_fixed_ms",
            "scheduler.prefill_us_per_token",
            "scheduler.ttft_overhead_ms",
        ):
            kept[k] = "no TTFT measured"
    return [k for k in keys if k not in kept], kept


# ----------------------------------------------------------------------------- pass 1


def _pad(profile: Profile, speculative: bool, batch: float) -> float:
    cap = profile.max_running(speculative)
    b = min(max(round(batch), 1), cap)
    if not profile.scheduler.cuda_graph_padding:
        return float(b)
    sizes = graph_batch_sizes(speculative, cap)
    return float(pad_batches(np.asarray([b], float), sizes)[0])


def _context(level: Level) -> float:
    assert level.prompt_tokens is not None and level.output_tokens is not None
    return level.prompt_tokens + level.output_tokens / 2


def _per_token_ms(level: Level) -> float | None:
    return level.server_itl_ms or level.tpot_p50_ms


def depth0_references(levels: Sequence[Level]) -> dict[tuple[str, int], Level]:
    """The depth-0 level of each (bench, concurrency): the plain server's comparison. Neither
    accepts anything, so at equal concurrency new requests' prefills stall both alike."""
    return {
        (lv.source, lv.concurrency): lv
        for lv in levels
        if lv.depth == 0 and lv.step_ms and _per_token_ms(lv)
    }


def closed_form_residuals(
    profile: Profile, levels: Sequence[Level], refs: dict[tuple[str, int], Level]
) -> list[float]:
    """Relative misfits of what the cost model says outright, without replaying:

    - a speculative level's mean step, as the server's GPU timer sees it;
    - with one stream at depth 0, its time per token: the whole iteration (nothing else runs,
      so nothing stalls it, and nothing is accepted);
    - a plain level's time per token against depth 0's at the same concurrency, as a ratio of
      their steps (prefill stalls cancel); alone with one stream, against its step;
    - TTFT against the prefill of one wave of requests."""
    out: list[float] = []
    untimed = profile.scheduler.untimed_ms

    def step_of(lv: Level) -> float:
        spec = lv.depth is not None
        batch = lv.mean_batch or min(lv.concurrency, profile.max_running(spec))
        return float(profile.iteration_ms(lv.depth, _pad(profile, spec, batch), _context(lv)))

    for lv in levels:
        spec = lv.depth is not None
        step = step_of(lv)
        per_token = _per_token_ms(lv)
        if spec and lv.step_ms:
            out.append(math.log(max(step - untimed, 1e-6) / lv.step_ms))
        ref = refs.get((lv.source, lv.concurrency))
        if per_token and lv.concurrency == 1 and (lv.depth == 0 or (not spec and ref is None)):
            out.append(math.log(step / per_token))
        elif per_token and not spec and ref is not None:
            ref_per_token = _per_token_ms(ref)
            assert ref_per_token is not None
            out.append(math.log(step / step_of(ref) * ref_per_token / per_token))
        ttft_ms = lv.server_ttft_ms or lv.ttft_p50_ms
        if ttft_ms:
            assert lv.prompt_tokens is not None
            s = profile.scheduler
            wave = min(lv.concurrency, profile.max_running(spec)) * lv.prompt_tokens
            ttft = s.prefill_fixed_ms + s.prefill_us_per_token * wave / 1000
            if not lv.server_ttft_ms:
                ttft += s.ttft_overhead_ms
            out.append(TTFT_WEIGHT * math.log(max(ttft, 1e-6) / ttft_ms))
    return out


def client_time_guess(profile: Profile, levels: Sequence[Level]) -> tuple[float, float]:
    """(request_overhead_ms, frontend_ms) implied by tok/s against TTFT and TPOT.

    Per level, the time a closed-loop cycle spends outside TTFT and decoding is the client's
    gap; its growth with concurrency is read as requests waiting for each other in the front
    end (a burst of C waits (C - 1) / 2 front-end times on average)."""
    xs, gaps = [], []
    for lv in levels:
        if not (lv.ttft_p50_ms and lv.tpot_p50_ms and lv.output_tokens and lv.tok_per_s > 0):
            continue
        cycle = 1000.0 * lv.concurrency * lv.output_tokens / lv.tok_per_s
        inside = lv.ttft_p50_ms - profile.scheduler.ttft_overhead_ms
        xs.append((lv.concurrency - 1) / 2)
        gaps.append(cycle - inside - (lv.output_tokens - 1) * lv.tpot_p50_ms)
    if len(set(xs)) < 2:
        gap = float(np.median(gaps)) if gaps else profile.scheduler.request_overhead_ms
        return max(gap, 0.0), profile.scheduler.frontend_ms
    slope, intercept = np.polyfit(xs, gaps, 1)
    return max(float(intercept), 0.0), max(float(slope), 0.0)


# ----------------------------------------------------------------------------- pass 2


def replay_all(
    profile: Profile,
    levels: Sequence[Level],
    limits: dict[str, int | None],
    *,
    seed: int = 0,
    replayer: Replayer | None = None,
) -> list[Replayed]:
    shapes = [shape_of(lv, limits[lv.source]) for lv in levels]
    return (replayer or Replayer()).run(profile, shapes, [seed] * len(shapes))


def _log_ratio(sim: float | None, measured: float | None) -> float | None:
    if measured is None or measured <= 0:
        return None
    if sim is None or sim <= 0:
        return MISSING
    return math.log(sim / measured)


def ttft_weights(level: Level) -> tuple[float, float]:
    """(client TTFT, server TTFT) weights. One stream's TTFT is its prefill plus fixed
    overheads, a direct measurement; with several, it also depends on how arrivals bunched
    into prefill batches, which the client's and the network's timing shape and a replay
    follows only on average. The client's TTFT, beside the server's own, mostly tells the
    client's extra time."""
    alone = level.concurrency == 1
    server = 1.0 if alone else 0.25
    if level.server_ttft_ms is None:
        return (TTFT_WEIGHT if alone else TTFT_WEIGHT / 2), 0.0
    return (0.25 if alone else 0.1), server


def replay_residuals(levels: Sequence[Level], sims: Sequence[Replayed]) -> list[float]:
    out: list[float] = []
    for lv, sim in zip(levels, sims, strict=True):
        client_w, server_w = ttft_weights(lv)
        for r, w in (
            (_log_ratio(sim.tok_per_s, lv.tok_per_s), 1.0),
            (_log_ratio(sim.tpot_p50_ms, lv.tpot_p50_ms), 1.0),
            (_log_ratio(sim.step_ms, lv.step_ms if lv.depth is not None else None), 1.0),
            (_log_ratio(sim.ttft_p50_ms, lv.ttft_p50_ms), client_w),
            (_log_ratio(sim.server_itl_ms, lv.server_itl_ms), 1.0),
            (_log_ratio(sim.server_ttft_ms, lv.server_ttft_ms), server_w),
        ):
            if r is not None:
                out.append(w * r)
    return out


# ----------------------------------------------------------------------------- the fit


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


def steps_measured(levels: Sequence[Level], refs: dict[tuple[str, int], Level]) -> bool:
    """Whether the first pass saw every step directly: each speculative level's from the
    server's counters, each plain level's against depth 0 at its concurrency (or alone)."""
    return all(
        lv.step_ms
        if lv.depth is not None
        else lv.concurrency == 1 or (lv.source, lv.concurrency) in refs
        for lv in levels
    )


def client_time_caps(levels: Sequence[Level], step_ms: float) -> dict[str, float]:
    """Upper bounds the data sets on the client-side fields. A request alone passes the front
    end once and then meets nothing in the queue: its client TTFT less the server's bounds
    both the front end's time and the client's extra TTFT. Without the bound a busy client's
    delays at high concurrency could be read as a slow front end, which would split prefills
    in the replay that the server ran together."""
    gaps = [
        lv.ttft_p50_ms - lv.server_ttft_ms
        for lv in levels
        if lv.concurrency == 1 and lv.ttft_p50_ms and lv.server_ttft_ms
    ]
    if not gaps:
        return {}
    cap = max(1.5 * float(np.median(gaps)), 0.05 * step_ms)
    return {"scheduler.frontend_ms": cap, "scheduler.ttft_overhead_ms": cap}


def typical_step_ms(levels: Sequence[Level]) -> float:
    steps = [v for lv in levels if (v := lv.step_ms or lv.tpot_p50_ms)]
    return float(np.median(steps)) if steps else 10.0


def largest_forward_tokens(profile: Profile, levels: Sequence[Level]) -> float:
    return float(
        max(
            min(lv.concurrency, profile.max_running(lv.depth is not None)) * ((lv.depth or 0) + 1)
            for lv in levels
        )
    )


def _solve(
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


def fit_profile(
    runs: Sequence[BenchRun],
    base: Profile,
    name: str,
    *,
    max_iterations: int = 8,
    progress: Callable[[str], None] | None = None,
    replayer: Replayer | None = None,
) -> FitResult:
    """Fit `base`'s costs to the benches; see the module docstring."""
    t0 = time.perf_counter()
    say = progress or (lambda _msg: None)
    replayer = replayer or Replayer()
    levels, unfit = split_levels(runs)
    if not levels:
        reasons = "; ".join(f"{u.level.label}: {u.reason}" for u in unfit[:5])
        raise FitError(f"no level can be fitted ({reasons})")
    spec_caps = {run.spec.cap for run in runs}
    if len(spec_caps) > 1:
        raise FitError(
            f"the benches ran speculative servers with different running caps {sorted(spec_caps)}; "
            "fit one server configuration at a time"
        )
    limits = {run.path: run.request_limit for run in runs}
    framed = frame(base, runs, levels, name)
    keys, kept = active_keys(levels)
    step_ms = typical_step_ms(levels)
    tokens = largest_forward_tokens(framed, levels)
    evaluations = 0

    # Pass 1: closed form (deterministic costs, no noise needed).
    refs = depth0_references(levels)
    caps = client_time_caps(levels, step_ms)
    vec = Vector.around(framed, framed, keys, step_ms, tokens, caps)

    def pass1(z: np.ndarray) -> np.ndarray:
        nonlocal evaluations
        evaluations += 1
        prof = with_values(framed, vec.values(z))
        fit = closed_form_residuals(prof, levels, refs)
        return np.array(fit + vec.prior_residuals(z, PRIOR_WEIGHT), dtype=float)

    say(f"pass 1: closed-form step costs ({len(levels)} levels, {len(keys)} fields)")
    first = _solve(pass1, vec, framed, max_nfev=200)
    start = with_values(framed, vec.values(first.x))
    overhead, frontend = client_time_guess(start, levels)
    guesses = {"scheduler.request_overhead_ms": overhead, "scheduler.frontend_ms": frontend}
    start = with_values(start, {k: v for k, v in guesses.items() if k in keys})

    # Pass 2: the replay. No step noise: the same parameters always give the same figures.
    # The closed loop's own fields with the step costs held; then everything together, unless
    # the server's counters measured every step the first pass fitted (their time per token
    # in a closed loop also carries how requests happened to bunch up, which one replay does
    # not repeat exactly: it would only add noise to a step measured outright).
    current = start.model_copy(update={"step_time_cv": 0.0})
    notes: list[str] = []
    loop = [k for k in keys if k in LOOP_KEYS]
    stages = [("prefill and client time", loop, max_iterations)]
    if not steps_measured(levels, refs):
        stages.append(("every field", keys, max(2, max_iterations // 3)))
    for stage, stage_keys, iterations in stages:
        if not stage_keys:
            continue
        sub = Vector.around(framed, current, stage_keys, step_ms, tokens, caps)
        frozen = current

        def pass2(z: np.ndarray, sub: Vector = sub, frozen: Profile = frozen) -> np.ndarray:
            nonlocal evaluations
            evaluations += 1
            prof = with_values(frozen, sub.values(z))
            sims = replay_all(prof, levels, limits, replayer=replayer)
            return np.asarray(replay_residuals(levels, sims) + sub.prior_residuals(z, PRIOR_WEIGHT))

        say(f"pass 2 ({stage}): replaying {len(levels)} levels per evaluation")
        second = _solve(pass2, sub, frozen, diff_step=DIFF_STEP, ftol=1e-3, max_nfev=iterations)
        current = with_values(frozen, sub.values(second.x))
        if second.status < 0:
            notes.append(f"pass 2 ({stage}) failed: {second.message}")
    fitted = current.model_copy(update={"step_time_cv": framed.step_time_cv})
    return FitResult(
        profile=fitted,
        levels=levels,
        unfit=unfit,
        keys=tuple(keys),
        kept=kept,
        evaluations=evaluations,
        seconds=time.perf_counter() - t0,
        accept_lengths=measured_accept_lengths(levels),
        notes=notes,
    )


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
