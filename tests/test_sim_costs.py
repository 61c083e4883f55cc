"""The cost terms a real SGLang server showed beyond the step model, in the engine: the host
floor, depth 0 without the draft extend, the speculative server's dearer prefill, the hand-off
to the scheduler, a busy client's lag, and the bench's warm-up window in the replay.

Each term is checked against what it must do to an engine run of a known profile (the fit
test data's made-up server), with the profile's step noise off where an exact figure is due.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sims.engine import Engine
from sims.fit.replay import LevelShape, replay
from sims.policies import FixedDepthPolicy
from sims.profile import Profile, load_profile
from sims.server import SimulatedServer
from sims.workload import Workload

TRUTH = Path(__file__).parent / "data" / "fit_truth.yaml"


def truth(**changes: dict[str, Any]) -> Profile:
    """The test server with fields of its sections changed, step noise off."""
    data = load_profile(TRUTH).model_dump()
    data["step_time_cv"] = 0.0
    for section, fields in changes.items():
        data[section].update(fields)
    return Profile.model_validate(data)


def decode_only(profile: Profile, batch: int, depth: int | None, seconds: float) -> Engine:
    """`batch` requests that do not finish in the run: after one prefill, decode iterations."""
    engine = Engine(
        profile,
        Workload.closed(batch, prompt_tokens=100, output_tokens=20_000, phase="chat"),
        speculative=depth is not None,
        policy=None if depth is None else FixedDepthPolicy(depth),
    )
    engine.run_until(seconds)
    return engine


@pytest.mark.parametrize("depth", [None, 0, 3])
def test_the_host_floor_bounds_the_iteration_but_not_the_gpu_timer(depth: int | None) -> None:
    """SGLang's overlap scheduler runs each batch's host work beside the next forward: an
    iteration lasts the longer of the two, and the GPU timer sees the forward alone."""
    plain = decode_only(truth(), 16, depth, 5.0)
    slow_host = truth(scheduler={"host_us_per_req": 4000.0})  # 64 ms at 16 requests
    hosted = decode_only(slow_host, 16, depth, 5.0)
    for engine in (plain, hosted):
        st = engine.stats
        assert st.decode_iterations > 20
    gpu_ms = plain.stats.mean_step_ms
    assert gpu_ms < 64.0  # the test needs a host floor above the forward
    # (the two runs differ only in how far their contexts grew: the KV term)
    assert hosted.stats.mean_step_ms == pytest.approx(gpu_ms, rel=0.01)
    st = hosted.stats
    wall_ms = 1000.0 * (st.now - st.prefill_seconds) / st.decode_iterations
    untimed = slow_host.scheduler.untimed_ms
    assert wall_ms == pytest.approx(64.0 + untimed, rel=0.01)
    # Below the forward, the floor changes nothing.
    low = decode_only(truth(scheduler={"host_us_per_req": 100.0}), 16, depth, 5.0)
    assert low.stats.decode_iterations == plain.stats.decode_iterations


def test_the_host_floor_counts_tokens_and_the_curves_see_it() -> None:
    prof = truth(scheduler={"host_us_per_token": 5000.0})
    tokens = prof.acceptance.expected_length("chat", 3)
    step = float(prof.decode_step_ms(3, 8, tokens_per_req=tokens))
    assert step == pytest.approx(5.0 * 8 * tokens + prof.scheduler.untimed_ms, rel=1e-9)
    assert float(prof.iteration_ms(3, 8)) < step
    assert float(prof.decode_tok_per_s(3, 8, "chat")) == pytest.approx(
        8 * tokens / (step / 1000.0), rel=1e-9
    )


def test_depth_0_without_the_draft_extend() -> None:
    """The plugin's off path: depth 0 pays verify mode (spec_sched_ms) but no draft extend;
    deeper iterations still pay it. The served simulator reports the path."""
    sglang, skip = truth(), truth(draft={"extend_at_depth0": False})
    for batch in (1, 8):
        extend = float(sglang.draft_extend_ms(batch, 1))
        assert float(sglang.iteration_ms(0, batch)) - float(skip.iteration_ms(0, batch)) == (
            pytest.approx(extend, rel=1e-9)
        )
        assert float(skip.iteration_ms(3, batch)) == float(sglang.iteration_ms(3, batch))
        plain = float(skip.iteration_ms(None, batch))
        assert float(skip.iteration_ms(0, batch)) - plain == pytest.approx(
            skip.draft.spec_sched_ms, rel=1e-9
        )
    for prof, mode in ((sglang, "sglang"), (skip, "specctl")):
        state = SimulatedServer(prof, Workload.closed(0)).specctl_state()
        assert state["off_path"]["path"] == mode
        assert ("skip-extend" in state["off_path"]["features"]) is (mode == "specctl")
        # What the plugin counts as `skipped_draft_extends`: depth-0 iterations, where skipped.
        server = SimulatedServer(prof, Workload.closed(4, prompt_tokens=100, output_tokens=500),
                                 policy=FixedDepthPolicy(0))
        server.engine.run_until(0.5)
        depth0 = server.engine.stats.iterations_per_depth[0]
        assert depth0 > 0
        assert server.specctl_state()["skipped_draft_extends"] == (0 if mode == "sglang"
                                                                   else depth0)


def test_depth_0_as_a_plain_decode_costs_its_own_terms() -> None:
    """The plugin's plain decode path (`draft.plain_decode_at_depth0`): depth 0 pays
    plain_decode_sched_ms and plain_decode_host_us_per_req in place of the verify's
    spec_sched_ms and spec_host_us_per_req; every drafting depth keeps the verify's. A served
    simulator reports the path's DECODE runner and keeps depth 0 on it: as on a real server,
    no push moves it (a former `specctl_plain_decode` is an unknown key)."""
    verify = truth(draft={"extend_at_depth0": False, "spec_sched_ms": 2.0},
                   scheduler={"spec_host_us_per_req": 3000.0})
    path = truth(draft={"extend_at_depth0": False, "spec_sched_ms": 2.0,
                        "plain_decode_at_depth0": True, "plain_decode_sched_ms": 0.5},
                 scheduler={"spec_host_us_per_req": 3000.0, "plain_decode_host_us_per_req": 250.0})
    for batch in (1, 8):
        plain = float(path.iteration_ms(None, batch))
        assert float(path.iteration_ms(0, batch)) - plain == pytest.approx(0.5, rel=1e-9)
        assert float(verify.iteration_ms(0, batch)) - plain == pytest.approx(2.0, rel=1e-9)
        assert float(path.iteration_ms(3, batch)) == float(verify.iteration_ms(3, batch))
    assert path.host_us_per_req(True, 0) == path.scheduler.host_us_per_req + 250.0
    assert path.host_us_per_req(True, 3) == verify.host_us_per_req(True, 0)
    assert path.host_us_per_req(False) == path.scheduler.host_us_per_req
    # Host-bound at 16 requests (a 3 ms verify floor a request): the floor follows the path.
    walls = [float(p.decode_step_ms(0, 16)) for p in (path, verify)]
    assert walls[1] == pytest.approx(16 * 3.0 + path.scheduler.untimed_ms, rel=1e-9)
    assert walls[0] < walls[1]

    server = SimulatedServer(path, Workload.closed(8, prompt_tokens=100, output_tokens=20_000),
                             policy=FixedDepthPolicy(0))
    state = server.specctl_state()
    assert state["plain_decode"]["runners"] == 1
    assert "plain-decode" in state["off_path"]["features"]
    engine = server.engine
    server.engine.run_until(0.5)
    on = engine.iteration_ms(0, 8)
    status, _ = server.set_internal_state({"server_args": {"specctl_plain_decode": 0}}, None)
    assert status == 400 and engine.iteration_ms(0, 8) == on
    server.engine.run_until(1.0)  # and the engine runs on with it
    assert server.engine.stats.decode_iterations > 0


def test_a_speculative_server_prefills_at_a_higher_cost() -> None:
    """draft.prefill_ms: the draft model's own pass over new prompts, with speculation only."""
    prof = truth(draft={"prefill_ms": 7.0})
    lone = prof.scheduler.prefill_fixed_ms + prof.scheduler.prefill_us_per_token * 100 / 1000
    for speculative, extra in ((True, 7.0), (False, 0.0)):
        shape = LevelShape(0 if speculative else None, 1, 100, 20, 3.0)
        r = replay(prof, shape, phase="chat")
        assert r.server_ttft_ms == pytest.approx(lone + extra, rel=1e-6)


def test_dispatch_delays_requests_and_counts_in_the_servers_ttft() -> None:
    prof = truth(scheduler={"dispatch_ms": 40.0})
    engine = Engine(prof, Workload.closed(1, prompt_tokens=100, output_tokens=20), seed=0)
    engine.request_log = []
    engine.run_until(3.0)
    sent, queued, first, _, _ = engine.request_log[0]
    assert queued - sent == pytest.approx(0.040, abs=1e-9)
    st = engine.stats
    prefill_s = (prof.scheduler.prefill_fixed_ms + prof.scheduler.prefill_us_per_token / 10) / 1e3
    # The first request reaches the queue while the scheduler is idle: no wait beyond.
    assert first - sent == pytest.approx(0.040 + prefill_s, rel=1e-6)
    assert st.first_token_wait_s / st.first_tokens >= 0.040 + prefill_s - 1e-9
    # Side by side, not one at a time: eight requests sent together arrive together.
    eight = Engine(prof, Workload.closed(8, prompt_tokens=100, output_tokens=20), seed=0)
    eight.request_log = []
    eight.run_until(1.0)
    first_wave = sorted(eight.request_log)[:8]
    assert {round(q, 6) for _, q, *_ in first_wave} == {0.04}


def test_a_busy_clients_lag_grows_with_its_streams() -> None:
    """Between a request's end and its client's next request: the client's overhead plus its
    lag per stream times the streams it keeps open."""
    prof = truth(scheduler={"request_overhead_ms": 2.0, "client_us_per_stream": 500.0})
    for streams in (1, 8):
        engine = Engine(prof, Workload.closed(streams, prompt_tokens=100, output_tokens=20))
        engine.request_log = []
        engine.run_until(4.0)
        log = sorted(engine.request_log, key=lambda r: r[3])
        sends = sorted(r[0] for r in log)
        gap = 0.002 + 0.0005 * streams
        ends = [r[3] for r in log[:streams]]
        assert [round(s, 6) for s in sends[streams : 2 * streams]] == [
            round(e + gap, 6) for e in ends
        ]
    replayed = replay(prof, LevelShape(None, 8, 100, 20, 4.0), phase="chat")
    plain = replay(truth(), LevelShape(None, 8, 100, 20, 4.0), phase="chat")
    assert replayed.ttft_p50_ms is not None and plain.ttft_p50_ms is not None
    assert replayed.ttft_p50_ms == pytest.approx(plain.ttft_p50_ms + 0.5 * 8, rel=0.05)


def test_the_replay_measures_after_the_warm_up() -> None:
    """Requests sent before the window are not measured; the window's tokens per second are
    those of the steady loop, not of the start-up wave."""
    prof = truth()
    cycle = replay(prof, LevelShape(None, 1, 100, 40, 10.0), phase="chat")
    lone = cycle.elapsed_s / max(cycle.completed, 1)
    warm = replay(prof, LevelShape(None, 1, 100, 40, 10.0, warmup_s=lone / 2), phase="chat")
    # The request running across the window's start is cut from the latencies.
    assert warm.completed == cycle.completed - 1
    assert warm.elapsed_s == pytest.approx(10.0, abs=0.05)
    assert warm.tok_per_s == pytest.approx(cycle.tok_per_s, rel=0.03)
    limited = replay(
        prof, LevelShape(None, 4, 100, 40, 10.0, request_limit=6, warmup_s=0.5), phase="chat"
    )
    assert limited.completed == 6
