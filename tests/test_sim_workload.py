"""Workloads and scenarios: traces, length distributions, phase drift, validation errors."""

from __future__ import annotations

import numpy as np
import pytest

from sims.engine import Engine
from sims.policies import FixedDepthPolicy
from sims.profile import load_profile
from sims.workload import (
    ScenarioError,
    Trace,
    Workload,
    builtin_scenarios,
    load_scenario,
    load_workload,
)


def test_builtin_scenarios_load_and_last_tens_of_minutes():
    names = builtin_scenarios()
    assert {"ramp", "diurnal", "bursty", "drift", "double-drift", "flash-crowd"} <= set(names)
    for name in names:
        sc = load_scenario(name)
        assert 10 * 60 <= sc.duration_s <= 60 * 60


def test_trace_linear_and_step():
    lin = Trace(points=[(0, 1), (100, 201)])
    assert lin.value(-5) == 1 and lin.value(50) == 101 and lin.value(500) == 201
    step = Trace(points=[(0, 4), (10, 160)], interpolation="step")
    assert step.value(9.9) == 4 and step.value(10) == 160


def test_lognormal_lengths_have_the_requested_mean():
    wl = load_workload(
        {"concurrency": 1, "prompt_tokens": {"dist": "lognormal", "mean": 800, "cv": 0.5}}
    )
    x = wl.prompt_tokens.sample(np.random.default_rng(0), 20000)
    assert x.mean() == pytest.approx(800, rel=0.03)
    assert x.std() / x.mean() == pytest.approx(0.5, rel=0.1)


@pytest.mark.parametrize(
    "data, field",
    [
        (
            {"concurrency": 1, "prompt_tokens": {"dist": "lognormal", "mean": -3, "cv": 0.5}},
            "prompt_tokens.mean",
        ),
        ({"mode": "open"}, "rate_per_s"),
        ({"concurrency": {"points": [[10, 1], [5, 2]]}}, "concurrency"),
        ({"concurrency": 1, "phases": [{"at": 0}]}, "phases.0"),
        ({"concurrency": 1, "think_time": 3}, "think_time"),
    ],
)
def test_invalid_workloads_name_the_field(data, field):
    with pytest.raises(ScenarioError, match=field.replace(".", r"\.")):
        load_workload(data)


def test_unknown_phase_is_named_against_the_profile():
    profile = load_profile("kimi-k25-8x-rtxpro6000-pcie")
    wl = load_workload({"concurrency": 1, "phases": [{"at": 0, "phase": "poetry"}]})
    with pytest.raises(ValueError, match=r"phases\[0\].*poetry"):
        Engine(profile, wl)


def test_unknown_scenario_lists_the_builtins(tmp_path):
    with pytest.raises(ScenarioError, match="ramp"):
        load_scenario("nope")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nduration_s: -1\nworkload: {concurrency: 1}\n")
    with pytest.raises(ScenarioError, match="duration_s"):
        load_scenario(bad)


def test_drift_lowers_acceptance_after_the_switch():
    profile = load_profile("kimi-k25-8x-rtxpro6000-pcie")
    engine = Engine(profile, load_scenario("drift").workload, seed=1, policy=FixedDepthPolicy(3))
    engine.run_until(500)
    code = engine.stats
    engine.run_until(850)  # the blend ends at 720 s; let code requests in flight finish
    start = engine.stats
    engine.run_until(1070)
    chat = engine.stats
    code_accept = code.accept_length
    chat_accept = (chat.decode_tokens - start.decode_tokens) / (
        chat.request_steps - start.request_steps
    )
    assert code_accept == pytest.approx(profile.acceptance.expected_length("code", 3), rel=0.03)
    assert chat_accept == pytest.approx(profile.acceptance.expected_length("chat", 3), rel=0.03)


def test_open_loop_rate_is_met():
    profile = load_profile("h100-llama8b-eagle3")
    wl = Workload.model_validate({"mode": "open", "rate_per_s": 2.0})
    engine = Engine(profile, wl, seed=0)
    engine.run_until(600)
    assert engine.stats.submitted_requests == pytest.approx(1200, rel=0.1)


def test_closed_loop_concurrency_follows_the_trace():
    profile = load_profile("h100-llama8b-eagle3")
    wl = Workload.model_validate(
        {"concurrency": {"points": [[0, 2], [60, 40]], "interpolation": "step"}}
    )
    engine = Engine(profile, wl, seed=0)
    engine.run_until(30)
    assert engine.n + engine.queue_length <= 2
    engine.run_until(90)
    assert engine.n + engine.queue_length >= 30


def test_capacity_rates_load_every_profile_alike():
    """An open loop in units of capacity: 0.5x keeps up, 2x builds a queue, on a slow and on a
    fast profile alike (their absolute capacities differ ~10x)."""
    from sims.capacity import saturated_request_rate

    rates = {}
    for name in ("kimi-k25-8x-rtxpro6000-pcie", "h200-llama8b-eagle3"):
        profile = load_profile(name)
        for level in (0.5, 2.0):
            wl = Workload.model_validate(
                {"mode": "open", "rate_unit": "capacity", "rate_per_s": level}
            )
            rates[name] = saturated_request_rate(profile, wl)
            engine = Engine(profile, wl, seed=0, policy=FixedDepthPolicy(profile.full_depth))
            engine.run_until(240)
            if level < 1:
                assert engine.queue_length <= 5, (name, engine.queue_length)
            else:
                assert engine.n >= profile.max_running(True) - 2  # pinned at the cap
                assert engine.queue_length > 0.3 * rates[name] * 240, (name, engine.queue_length)
    assert rates["h200-llama8b-eagle3"] > 5 * rates["kimi-k25-8x-rtxpro6000-pcie"]


def test_rate_unit_is_for_open_loops_only():
    with pytest.raises(ScenarioError, match="rate_unit"):
        load_workload({"concurrency": 4, "rate_unit": "capacity"})


def test_cut_times_are_for_closed_loops_and_in_order():
    with pytest.raises(ScenarioError, match="cut_at is for mode: closed"):
        load_workload({"mode": "open", "rate_per_s": 2, "cut_at": [5]})
    with pytest.raises(ScenarioError, match=r"cut_at\[1\] comes before cut_at\[0\]"):
        load_workload({"concurrency": 4, "cut_at": [10, 5]})


def test_a_scenario_sets_the_evaluated_daemons_intervals_and_guardrails(tmp_path):
    """A scenario mirroring a short daemon run carries that run's schedule and guardrails into
    the evaluation's daemon config; a misspelt key is named by the config's own check, and the
    clock cannot be moved off the simulated one."""
    from controller.daemon.config import ConfigError
    from controller.evaluation.evaluate import eval_config

    path = tmp_path / "short.yaml"
    path.write_text("name: short\nduration_s: 60\nsample_interval_s: 2\n"
                    "daemon: {schedule: {fit_interval_s: 6, decide_interval_s: 6},"
                    " guardrails: {min_dwell_s: 12}}\nworkload: {concurrency: 4}\n")
    config = eval_config(load_scenario(path), tmp_path / "s.sqlite", seed=0)
    assert config.schedule.scrape_interval_s == 2
    assert config.schedule.fit_interval_s == config.schedule.decide_interval_s == 6
    assert config.guardrails.min_dwell_s == 12
    default = eval_config(load_scenario("ramp"), tmp_path / "r.sqlite", 0)
    assert default.schedule.decide_interval_s == 30

    path.write_text("name: short\nduration_s: 60\ndaemon: {schedule: {decide_intervl_s: 6}}\n"
                    "workload: {concurrency: 4}\n")
    with pytest.raises(ConfigError, match="decide_intervl_s"):
        eval_config(load_scenario(path), tmp_path / "s2.sqlite", seed=0)
    path.write_text("name: short\nduration_s: 60\ndaemon: {schedule: {clock: 1}}\n"
                    "workload: {concurrency: 4}\n")
    with pytest.raises(ScenarioError, match=r"daemon\.schedule\.clock"):
        load_scenario(path)


def test_a_recv_interval_gathers_arrivals_into_fewer_prefills():
    """SGLang's --scheduler-recv-interval N: new requests reach the queue once every N decode
    iterations (and right after a prefill), so a closed loop at high load shares prefills
    among more arrivals and runs fewer of them per decode iteration."""
    base = load_profile("h200-sglang-llama8b-seeded")
    wl = Workload.model_validate({"concurrency": 128})

    def prefills_per_decode(interval: int) -> tuple[float, int]:
        sched = base.scheduler.model_copy(update={"recv_interval": interval})
        engine = Engine(base.model_copy(update={"scheduler": sched}), wl, seed=3)
        engine.run_until(20)
        st = engine.stats
        return st.prefill_iterations / st.decode_iterations, st.completed_requests

    eager, done_eager = prefills_per_decode(1)
    gathered, done_gathered = prefills_per_decode(8)
    assert gathered < 0.8 * eager
    assert done_gathered > 0.9 * done_eager  # the same load is still served


def test_a_request_waiting_for_the_recv_interval_can_be_aborted():
    base = load_profile("h200-sglang-llama8b-seeded")
    sched = base.scheduler.model_copy(update={"recv_interval": 1000})
    engine = Engine(
        base.model_copy(update={"scheduler": sched}),
        Workload.model_validate({"concurrency": 0}),
        seed=0,
    )
    first = engine.submit(64, 64)
    engine.run_until(0.05)  # idle: taken in at once, now decoding
    waiting = engine.submit(64, 64)  # not taken in for 1,000 decode iterations
    engine.run_until(0.1)
    assert engine.queue_length == 0 and engine.n == 1
    assert engine.abort(waiting) and not engine.abort(waiting)
    assert engine.abort(first)
