"""The GPU trace's phases as a simulator scenario (benchmarks/gpu/sim_trace/scenario.py), and
what the simulator does with it: clients cut at each phase's start, each phase's requests on
its dataset's acceptance, the daemon settings taken from the harness's daemon_config."""

from __future__ import annotations

import itertools

import pytest

from benchmarks.gpu import daemon_run
from benchmarks.gpu.seeded.trace import parse_phases
from benchmarks.gpu.sim_trace import scenario as trace_scenario_module
from benchmarks.gpu.sim_trace.cli import write_scenario
from benchmarks.gpu.sim_trace.profile import with_datasets
from benchmarks.gpu.sim_trace.scenario import WALL_ONLY, harness_daemon, trace_scenario
from sglang_hooks.contract import single_depth_table
from sims.profile import load_profile
from sims.server import SimulatedServer
from sims.workload import FixedLength, load_scenario

PHASES = "10:2:a,12:16:a,15:128:b,5:4:b"
PROMPT, OUTPUT = FixedLength(value=40), FixedLength(value=128)


def _starts(phases, lead, clock):  # type: ignore[no-untyped-def]
    return [lead * clock + clock * sum(p.seconds for p in phases[:i]) for i in range(len(phases))]


@pytest.mark.parametrize("clock", [1.0, 10.0])
def test_phases_are_a_stepped_closed_loop_over_the_same_seconds(tmp_path, clock):
    phases = parse_phases(PHASES)
    lead = 4.0
    scen = trace_scenario(phases, daemon=harness_daemon(clock), clock=clock, lead_s=lead,
                          prompt_tokens=PROMPT, output_tokens=OUTPUT)  # fmt: skip
    starts = _starts(phases, lead, clock)
    assert scen.warmup_s == lead * clock
    assert scen.duration_s == pytest.approx(clock * (lead + sum(p.seconds for p in phases)))
    assert scen.workload.cut_at == pytest.approx(starts)
    load = scen.workload.concurrency_trace()
    assert load.value(scen.warmup_s / 2) == 0  # the daemon's start, before any load
    ends = [*starts[1:], scen.duration_s]
    for phase, start, end in zip(phases, starts, ends, strict=True):
        for t in (start, (start + end) / 2, end - 1e-6):  # a step, held to the phase's end
            assert load.value(t) == phase.concurrency
            mix = scen.workload.phase_mix(t, "bench")
            assert mix == {phase.dataset: 1.0}
    # written as YAML, `specctl sim evaluate --scenario` reads the same scenario back
    write_scenario(scen, tmp_path / "s.yaml")
    assert load_scenario(tmp_path / "s.yaml") == scen


def test_the_daemon_settings_are_daemon_configs_on_the_servers_clock(monkeypatch):
    config = daemon_run.daemon_config("http://x:1", "", daemon_run.Path("s.sqlite"), 60.0)
    schedule = {k: v for k, v in config["schedule"].items() if k not in WALL_ONLY}
    one, ten = harness_daemon(1.0), harness_daemon(10.0)
    assert one.schedule == schedule and one.guardrails == config["guardrails"]
    for key, value in itertools.chain(one.schedule.items(), one.guardrails.items()):
        scaled = ten.schedule.get(key, ten.guardrails.get(key))
        assert scaled == (10 * value if key.endswith("_s") else value), key  # counts stay
    scen = trace_scenario(parse_phases(PHASES), daemon=one, prompt_tokens=PROMPT,
                          output_tokens=OUTPUT)  # fmt: skip
    assert scen.sample_interval_s == schedule["scrape_interval_s"]
    assert scen.daemon.schedule == one.schedule

    # one source of truth: a change to daemon_config is the simulated daemon's too
    def faster(*args, **kwargs):  # type: ignore[no-untyped-def]
        out = config_of(*args, **kwargs)
        out["schedule"]["scrape_interval_s"] /= 2
        return out

    config_of = daemon_run.daemon_config
    monkeypatch.setattr(trace_scenario_module, "daemon_config", faster)
    assert harness_daemon().scrape_s == schedule["scrape_interval_s"] / 2


def _served(lengths: dict[str, dict[int, float]]):  # type: ignore[no-untyped-def]
    return with_datasets(load_profile("h200-llama8b-eagle3"), lengths, "the test")


def test_each_phase_cuts_the_clients_and_draws_its_datasets_acceptance():
    """64 clients of long requests on family a, then 4 on family b: at the phase's start the
    a requests are gone at once (without the cut they would run on for seconds), and the b
    phase decodes at b's accept length."""
    lengths = {"a": {1: 1.8, 3: 3.2}, "b": {1: 1.3, 3: 1.5}}
    profile = _served(lengths)
    phases = parse_phases("20:64:a,20:4:b")
    scen = trace_scenario(phases, daemon=harness_daemon(), lead_s=0.0,
                          prompt_tokens=FixedLength(value=64),
                          output_tokens=FixedLength(value=4000))  # fmt: skip
    uncut = scen.workload.model_copy(update={"cut_at": []})
    b_start = phases[0].seconds

    def at_b(workload):  # type: ignore[no-untyped-def]
        server = SimulatedServer(profile, workload, seed=0, table=single_depth_table(3))
        server.advance_to(b_start + 0.5)
        return server

    cut, kept = at_b(scen.workload), at_b(uncut)
    names = list(profile.acceptance.phases)
    running = dict(zip(names, cut.engine.phase_counts(), strict=True))
    assert cut.engine.n <= phases[1].concurrency and running["a"] == 0
    assert kept.engine.n > phases[1].concurrency  # the a requests would still be running
    assert cut.stats().aborted_requests >= phases[0].concurrency - 1

    start = cut.stats()
    cut.advance_to(scen.duration_s)
    end = cut.stats()
    accepted = (end.decode_tokens - start.decode_tokens) / (end.request_steps - start.request_steps)
    assert accepted == pytest.approx(lengths["b"][3], rel=0.03)


def test_accept_lengths_become_rates_whose_chain_gives_them_back():
    lengths = {"a": {1: 1.83, 3: 3.09}, "b": {1: 1.52, 3: 1.94}}
    profile = _served(lengths)
    for name, measured in lengths.items():
        rates = profile.acceptance.phases[name]
        survive, chain = 1.0, 1.0
        for depth, rate in enumerate(rates, 1):
            survive *= rate
            chain += survive
            if depth in measured:
                assert chain == pytest.approx(measured[depth], abs=2e-3), (name, depth)
    assert sum(line.startswith("Acceptance phases of the trace") for line in profile.sources) == 1
    again = with_datasets(profile, lengths, "the test")  # a profile this wrote, given again
    assert again.sources == profile.sources
