"""Learning fast: the first table from the first fit, reactions to load and acceptance, the
push gate, and the lag metric that scores them. Pure functions on real samples and tables;
the closed loop is exercised at the end on a short simulated flash crowd."""

from __future__ import annotations

from controller.daemon.config import parse_config
from controller.daemon.loop import Controller
from controller.daemon.own_metrics import DaemonMetrics
from controller.daemon.push_gate import decide_push, missing_probes, probe_share
from controller.daemon.reaction import acceptance_surprise, decode_time_histogram, novel_share
from controller.daemon.runner import run_simulated
from controller.daemon.store import Store
from controller.daemon.takeover import measured_choice
from controller.daemon.transport import InProcessTransport
from controller.evaluation.table_lag import LagTracker, decision_score
from models.samples import Sample
from sglang_hooks.contract import PolicyTable, Tier
from sims.profile import load_profile
from sims.server import SimulatedServer
from sims.workload import Workload


def sample(
    depth: int,
    bucket: int,
    iterations: float = 100.0,
    batch: float | None = None,
    accept: float = 1.0,
    step_s: float = 0.02,
    explore: float = 0.0,
    t: float = 10.0,
) -> Sample:
    b = float(bucket if batch is None else batch)
    steps = iterations * b
    return Sample(
        "g",
        "sim",
        t,
        10.0,
        depth,
        bucket,
        iterations,
        steps,
        steps * (1.0 + accept),
        iterations * step_s,
        explore,
    )


def test_measured_choice_keeps_the_depth_that_ran_most_in_each_bucket():
    samples = [
        sample(3, 1),
        sample(3, 4),
        sample(1, 4, iterations=5, explore=5),  # probes do not count as a choice
        sample(1, 16),
        sample(0, 16, iterations=30),
        sample(0, 32),
    ]
    table = measured_choice(samples)
    assert table is not None
    assert [(t.min_batch, t.depth) for t in table.tiers] == [(1, 3), (16, 1), (32, 0)]
    assert measured_choice([]) is None


def test_novel_share_counts_load_where_the_table_was_not_decided():
    decided = {4: 0.9, 8: 0.09, 48: 0.01}
    assert novel_share({4: 0.5, 8: 0.5}, decided) == 0.0
    assert novel_share({4: 0.2, 48: 0.8}, decided) == 0.8  # 1% of the decided load: new
    hist = decode_time_histogram([sample(3, 4, step_s=0.01), sample(3, 48, step_s=0.03)])
    assert hist == {4: 0.25, 48: 0.75}


def test_acceptance_surprise_sees_a_shift_either_way_and_ignores_noise():
    def mean(d: int) -> float:
        return 1.0 + 1.2  # the model expects 1.2 accepted drafts per request-step

    def std(d: int) -> float:
        return 0.01

    same = [sample(3, 24, batch=24, accept=1.22)]
    up = [sample(3, 24, batch=24, accept=1.5)]
    down = [sample(3, 24, batch=24, accept=0.9)]
    assert acceptance_surprise(same, mean, std, 2.0, 0.03) == 0.0  # under the 3% shift
    assert acceptance_surprise(up, mean, std, 2.0, 0.03) > 5
    assert acceptance_surprise(down, mean, std, 2.0, 0.03) > 5
    few = [sample(3, 24, iterations=1, batch=2, accept=1.5)]  # 2 request-steps: noise
    assert acceptance_surprise(few, mean, std, 2.0, 0.03) < 3


def _t(*tiers: Tier) -> PolicyTable:
    return PolicyTable.build(list(tiers), version=1)


def test_push_gate_wants_a_margin_or_missing_evidence_or_fewer_probes():
    live = _t(Tier(1, 3), Tier(16, 1))
    same_but_moved = _t(Tier(1, 3), Tier(17, 1))
    hists = {"recent": {8: 0.5, 16: 0.5}}

    def gain(g: float):
        return lambda a, b, h, probes: g

    tiny = decide_push(same_but_moved, live, hists, gain(0.001), 0.005, 0.03)
    assert not tiny.push and "push_min_gain" in tiny.why
    big = decide_push(same_but_moved, live, hists, gain(0.02), 0.005, 0.03)
    assert big.push and "+2.0%" in big.why
    probing = _t(Tier(1, 3, explore_share=0.03, explore_depths=(0, 2)), Tier(16, 1))
    assert missing_probes(probing, live, {8: 1.0}, 0.03) == [(8, "off"), (8, "d2")]
    need = decide_push(probing, live, hists, gain(-0.002), 0.005, 0.03)
    assert need.push and "evidence" in need.why
    # The other way round: dropping probes the model no longer needs.
    assert probe_share(probing, {8: 1.0}) == 0.03
    fewer = decide_push(live, probing, hists, gain(0.003), 0.005, 0.03)
    assert fewer.push and "fewer probes" in fewer.why
    assert decide_push(live, None, hists, gain(0.0), 0.005, 0.03).push  # first table


def test_push_gate_takes_cheaper_probes_when_the_decisions_are_no_worse():
    # Off probed at a small batch costs far more per step than a near tie: dropping it is
    # worth a push although the probe share falls by less than half.
    live = _t(Tier(1, 3, explore_share=0.03, explore_depths=(0, 2, 4)))
    cheaper = _t(Tier(1, 3, explore_share=0.0225, explore_depths=(4,)))
    hists = {"recent": {8: 1.0}}

    def gain(plain: float, probed: float):
        return lambda a, b, h, probes: probed if probes else plain

    take = decide_push(cheaper, live, hists, gain(0.0, 0.004), 0.005, 0.03)
    assert take.push and "cheaper probes" in take.why
    # Worse decisions, or a saving under a quarter of push_min_gain: no push.
    assert not decide_push(cheaper, live, hists, gain(-0.001, 0.004), 0.005, 0.03).push
    assert not decide_push(cheaper, live, hists, gain(0.0, 0.001), 0.005, 0.03).push
    # More probes are never "cheaper".
    more = _t(Tier(1, 3, explore_share=0.03, explore_depths=(4,)))
    assert not decide_push(more, cheaper, hists, gain(0.0, 0.004), 0.005, 0.03).push


def test_lag_tracker_splits_cold_start_from_reactions():
    lag = LagTracker()
    for t, score in [
        (10, 0.9),
        (20, 0.95),
        (30, 0.99),
        (40, None),
        (50, 0.97),
        (60, 0.975),
        (70, 0.99),
        (80, 0.9),
    ]:
        lag.observe(t, score)
    report = lag.report(run_end=100)
    assert report["cold_start_s"] == 20  # bad from the first scored tick until t=30
    assert report["worst_change_lag_s"] == 20  # 50-70, and 80 to the end of the run is 20
    assert [e["duration_s"] for e in report["episodes"]] == [20, 20, 20]


def test_decision_score_of_a_table_and_of_what_ran():
    curves = {1: {0: 100.0, 3: 200.0}, 40: {0: 300.0, 3: 240.0}}

    def tok_at(batch: int) -> dict[int, float]:
        return curves[1] if batch < 20 else curves[40]

    load = [sample(3, 1, batch=1, step_s=0.01), sample(3, 40, batch=40, step_s=0.03)]
    always3 = _t(Tier(1, 3))
    two = _t(Tier(1, 3), Tier(20, 0))
    assert decision_score(load, tok_at, two.depth_for) == 1.0
    # 25% of the decode time at batch 1 (200 of 200), 75% at batch 40 (240 of 300): tok/s
    # weighted by decode time, as a fraction of the best depths'
    want = (0.25 * 200 + 0.75 * 240) / (0.25 * 200 + 0.75 * 300)
    assert abs(decision_score(load, tok_at, always3.depth_for) - want) < 1e-9
    assert decision_score(load, tok_at, None) == decision_score(load, tok_at, always3.depth_for)


def test_a_flash_crowd_gets_a_reaction_within_one_scrape(tmp_path):
    """Light load for 4 minutes, then the running cap: the daemon reacts after the first
    scrape at the new load (no dwell, no wait for the scheduled decision)."""
    profile = load_profile("h200-moe-eagle3")
    wl = Workload.model_validate(
        {
            "concurrency": {"points": [[0, 2], [240, 96]], "interpolation": "step"},
            "prompt_tokens": {"dist": "fixed", "value": 512},
            "output_tokens": {"dist": "fixed", "value": 128},
        }
    )
    sim = SimulatedServer(profile, wl, seed=0)
    cfg = parse_config(
        {
            "targets": [{"name": "sim", "simulated": {}}],
            "schedule": {"clock": "simulated", "scrape_interval_s": 10},
            "store": {"path": str(tmp_path / "s.sqlite")},
            "metrics": {"enabled": False},
        }
    )
    store = Store(cfg.store.resolved_path())
    ctl = Controller(cfg, store, {"sim": InProcessTransport(sim)}, metrics=DaemonMetrics())
    run_simulated(ctl, {"sim": sim}, until_s=330, speedup=None)
    pushes = store.pushes("sim")
    assert pushes[0].t <= 30  # the first table comes with the first fit
    assert pushes[0].table is not None
    assert any(t["explore_share"] > 0 for t in pushes[0].table["tiers"])  # ...and probes
    reactions = [p for p in pushes if p.t > 240 and "load moved" in p.reason]
    assert reactions and reactions[0].t <= 260, [(p.t, p.reason[-80:]) for p in pushes]
    ctl.close()
    store.close()
