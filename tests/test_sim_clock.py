"""The simulated server's clock follows nominal time: overshoot never accumulates."""

from __future__ import annotations

from sims.profile import load_profile
from sims.server import SimulatedServer
from sims.workload import Workload


def test_many_small_advances_end_where_one_large_advance_ends() -> None:
    # Kimi's prefills take about half a second, longer than the 0.25 s ticks below: each tick
    # overshoots, and the overshoot must not carry into the next tick's target.
    profile = load_profile("kimi-k25-8x-rtxpro6000-pcie")
    ticked = SimulatedServer(profile, Workload.closed(16), seed=3)
    for _ in range(400):
        ticked.advance(0.25)
    whole = SimulatedServer(profile, Workload.closed(16), seed=3)
    whole.advance(100.0)
    assert 100.0 <= ticked.now < 101.0
    assert abs(ticked.now - whole.now) < 1.0
