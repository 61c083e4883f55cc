"""Replay one `specctl bench` level in the simulator: the same protocol, on the engine's clock.

A bench level starts on an idle server with `concurrency` streams sent at once, keeps them in
flight (each client sends its next request when the previous one finished) and ends after a
duration (the streams still running are cut; their tokens count) or after a number of
requests (no new request once that many were sent; the level ends when the last finishes).
It reports output tok/s over the level, and the median TTFT and TPOT of the requests that
finished inside it. `replay` runs exactly that on a fresh `Engine` at a fixed depth (or on a
server without speculation) and reports the same figures, so the two compare one to one.

Client-side time the GPU never sees is the profile's: `scheduler.request_overhead_ms` between
a request's end and the next one entering the queue, `scheduler.ttft_overhead_ms` added to
every TTFT.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sims.engine import Engine
from sims.policies import FixedDepthPolicy
from sims.profile import Profile
from sims.workload import Workload

PHASE = "bench"  # a fitted profile's acceptance phase: what the bench measured


@dataclass(frozen=True)
class LevelShape:
    """What a bench level did, in simulated seconds and tokens as the server counted them."""

    depth: int | None  # None: the server without speculation
    concurrency: int
    prompt_tokens: int
    output_tokens: int
    duration_s: float  # the level's elapsed time
    request_limit: int | None = None  # the bench's --requests-per-level, if that ended it


@dataclass(frozen=True)
class Replayed:
    tok_per_s: float
    tpot_p50_ms: float | None
    ttft_p50_ms: float | None
    step_ms: float | None  # mean decode iteration, as the server's counters report it
    server_ttft_ms: float | None  # mean, arrival to first token (no client time)
    server_itl_ms: float | None  # mean time per token after the first, over tokens
    mean_batch: float | None
    completed: int
    elapsed_s: float


def _median_ms(values: list[float]) -> float | None:
    return 1000.0 * float(np.median(values)) if values else None


def replay(
    profile: Profile, shape: LevelShape, *, seed: int = 0, phase: str | None = None
) -> Replayed:
    """Run one level of the bench protocol on `profile`; see the module docstring."""
    speculative = shape.depth is not None
    workload = Workload.closed(
        shape.concurrency,
        prompt_tokens=shape.prompt_tokens,
        output_tokens=shape.output_tokens,
        phase=phase,
    )
    engine = Engine(
        profile,
        workload,
        seed=seed,
        speculative=speculative,
        policy=FixedDepthPolicy(shape.depth) if shape.depth is not None else None,
    )
    log: list[tuple[float, float, float, float, int]] = []
    engine.request_log = log
    if shape.request_limit is None:
        engine.run_until(shape.duration_s)
        elapsed = shape.duration_s
        finished = [r for r in log if r[3] <= elapsed]
    else:
        limit = shape.request_limit
        engine.request_limit = limit
        # Until every request sent has finished; far past the bench's own time means the
        # profile is far off, and the level is scored on what finished by then.
        cap = max(10.0 * shape.duration_s, 1.0)
        step = max(shape.duration_s / 64.0, 1e-3)
        while len(log) < limit and engine.now < cap:
            engine.run_until(engine.now + step)
        finished = log[:limit]
        elapsed = (
            max((r[3] for r in finished), default=engine.now) if len(log) >= limit else engine.now
        )
    stats = engine.stats
    tokens = stats.tokens_generated
    if shape.request_limit is not None and len(log) >= shape.request_limit:
        tokens = sum(r[4] for r in finished)
    ttft_extra = profile.scheduler.ttft_overhead_ms / 1000.0
    # The server's clock starts when a request reaches its queue, the client's when it sends.
    server_ttft = [first - queued for _, queued, first, _, _ in finished]
    ttft = [first - sent + ttft_extra for sent, _, first, _, _ in finished]
    tpot = [(end - first) / (out - 1) for _, _, first, end, out in finished if out >= 2]
    after_first = sum(out - 1 for *_, out in finished)
    decode_s = sum(end - first for _, _, first, end, _ in finished)
    return Replayed(
        tok_per_s=tokens / elapsed if elapsed > 0 else 0.0,
        tpot_p50_ms=_median_ms(tpot),
        ttft_p50_ms=_median_ms(ttft),
        step_ms=stats.mean_step_ms if stats.decode_iterations else None,
        server_ttft_ms=1000.0 * float(np.mean(server_ttft)) if server_ttft else None,
        server_itl_ms=1000.0 * decode_s / after_first if after_first else None,
        mean_batch=stats.request_steps / stats.decode_iterations
        if stats.decode_iterations
        else None,
        completed=len(finished),
        elapsed_s=elapsed,
    )
