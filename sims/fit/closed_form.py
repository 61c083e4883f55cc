"""The first pass of `specctl sim fit`: what the cost model says outright about a level, without
replaying it, and closed-form starts and bounds for the closed loop's fields."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from sims.fit.bench_file import Level
from sims.fit.framing import per_token_ms
from sims.policies import graph_batch_sizes, pad_batches
from sims.profile import Profile

TTFT_WEIGHT = 0.5  # TTFT is the noisiest figure (one prefill decides it)
HOST_MARGIN = 1.15  # a level's time per iteration this far above its step suggests a host floor
FEW_STREAMS = 16  # up to here a speculative level's new requests mostly prefill one at a time


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


def depth0_references(levels: Sequence[Level]) -> dict[tuple[str, int], Level]:
    """The depth-0 level of each (bench, concurrency): the plain server's comparison. Neither
    accepts anything, so at equal concurrency new requests' prefills stall both alike."""
    return {
        (lv.source, lv.concurrency): lv
        for lv in levels
        if lv.depth == 0 and lv.step_ms and per_token_ms(lv)
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
    - TTFT against the prefill of one wave of requests, after the front end and the hand-off
      to the scheduler."""
    out: list[float] = []
    untimed = profile.scheduler.untimed_ms

    def step_of(lv: Level) -> float:
        spec = lv.depth is not None
        batch = lv.mean_batch or min(lv.concurrency, profile.max_running(spec))
        return float(profile.iteration_ms(lv.depth, _pad(profile, spec, batch), _context(lv)))

    for lv in levels:
        spec = lv.depth is not None
        step = step_of(lv)
        per_token = per_token_ms(lv)
        if spec and lv.step_ms:
            out.append(math.log(max(step - untimed, 1e-6) / lv.step_ms))
        ref = refs.get((lv.source, lv.concurrency))
        if per_token and lv.concurrency == 1 and (lv.depth == 0 or (not spec and ref is None)):
            out.append(math.log(step / per_token))
        elif per_token and not spec and ref is not None:
            ref_per_token = per_token_ms(ref)
            assert ref_per_token is not None
            out.append(math.log(step / step_of(ref) * ref_per_token / per_token))
        ttft_ms = lv.server_ttft_ms or lv.ttft_p50_ms
        if ttft_ms:
            assert lv.prompt_tokens is not None
            s = profile.scheduler
            wave = min(lv.concurrency, profile.max_running(spec)) * lv.prompt_tokens
            ttft = s.prefill_fixed_ms + s.prefill_us_per_token * wave / 1000
            ttft += s.dispatch_ms + s.frontend_ms + spec_prefill_extra_ms(profile, lv.depth)
            if not lv.server_ttft_ms:
                ttft += s.ttft_overhead_ms
            out.append(TTFT_WEIGHT * math.log(max(ttft, 1e-6) / ttft_ms))
    return out


def spec_prefill_extra_ms(profile: Profile, depth: int | None) -> float:
    """What a prefill admitted while the server runs `depth` costs beyond a plain server's
    (None: the plain server)."""
    d = profile.draft
    if depth is None:
        return 0.0
    if depth != 0 or d.prefill_at_depth0:
        return d.prefill_ms
    return d.prefill_skipped_ms


def client_time_guess(profile: Profile, levels: Sequence[Level]) -> dict[str, float]:
    """Starts for the client's fields, from tok/s against TTFT and TPOT.

    `client_us_per_stream`: how the client's TTFT outgrows the server's with the streams (the
    slope over the levels that have both). `request_overhead_ms`: per level, the time a
    closed-loop cycle spends outside the client's TTFT and decoding, less that lag; the median
    over the levels with four streams or fewer, where the client is least busy."""
    s = profile.scheduler
    pairs = [
        (lv.concurrency, lv.ttft_p50_ms - lv.server_ttft_ms)
        for lv in levels
        if lv.ttft_p50_ms and lv.server_ttft_ms
    ]
    per_stream = s.client_us_per_stream
    if len({c for c, _ in pairs}) >= 2:
        slope = float(np.polyfit([c for c, _ in pairs], [g for _, g in pairs], 1)[0])
        per_stream = max(1000.0 * slope, 0.0)
    gaps = []
    for lv in levels:
        if not (lv.ttft_p50_ms and lv.tpot_p50_ms and lv.output_tokens and lv.tok_per_s > 0):
            continue
        cycle = 1000.0 * lv.concurrency * lv.output_tokens / lv.tok_per_s
        inside = lv.ttft_p50_ms - s.ttft_overhead_ms
        gap = cycle - inside - (lv.output_tokens - 1) * lv.tpot_p50_ms
        gaps.append((lv.concurrency, gap - per_stream * lv.concurrency / 1000.0))
    low = [g for c, g in gaps if c <= 4] or [g for _, g in gaps]
    overhead = max(float(np.median(low)), 0.0) if low else s.request_overhead_ms
    return {"scheduler.request_overhead_ms": overhead, "scheduler.client_us_per_stream": per_stream}


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
    """Upper bounds the data sets on the front end's and the client's fields. A request alone
    meets nothing in the queue: its server TTFT bounds the front end's time and the hand-off
    to the scheduler, and its client TTFT less the server's bounds the client's extra TTFT.
    Without the bounds a busy client's delays at high concurrency could be read as a slow
    front end, which would split prefills in the replay that the server ran together."""
    alone = [
        (lv.server_ttft_ms, lv.ttft_p50_ms)
        for lv in levels
        if lv.concurrency == 1 and lv.server_ttft_ms
    ]
    if not alone:
        return {}
    floor = 0.05 * step_ms
    server = max(1.5 * float(np.median([ttft for ttft, _ in alone])), floor)
    caps = {"scheduler.frontend_ms": server, "scheduler.dispatch_ms": server}
    gaps = [client - ttft for ttft, client in alone if client]
    if gaps:
        caps["scheduler.ttft_overhead_ms"] = max(1.5 * float(np.median(gaps)), floor)
    return caps


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


def largest_batch(profile: Profile, levels: Sequence[Level]) -> float:
    return float(
        max(min(lv.concurrency, profile.max_running(lv.depth is not None)) for lv in levels)
    )


def host_floor_guesses(profile: Profile, levels: Sequence[Level]) -> dict[str, float]:
    """Starts for `scheduler.host_us_per_req` and `spec_host_us_per_req`: the least time per
    iteration and request among the levels that accept nothing (the plain server, depth 0) and
    whose time per token exceeds the modelled step by `HOST_MARGIN`; 0 where none does. Their
    requests stay in step (every one decodes as many iterations), so their TPOT holds no other
    request's prefill: what lengthens it is the iteration itself. Where the bench has the plain
    server, its levels give the shared floor and depth 0's excess over it the speculative
    server's own (`plain_decode_host_us_per_req` where depth 0 ran as a plain decode); without
    it, depth 0's floor is all shared. Starts only: the replay decides."""
    rates: dict[bool, list[float]] = {False: [], True: []}
    for lv in levels:
        per_token = lv.tpot_p50_ms
        if lv.depth not in (None, 0) or not per_token:
            continue
        spec = lv.depth is not None
        batch = min(lv.mean_batch or lv.concurrency, profile.max_running(spec))
        step = float(profile.iteration_ms(lv.depth, _pad(profile, spec, batch), _context(lv)))
        if per_token > HOST_MARGIN * step:
            rates[spec].append(1000.0 * per_token / batch)
    spec_floor = min(rates[True], default=0.0)
    own = ("scheduler.plain_decode_host_us_per_req" if profile.draft.plain_decode_at_depth0
           else "scheduler.spec_host_us_per_req")
    if not any(lv.depth is None for lv in levels):
        return {"scheduler.host_us_per_req": spec_floor, own: 0.0}
    shared = min(rates[False], default=0.0)
    return {"scheduler.host_us_per_req": shared, own: max(spec_floor - shared, 0.0)}


def prefill_stall_guess(levels: Sequence[Level]) -> float | None:
    """What one new request's prefill stalls the running ones (ms), from the speculative levels
    that accept drafts, have the server's step counters and at most `FEW_STREAMS` streams:
    random acceptance spreads their requests out, so each new one mostly prefills alone,
    inside the others' TPOT. Per level: (TPOT x accept length - step) per iteration, over the
    requests that arrive per iteration (batch x accept length / output tokens); the median.
    None where no level qualifies."""
    stalls = []
    for lv in levels:
        accept, step, per_token = lv.accept_length, lv.step_ms, lv.tpot_p50_ms
        if not (accept and accept > 1.0 and step and per_token and lv.output_tokens):
            continue
        if not 1 < lv.concurrency <= FEW_STREAMS:
            continue
        arrivals = (lv.mean_batch or lv.concurrency) * accept / lv.output_tokens
        stall = (per_token * accept - step) / arrivals
        if stall > 0:
            stalls.append(stall)
    return float(np.median(stalls)) if stalls else None


def prefill_split(profile: Profile, levels: Sequence[Level]) -> dict[str, float]:
    """A second start for the second pass: a lone request's prefill cut to what
    `prefill_stall_guess` says it stalls, the rest of its TTFT moved to the hand-off to the
    scheduler (`dispatch_ms`, which stalls nothing). The closed form cannot split the two (both
    are in TTFT) and the replay's cost has a valley along the split, so the search runs from
    both starts. Empty where the bench does not tell, or the prefill stalls no more already."""
    stall = prefill_stall_guess(levels)
    prompts = [lv.prompt_tokens for lv in levels if lv.prompt_tokens]
    if stall is None or not prompts:
        return {}
    s, d = profile.scheduler, profile.draft
    prompt = float(np.median(prompts))
    lone = s.prefill_fixed_ms + d.prefill_ms + s.prefill_us_per_token * prompt / 1e3
    if lone <= stall:
        return {}
    share = stall / lone
    return {
        "scheduler.prefill_fixed_ms": s.prefill_fixed_ms * share,
        "scheduler.prefill_us_per_token": s.prefill_us_per_token * share,
        "draft.prefill_ms": d.prefill_ms * share,
        "scheduler.dispatch_ms": s.dispatch_ms + lone - stall,
    }
