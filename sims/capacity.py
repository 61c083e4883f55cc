"""How many requests per second a profile's speculative server completes when saturated.

Open-loop rates written in units of capacity (`Workload.rate_unit: capacity`) are multiplied by
this figure, so one scenario means the same load (light, near capacity, a backlog building) on
a Kimi server doing ~1 request/s and on an 8B H200 doing ~20. The estimate is the steady state
of a server pinned at its running cap B with the best depth d for the workload's first phase
mix: each request costs its own prefill (one request is admitted as one finishes) and its share
of the decode iterations,

    seconds per request = prefill_fixed + prefill_per_token * prompt
                          + output * t_iter(d, B) / (B * L_d)

with the workload's mean lengths and the decode step charged at a running request's mean
context (prompt plus half the output). Closed-loop request overhead is not counted: it delays
clients, not the server.
"""

from __future__ import annotations

from sims.profile import Profile
from sims.workload import Workload


def saturated_request_rate(profile: Profile, workload: Workload) -> float:
    """Requests per second the speculative server completes at its running cap."""
    mix = workload.phase_mix(0.0, profile.acceptance.default_phase)
    cap = profile.max_running(True)
    prompt = workload.prompt_tokens.mean
    output = workload.output_tokens.mean
    context = prompt + output / 2
    sched = profile.scheduler
    prefill_s = (sched.prefill_fixed_ms + sched.prefill_us_per_token * prompt / 1000.0) / 1000.0
    best_s = min(
        float(profile.iteration_ms(d, cap, context))
        / 1000.0
        / (cap * sum(w * profile.acceptance.expected_length(p, d) for p, w in mix.items()))
        for d in profile.captured_depths
    )
    return 1.0 / (prefill_s + output * best_s)
