"""What a bench states outright, before anything is fitted: each level's protocol, the
acceptance per depth, the servers' limits and the off path; which fields the levels can inform
(`active_keys`), and why the others keep the base profile's values."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.optimize import brentq

from sglang_hooks.contract import OFF_PATH_SGLANG, OFF_PATH_SPECCTL
from sims.fit.bench_file import BenchRun, Level, ServerFacts
from sims.fit.params import LOOP_KEYS, STEP_KEYS
from sims.fit.replay import PHASE, LevelShape
from sims.profile import Profile


class FitError(ValueError):
    """The benches hold nothing to fit (every level unfit), or contradict each other."""


def shape_of(level: Level, run_limit: int | None) -> LevelShape:
    assert level.prompt_tokens is not None and level.output_tokens is not None
    return LevelShape(
        depth=level.depth,
        concurrency=level.concurrency,
        prompt_tokens=max(1, round(level.prompt_tokens)),
        output_tokens=max(1, round(level.output_tokens)),
        duration_s=level.elapsed_s,
        request_limit=run_limit,
        warmup_s=level.warmup_s,
        output_range=output_range(level),
    )


# A spread is replayed as uniform over [shortest, longest] only where the mean sits this close
# to the middle (as `benchmarks.gpu.seeded.datasets --output-tokens LOW:HIGH` makes them); a
# skewed spread (a ShareGPT dump: most replies short, a few long) keeps the mean for all.
UNIFORM_MIDDLE = 0.1


def output_range(level: Level) -> tuple[int, int] | None:
    """The level's output lengths as a range, when they spread about evenly; None when all were
    equal, the spread is skewed, or the bench did not record them."""
    low, high, mean = level.output_tokens_min, level.output_tokens_max, level.output_tokens
    if low is None or high is None or mean is None or low >= high:
        return None
    if abs(mean - (low + high) / 2) > UNIFORM_MIDDLE * (high - low):
        return None
    return (low, high)


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


def per_token_ms(level: Level) -> float | None:
    """Time per token after the first: the server's own mean where it has one."""
    return level.server_itl_ms or level.tpot_p50_ms


# Whether depth 0 ran the draft extend, by the plugin's off path: SGLang's own depth 0 runs it,
# the plugin's skips it (on every SGLang version it supports).
OFF_PATHS = {OFF_PATH_SGLANG: True, OFF_PATH_SPECCTL: False}


def extend_at_depth0(runs: Sequence[BenchRun], base: Profile, off_path: str | None) -> bool:
    """Whether the benched server's depth 0 ran the draft extend: `off_path` (given), else the
    plugin's path the bench recorded, else the base profile's assumption."""
    path = off_path or runs[0].spec.off_path
    if path is None:
        return base.draft.extend_at_depth0
    if path not in OFF_PATHS:
        raise FitError(
            f"off path {path!r} is not one of {', '.join(OFF_PATHS)} (the plugin's depth-0 paths)"
        )
    return OFF_PATHS[path]


def prefill_at_depth0(runs: Sequence[BenchRun], base: Profile, extend: bool) -> bool:
    """Whether the benched server's admissions at depth 0 ran the draft's prefill: not where
    the bench recorded the plugin's skip on the plugin's path (`extend`: depth 0 ran the draft
    extend, which the skip follows); else the base profile's assumption."""
    skip = runs[0].spec.skip_draft_prefill
    if skip is None:
        return base.draft.prefill_at_depth0
    return extend or not skip


def plain_decode_at_depth0(runs: Sequence[BenchRun]) -> bool:
    """Whether the benched server ran depth 0 as a plain decode: as the benches recorded the
    plugin's DECODE runners; a bench that recorded none predates the path (or the plugin did
    not report it), and its depth 0 ran through the verify. The profile holds one depth-0
    path, so benches of both cannot share a fit."""
    seen = {bool(run.spec.plain_decode) for run in runs}
    if len(seen) > 1:
        plain = [run.path for run in runs if run.spec.plain_decode]
        raise FitError(
            f"the benches ran depth 0 two ways: as a plain decode in {', '.join(plain)}, through "
            f"the verify in the others; the profile holds one, so fit them apart"
        )
    return seen.pop()


def off_path_note(runs: Sequence[BenchRun], base: Profile, off_path: str | None) -> str | None:
    """A line when the depth-0 path is the base profile's guess, not the server's."""
    if off_path or runs[0].spec.off_path:
        return None
    ran = "runs" if base.draft.extend_at_depth0 else "skips"
    return (
        f"the bench did not record the plugin's off path: depth 0 taken to be as the base "
        f"profile has it (it {ran} the draft extend); give --off-path if the server ran another"
    )


def repeat_note(path: str) -> str:
    """A line for a bench whose prompts came round within a server's KV pool."""
    return (
        f"{path}: its prompts came round within a server's KV pool, so its prefix cache may "
        "have served repeats whole (one token left to prefill, which SGLang's plain server "
        "runs eager); the model has no prefix cache, so its prefill fields take that in: "
        "fit benches of more prompts than requests"
    )


def recv_interval(runs: Sequence[BenchRun]) -> int | None:
    """The --scheduler-recv-interval every benched server ran with (None: none recorded). The
    profile holds one value for both servers, so benches that differ cannot share a fit."""
    seen = {
        facts.recv_interval
        for run in runs
        for facts in (run.spec, run.no_spec)
        if facts is not None and facts.recv_interval is not None
    }
    if len(seen) > 1:
        raise FitError(
            f"the benched servers ran with different --scheduler-recv-interval values "
            f"({', '.join(map(str, sorted(seen)))}): the profile holds one; fit benches of "
            f"servers started with the same value"
        )
    return seen.pop() if seen else None


def stated_limits(facts: ServerFacts, recv: int | None) -> dict[str, int]:
    """The scheduler limits a server states outright (its KV pool, prefill budget, context
    length) and its request-polling interval `recv`, where they are known."""
    stated = (("max_total_tokens", facts.max_total_tokens),
              ("max_prefill_tokens", facts.max_prefill_tokens),
              ("context_length", facts.context_length), ("recv_interval", recv))  # fmt: skip
    return {key: value for key, value in stated if value is not None}


def frame(
    base: Profile,
    runs: Sequence[BenchRun],
    levels: Sequence[Level],
    name: str,
    off_path: str | None = None,
) -> Profile:
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
    sched.update(stated_limits(spec, recv_interval(runs)))
    data = base.model_dump()
    extend = data["draft"]["extend_at_depth0"] = extend_at_depth0(runs, base, off_path)
    data["draft"]["prefill_at_depth0"] = prefill_at_depth0(runs, base, extend)
    data["draft"]["plain_decode_at_depth0"] = plain_decode_at_depth0(runs)
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


def active_keys(
    levels: Sequence[Level], extend_at_depth0: bool = True, prefill_at_depth0: bool = True,
    plain_decode_at_depth0: bool = False,
) -> tuple[list[str], dict[str, str]]:
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
    drafting = sorted(d for d in spec_depths if d and d > 0)
    extend = ("draft.extend_fixed_ms", "draft.extend_us_per_req")
    if extend_at_depth0:
        # Depth 0 against the plain server: the extend and verify mode, paid at every depth.
        kept["draft.spec_sched_ms"] = (
            "depth 0 runs the draft extend here, so verify mode's cost adds to every "
            "speculative iteration as draft.extend_fixed_ms does"
        )
        if not plain or not spec_depths:
            for k in extend:
                kept[k] = "needs both servers (the bench had no --no-spec-url)"
    else:
        # Depth 0 skips the extend: it against the plain server is verify mode alone; the
        # extend is what a drafting iteration pays once, told from the per-depth draft steps
        # by two depths above 0.
        if not plain or 0 not in spec_depths:
            kept["draft.spec_sched_ms"] = "needs depth 0 and the plain server (--no-spec-url)"
        if len(drafting) < 2 or 0 not in spec_depths:
            for k in extend:
                kept[k] = (
                    "the draft extend (skipped at depth 0) is told from the per-depth draft "
                    "steps only by depth 0 and two depths above it"
                )
    plain_decode = ("draft.plain_decode_sched_ms", "scheduler.plain_decode_host_us_per_req")
    if not plain_decode_at_depth0:
        for k in plain_decode:
            kept[k] = "depth 0 ran through the verify (the bench recorded no plain decode path)"
    else:
        # Depth 0 against the plain server is the plain decode path's cost, not the verify's:
        # verify mode then shows only at drafting depths, where it adds to every iteration as
        # the draft extend does.
        kept["draft.spec_sched_ms"] = (
            "depth 0 ran as a plain decode: verify mode's own cost shows only at drafting "
            "depths, beside the draft extend's"
        )
        if extend_at_depth0:
            kept["draft.plain_decode_sched_ms"] = (
                "depth 0 runs the draft extend here: the plain decode path's own cost is not "
                "told from it"
            )
        if not plain or 0 not in spec_depths:
            for k in plain_decode:
                kept[k] = "needs depth 0 and the plain server (--no-spec-url)"
        if not drafting:
            kept["scheduler.spec_host_us_per_req"] = (
                "depth 0 ran as a plain decode, the only depth benched: the verify's host "
                "work shows at drafting depths"
            )
    timed = [lv for lv in levels if lv.depth is not None and lv.step_ms]
    if not any(lv.depth == 0 and lv.concurrency == 1 and per_token_ms(lv) for lv in timed):
        kept["scheduler.untimed_ms"] = (
            "needs depth 0 at concurrency 1 with the server's step counters"
        )
    if not prefill_at_depth0 and not any(d and d > 0 for d in spec_depths):
        kept["draft.prefill_ms"] = (
            "the server skipped the draft's prefill at depth 0, the only depth benched"
        )
    if prefill_at_depth0 or 0 not in spec_depths:
        kept["draft.prefill_skipped_ms"] = (
            "needs depth 0 benched on a server that skips the draft's prefill there"
        )
    if not plain or not spec_depths:
        kept["draft.prefill_ms"] = "needs both servers' TTFT (the bench had no --no-spec-url)"
        kept["draft.prefill_skipped_ms"] = kept["draft.prefill_ms"]
        kept["scheduler.spec_host_us_per_req"] = (
            "needs both servers (the bench had no --no-spec-url): the speculative server's "
            "host work beside the plain server's"
        )
        kept["scheduler.plain_decode_host_us_per_req"] = kept["scheduler.spec_host_us_per_req"]
    if not any(lv.ttft_p50_ms or lv.server_ttft_ms for lv in levels):
        for k in (
            "scheduler.prefill_fixed_ms",
            "scheduler.prefill_us_per_token",
            "scheduler.ttft_overhead_ms",
            "draft.prefill_ms",
            "draft.prefill_skipped_ms",
        ):
            kept[k] = "no TTFT measured"
    return [k for k in keys if k not in kept], kept
