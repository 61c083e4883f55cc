"""Replay one `specctl bench` level in the simulator: the same protocol, on the engine's clock.

A bench level starts on an idle server with `concurrency` streams sent at once and keeps them
in flight (each client sends its next request when the previous one finished). The first
`warmup_s` seconds are not measured; the window that follows ends after a duration (the
streams still running are then cut) or once a number of requests that started in it have
finished. The level reports the output tokens the window received per second, the median TTFT
and TPOT of the requests that started and finished inside it, and what the server's own
counters and latency histograms gained over the window: the mean decode step and batch, the
mean time to first token of the requests that got one, and the mean time per token after the
first. `replay` runs exactly that on a fresh `Engine` at a fixed depth (or on a server without
speculation) and reports the same figures, so the two compare one to one.

Client-side time the GPU never sees is the profile's: `scheduler.request_overhead_ms` between
a request's end and the next one entering the queue, `scheduler.ttft_overhead_ms` added to
every TTFT the client measures, and `scheduler.client_us_per_stream` times the level's streams
added to both (a client that is busier with every stream notices each token later).
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
    duration_s: float  # the measured window
    request_limit: int | None = None  # the bench's --requests-per-level, if that ended it
    warmup_s: float = 0.0  # unmeasured load before the window
    # Output lengths drawn uniformly from [low, high] (the bench's shortest and longest), not
    # all `output_tokens`: requests that do not end together do not move in waves.
    output_range: tuple[int, int] | None = None


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
    # Prefill batches and decode iterations in the window (SGLang's cuda_graph_passes_total).
    prefill_passes: int = 0
    decode_passes: int = 0


# (sent by the client, queued, first token, finish, output tokens), as the engine logs them
_Logged = tuple[float, float, float, float, int]


def _median_ms(values: list[float]) -> float | None:
    return 1000.0 * float(np.median(values)) if values else None


def _run_window(engine: Engine, shape: LevelShape, log: list[_Logged]) -> list[_Logged]:
    """Run the window after the warm-up; the requests that started and finished in it."""
    start = shape.warmup_s
    if shape.request_limit is None:
        end = start + shape.duration_s
        engine.run_until(end)
        return [r for r in log if r[0] >= start and r[3] <= end]
    limit = shape.request_limit
    # Until that many requests of the window finished; far past the bench's own time means
    # the profile is far off, and the level is scored on what finished by then.
    cap = start + max(10.0 * shape.duration_s, 1.0)
    step = max(shape.duration_s / 256.0, 1e-3)
    while engine.now < cap:
        done = [r for r in log if r[0] >= start]
        if len(done) >= limit:
            return sorted(done, key=lambda r: r[3])[:limit]
        engine.run_until(engine.now + step)
    return [r for r in log if r[0] >= start]


def replay(
    profile: Profile, shape: LevelShape, *, seed: int = 0, phase: str | None = None
) -> Replayed:
    """Run one level of the bench protocol on `profile`; see the module docstring."""
    speculative = shape.depth is not None
    workload = Workload.closed(
        shape.concurrency,
        prompt_tokens=shape.prompt_tokens,
        output_tokens=shape.output_tokens if shape.output_range is None else shape.output_range,
        phase=phase,
    )
    engine = Engine(
        profile,
        workload,
        seed=seed,
        speculative=speculative,
        policy=FixedDepthPolicy(shape.depth) if shape.depth is not None else None,
    )
    log: list[_Logged] = []
    engine.request_log = log
    if shape.warmup_s > 0:
        engine.run_until(shape.warmup_s)
    before = engine.stats
    finished = _run_window(engine, shape, log)
    after = engine.stats
    elapsed = after.now - before.now
    tokens = after.tokens_generated - before.tokens_generated
    iterations = after.decode_iterations - before.decode_iterations
    first_tokens = after.first_tokens - before.first_tokens
    after_first = after.decode_tokens - before.decode_tokens
    sched = profile.scheduler
    ttft_extra = (
        sched.ttft_overhead_ms + sched.client_us_per_stream * shape.concurrency / 1000
    ) / 1e3
    ttft = [first - sent + ttft_extra for sent, _, first, _, _ in finished]
    tpot = [(end - first) / (out - 1) for _, _, first, end, out in finished if out >= 2]
    return Replayed(
        tok_per_s=tokens / elapsed if elapsed > 0 else 0.0,
        tpot_p50_ms=_median_ms(tpot),
        ttft_p50_ms=_median_ms(ttft),
        step_ms=1000.0 * (after.decode_gpu_seconds - before.decode_gpu_seconds) / iterations
        if iterations
        else None,
        server_ttft_ms=1000.0
        * (after.first_token_wait_s - before.first_token_wait_s)
        / first_tokens
        if first_tokens
        else None,
        server_itl_ms=1000.0 * (after.running_wait_s - before.running_wait_s) / after_first
        if after_first
        else None,
        mean_batch=(after.request_steps - before.request_steps) / iterations
        if iterations
        else None,
        completed=len(finished),
        elapsed_s=elapsed,
        prefill_passes=after.prefill_iterations - before.prefill_iterations,
        decode_passes=iterations,
    )
