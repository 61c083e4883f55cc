"""A bench "measured" by replaying a known profile: what `specctl bench` would record of a
server that is exactly this profile, without HTTP. Tests and the design check fit it to see
what the fit recovers."""

from __future__ import annotations

from collections.abc import Sequence

from sglang_hooks.contract import OFF_PATH_SGLANG, OFF_PATH_SPECCTL
from sims.fit.bench_file import BenchRun, Level, ServerFacts
from sims.fit.replay import LevelShape, replay
from sims.profile import Profile


def _facts(profile: Profile, speculative: bool) -> ServerFacts:
    s = profile.scheduler
    return ServerFacts(
        cap=profile.max_running(speculative),
        max_total_tokens=s.max_total_tokens,
        max_prefill_tokens=s.max_prefill_tokens,
        context_length=s.context_length,
        speedup=1.0,
        captured_depths=tuple(profile.captured_depths) if speculative else (),
        full_depth=profile.full_depth if speculative else None,
        model=profile.name,
        version=None,
        off_path=(
            (OFF_PATH_SGLANG if profile.draft.extend_at_depth0 else OFF_PATH_SPECCTL)
            if speculative else None
        ),
        skip_draft_prefill=not profile.draft.prefill_at_depth0 if speculative else None,
    )


def replayed_bench(
    profile: Profile,
    *,
    depths: Sequence[int],
    concurrency: Sequence[int],
    prompt_tokens: int,
    output_tokens: int,
    seconds: float,
    warmup_s: float = 0.0,
    seed: int = 7,
    phase: str | None = None,
    name: str = "replayed",
) -> BenchRun:
    """Every (depth, concurrency) level and the plain server's, each replayed on `profile`
    with the bench protocol; the accept length is the profile's expected one."""
    levels = []
    for depth in (*depths, None):
        for c in concurrency:
            shape = LevelShape(depth, c, prompt_tokens, output_tokens, seconds, warmup_s=warmup_s)
            r = replay(profile, shape, seed=seed, phase=phase)
            spec = depth is not None
            accept = None
            if spec:
                chosen = phase or profile.acceptance.default_phase
                accept = profile.acceptance.expected_length(chosen, depth) if depth else 1.0
            levels.append(
                Level(
                    source=name,
                    series=f"d{depth}" if spec else "no-spec",
                    depth=depth,
                    concurrency=c,
                    requests=r.completed,
                    errors=0,
                    elapsed_s=r.elapsed_s,
                    tok_per_s=r.tok_per_s,
                    ttft_p50_ms=r.ttft_p50_ms,
                    tpot_p50_ms=r.tpot_p50_ms,
                    step_ms=r.step_ms if spec else None,  # a plain server has no counters
                    mean_batch=r.mean_batch if spec else None,
                    accept_length=accept,
                    prompt_tokens=float(prompt_tokens),
                    output_tokens=float(output_tokens),
                    foreign_traffic=False,
                    server_ttft_ms=r.server_ttft_ms,
                    server_itl_ms=r.server_itl_ms,
                    warmup_s=warmup_s,
                )
            )
    return BenchRun(
        name, tuple(levels), _facts(profile, True), _facts(profile, False), None, seconds
    )
