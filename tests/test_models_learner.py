"""The learner: crossovers from simulated counters, exploration within the cap, drift, tables."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
from pydantic import ValidationError

from controller.evaluation.synthetic import SyntheticServer, sweep_samples, true_crossovers
from models.learner import Learner, LearnerConfig
from models.samples import Sample
from sglang_hooks.contract import PolicyTable, Tier, bs_bucket, parse_table, single_depth_table
from sims.profile import Profile

# A dense model whose best depth falls 4 -> 3 -> 2 -> 1 -> off as the batch grows: every
# crossover is pronounced, so a learner that misplaces one is wrong, not unlucky.
DENSE = Profile.model_validate(
    {
        "name": "test-dense",
        "context_tokens": 2000,
        "target": {
            "fixed_ms": 1.0,
            "weight_read_ms": 8.0,
            "kv_us_per_req_per_1k_ctx": 5.0,
            "compute_us_per_token": 60.0,
            "roofline_sharpness": 4.0,
        },
        "draft": {
            "step_fixed_ms": 0.6,
            "step_us_per_req": 8.0,
            "extend_fixed_ms": 0.4,
            "extend_us_per_token": 4.0,
            "spec_sched_ms": 0.3,
        },
        "scheduler": {"sched_ms": 0.8, "prefill_fixed_ms": 5, "prefill_us_per_token": 50},
        "acceptance": {
            "default_phase": "chat",
            "phases": {"chat": [0.85, 0.8, 0.75, 0.7], "code": [0.9, 0.85, 0.8, 0.75]},
        },
        "captured_depths": [0, 1, 2, 3, 4],
        "full_depth": 3,
        "step_time_cv": 0.03,
    }
)
DEPTHS = DENSE.captured_depths
SWEEP_BATCHES = [1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256]


@pytest.fixture(scope="module")
def sweep() -> list[Sample]:
    return sweep_samples(DENSE, SWEEP_BATCHES, seconds_per_point=1.0, seed=3)


@pytest.fixture(scope="module")
def learned(sweep: list[Sample]) -> Learner:
    learner = Learner(DEPTHS)
    learner.fit(sweep, now=sweep[-1].t_end)
    return learner


def test_learner_recovers_profile_crossovers_within_15_percent(learned: Learner) -> None:
    proposal = learned.propose(now=learned.fitted_at or 0.0, live=None)
    truth = true_crossovers(DENSE, DEPTHS, 512)
    assert [(a, b) for a, b, _ in proposal.crossovers] == [(a, b) for a, b, _ in truth]
    for (_, _, got), (_, _, want) in zip(proposal.crossovers, truth, strict=True):
        assert abs(got - want) / want < 0.15, (got, want)


def test_best_depth_matches_the_cost_model_away_from_crossovers(learned: Learner) -> None:
    for batch, depth in [(2, 4), (15, 4), (36, 3), (62, 2), (130, 1), (250, 0)]:
        assert learned.best_depth(batch) == depth


def test_curves_bracket_the_true_throughput(learned: Learner) -> None:
    batch = np.asarray([4.0, 32.0, 128.0])
    for depth, points in learned.curves(batch).items():
        truth = DENSE.decode_tok_per_s(depth, batch)
        for point, want in zip(points, truth, strict=True):
            assert point.lo <= point.tok_per_s <= point.hi
            assert abs(point.tok_per_s - want) / want < 0.03
            assert point.evidence_iterations > 0


def test_cold_start_probes_off_and_the_neighbours_at_the_cap() -> None:
    server = SyntheticServer(DENSE, single_depth_table(3), seed=1)
    samples = server.run(20.0, lambda t: 8)
    learner = Learner(DEPTHS, LearnerConfig(probe_past_cold_neighbours=False))
    learner.fit(samples, now=server.now)
    proposal = learner.propose(server.now, live=single_depth_table(3))
    for tier in proposal.table.tiers:
        assert tier.explore_share == pytest.approx(0.03)
        # Depth 1 is neither a neighbour of 3 nor off: the pooled model places it once its
        # neighbours 0 and 2 are measured.
        assert set(tier.explore_depths) == {0, 2, 4}
    assert proposal.exploration_share <= 0.03 + 1e-12


def test_a_tier_beside_a_cold_neighbour_also_probes_the_cold_depth_past_it() -> None:
    server = SyntheticServer(DENSE, single_depth_table(3), seed=1)
    learner = Learner(DEPTHS, LearnerConfig(probe_past_cold_neighbours=True))
    learner.fit(server.run(20.0, lambda t: 8), now=server.now)
    proposal = learner.propose(server.now, live=single_depth_table(3))
    for tier in proposal.table.tiers:
        assert tier.explore_share == pytest.approx(0.03)
        # 2 is cold, so 1 past it is probed too: a walk down from 3 needs one push, not two.
        # Nothing lies past 4 on the other side.
        assert set(tier.explore_depths) == {0, 1, 2, 4}
    assert proposal.exploration_share <= 0.03 + 1e-12
    # Once the neighbour is measured the reach is back to the neighbours (1 then sits between
    # two measured depths and is placed by the pooled model).
    probed = PolicyTable.build(
        [Tier(1, 3, explore_share=0.3, explore_depths=(0, 2))], captured_depths=DEPTHS
    )
    warm_two = SyntheticServer(DENSE, probed, seed=1)
    learner.fit(warm_two.run(30.0, lambda t: 8), now=warm_two.now)
    assert 2 in learner.warm_depths()
    assert learner._cold_probe_candidates(3, [4]) == [4]
    # Only cold depths, and one step past the neighbour at most (off counts where it is cold).
    assert learner._cold_probe_candidates(4, [1, 2, 3]) == [2, 3]
    assert learner._cold_probe_candidates(4, [0, 1, 2, 3]) == [0, 2, 3]


def test_a_depth_between_two_measured_ones_may_be_run_without_evidence_of_its_own() -> None:
    table = PolicyTable.build(
        [Tier(1, 3, explore_share=0.3, explore_depths=(0, 2))], captured_depths=DEPTHS
    )
    server = SyntheticServer(DENSE, table, seed=1)
    learner = Learner(DEPTHS)
    learner.fit(server.run(30.0, lambda t: 8), now=server.now)
    assert learner.evidence(1) == 0
    assert learner.warm_depths() == [0, 1, 2, 3]  # 4 has no neighbour above it: cold


def test_cold_start_without_any_samples_keeps_the_live_table_and_probes() -> None:
    live = parse_table({"tiers": [{"min_batch": 1, "depth": 3}, {"min_batch": 32, "depth": 1}]})
    proposal = Learner(DEPTHS).propose(0.0, live=live)
    assert [t.depth for t in proposal.table.tiers] == [3, 1]
    assert all(t.explore_share == pytest.approx(0.03) for t in proposal.table.tiers)
    assert "cold start" in proposal.reason


def test_no_exploration_where_the_model_is_certain(learned: Learner) -> None:
    # Far from every crossover, inside the measured range, the posterior leaves no doubt:
    # only the cheap floor remains (a quarter of the cap, on near ties), and none without it.
    strict = Learner.from_json(
        {**learned.to_json(), "config": {**learned.config.model_dump(), "cheap_probe_loss": 0.0}}
    )
    for model, most in ((learned, learned.config.exploration_cap / 4), (strict, 0.0)):
        table = model.propose(now=learned.fitted_at or 0.0, live=None).table
        for batch in (8, 36, 62, 130, 250):
            tier = table.tiers[max(i for i, t in enumerate(table.tiers) if t.min_batch <= batch)]
            assert tier.explore_share <= most + 1e-12, (batch, table.describe())


@pytest.mark.parametrize("seed", range(6))
def test_exploration_share_never_exceeds_the_cap(seed: int) -> None:
    rng = np.random.default_rng(seed)
    cap = float(rng.choice([0.01, 0.03, 0.1]))
    table = single_depth_table(int(rng.choice(DEPTHS)))
    server = SyntheticServer(DENSE, table, seed=seed)
    learner = Learner(DEPTHS, LearnerConfig(exploration_cap=cap), seed=seed)
    samples: list[Sample] = []
    probes = iterations = 0.0
    for _ in range(12):
        level = float(rng.choice([2, 10, 40, 150]))
        chunk = server.run(5.0, lambda t, level=level: int(rng.integers(1, 2 * level)))
        samples += chunk
        probes += sum(s.explore_iterations for s in chunk)
        iterations += sum(s.iterations for s in chunk)
        learner.fit(samples, now=server.now)
        hist = {int(b): float(rng.random()) for b in rng.choice([1, 8, 32, 128], 2)}
        proposal = learner.propose(server.now, live=server.table, batch_histogram=hist)
        assert proposal.exploration_share <= cap + 1e-12
        assert all(t.explore_share <= cap + 1e-12 for t in proposal.table.tiers)
        server.set_table(proposal.table)
    assert probes / iterations <= cap * 1.5  # realised share, sampling noise allowed


def test_acceptance_drift_is_tracked_within_three_minutes() -> None:
    server = SyntheticServer(DENSE, single_depth_table(3), seed=2, phase="chat")
    samples = []
    for _ in range(60):  # 10 minutes of chat
        samples += server.run(10.0, lambda t: 16)
    server.phase = "code"
    for _ in range(18):  # 3 minutes of code
        samples += server.run(10.0, lambda t: 16)
    learner = Learner(DEPTHS)
    learner.fit(samples, now=server.now)
    want = DENSE.acceptance.expected_length("code", 3)
    assert abs(learner.acceptance.mean_length(3) - want) / want < 0.05
    # The depths the server did not run follow through the shared per-position rate.
    assert learner.acceptance.mean_length(4) > DENSE.acceptance.expected_length("chat", 4)


@pytest.mark.parametrize("seed", range(4))
def test_proposed_tables_always_validate_against_the_contract(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    batches = sorted({int(x) for x in rng.integers(1, 300, size=int(rng.integers(1, 8)))})
    depths = sorted({int(x) for x in rng.choice(DEPTHS, size=int(rng.integers(1, 5)))})
    samples = sweep_samples(DENSE, batches, 0.5, depths=depths, seed=seed)
    learner = Learner(DEPTHS, seed=seed)
    learner.fit(samples, now=samples[-1].t_end)
    live = PolicyTable.build([Tier(1, depths[0])], version=7)
    proposal = learner.propose(samples[-1].t_end, live=live)
    again = parse_table(proposal.table.to_json(), captured_depths=DEPTHS)
    assert again == proposal.table
    assert proposal.table.version == 8
    assert proposal.table.depths <= set(DEPTHS)


def test_state_round_trips_through_json(learned: Learner) -> None:
    restored = Learner.from_json(json.loads(json.dumps(learned.to_json())))
    now = learned.fitted_at or 0.0
    assert restored.propose(now, None).table == learned.propose(now, None).table
    batch = np.asarray([3.0, 77.0])
    for depth in DEPTHS:
        a, b = learned.curves(batch)[depth], restored.curves(batch)[depth]
        assert [p.tok_per_s for p in a] == [p.tok_per_s for p in b]


def test_fit_is_idempotent(sweep: list[Sample]) -> None:
    a, b = Learner(DEPTHS), Learner(DEPTHS)
    a.fit(sweep, now=1e3)
    b.fit(sweep, now=1e3)
    b.fit(sweep, now=1e3)
    assert a.to_json() == b.to_json()


def test_garbage_samples_are_ignored_not_fatal(sweep: list[Sample]) -> None:
    bad = [
        Sample("g", "t", 1.0, 1.0, 3, 8, 0.0, 0.0, 0.0, 0.0),
        Sample("g", "t", 1.0, 1.0, 3, 8, 10.0, 80.0, math.nan, 0.5),
        Sample("g", "t", 1.0, 1.0, 3, 8, 10.0, 80.0, 9999.0, 0.5),  # more tokens than possible
        Sample("g", "t", math.inf, 1.0, 3, 8, 10.0, 80.0, 100.0, 0.5),
    ]
    clean, dirty = Learner(DEPTHS), Learner(DEPTHS)
    clean.fit(sweep, now=1e3)
    dirty.fit(bad + sweep, now=1e3)
    assert clean.to_json() == dirty.to_json()


def test_config_typo_names_the_field() -> None:
    with pytest.raises(ValidationError, match="exploraton_cap"):
        LearnerConfig.model_validate({"exploraton_cap": 0.05})
    with pytest.raises(ValueError, match="captured_depths"):
        Learner([])


def test_change_point_found_at_a_shift_of_acceptance_and_not_without_one() -> None:
    server = SyntheticServer(DENSE, single_depth_table(3), seed=4, phase="chat")
    steady: list[Sample] = []
    for _ in range(40):
        steady += server.run(10.0, lambda t: 16)
    learner = Learner(DEPTHS)
    learner.fit(steady, now=server.now)
    assert learner.change is None
    t_shift = server.now
    server.phase = "code"
    shifted = list(steady)
    for _ in range(6):
        shifted += server.run(10.0, lambda t: 16)
    learner.fit(shifted, now=server.now)
    assert learner.change is not None and learner.change.depth == 3
    assert abs(learner.change.t - t_shift) <= 10.0
    # Evidence from before the change no longer counts: depth 3 reads code's acceptance.
    want = DENSE.acceptance.expected_length("code", 3)
    assert abs(learner.acceptance.mean_length(3) - want) / want < 0.03


def test_probes_past_cold_start_only_reach_neighbouring_depths(learned: Learner) -> None:
    live = single_depth_table(2)
    proposal = learned.propose(now=learned.fitted_at or 0.0, live=live)
    for tier in proposal.table.tiers:
        i = DEPTHS.index(tier.depth)
        assert set(tier.explore_depths) <= {0, *DEPTHS[max(i - 1, 0) : i + 2]}, tier
    wide = Learner(DEPTHS, LearnerConfig(probe_neighbours_only=False))
    assert wide._probe_candidates(2, DEPTHS) == [0, 1, 3, 4]
    assert learned._probe_candidates(3, DEPTHS) == [0, 2, 4]  # off is always a candidate
    near = Learner(DEPTHS, LearnerConfig(probe_off=False))
    assert near._probe_candidates(3, DEPTHS) == [2, 4]


def test_live_depth_kept_unless_beaten_by_the_switch_margin(learned: Learner) -> None:
    # Around a crossover the two depths differ by well under 5%: with a 5% margin the live
    # depth holds the whole range, with none the model's own crossover decides.
    now = learned.fitted_at or 0.0
    live = single_depth_table(3)
    # One margin everywhere (the live run carries all the load, see loaded_switch_margin).
    one = {**learned.config.model_dump(), "loaded_switch_margin": None}
    sticky = Learner.from_json({**learned.to_json(), "config": {**one, "switch_margin": 0.05}})
    free = Learner.from_json({**learned.to_json(), "config": {**one, "switch_margin": 0.0}})
    held = sticky.propose(now, live=live).table
    moved = free.propose(now, live=live).table
    near = [b for b in range(20, 60) if moved.depth_for(b) != 3]
    assert near, moved.describe()
    assert sum(held.depth_for(b) == 3 for b in near) > 0, held.describe()


def test_loaded_switch_margin_holds_the_live_depth_where_the_load_is(learned: Learner) -> None:
    now = learned.fitted_at or 0.0
    live = single_depth_table(3)  # one run: it carries all of any load
    base = {**learned.to_json(), "config": {**learned.config.model_dump(), "switch_margin": 0.05}}

    def table(loaded: float | None, hist: dict[int, float] | None) -> PolicyTable:
        state = {**base, "config": {**base["config"], "loaded_switch_margin": loaded}}
        return Learner.from_json(state).propose(now, live=live, batch_histogram=hist).table

    free = Learner.from_json({**base, "config": {**base["config"], "switch_margin": 0.0}})
    moved = free.propose(now, live=live, batch_histogram={32: 1.0}).table
    near = [b for b in range(20, 60) if moved.depth_for(b) != 3]
    assert near, moved.describe()
    held = table(None, {32: 1.0})
    assert sum(held.depth_for(b) == 3 for b in near) > 0, held.describe()
    loaded = table(0.0, {32: 1.0})
    assert [loaded.depth_for(b) for b in near] == [moved.depth_for(b) for b in near], (
        loaded.describe()
    )


def test_settled_near_tie_probes_halve_and_come_back_with_a_reaction(sweep: list[Sample]) -> None:
    # The sweep spans 70 s: with settled_after_s at 5 s its evidence counts as long settled.
    now = sweep[-1].t_end
    fresh = Learner(DEPTHS)
    fresh.fit(sweep, now=now)
    config = LearnerConfig(settled_after_s=5.0, settled_evidence_iterations=1.0)
    settled = Learner(DEPTHS, config)
    settled.fit(sweep, now=now)
    cap = config.exploration_cap

    def share(learner: Learner, batch: int, focus: dict[int, float] | None = None) -> float:
        table = learner.propose(now, live=None, focus=focus).table
        return table.tiers[_tier_at(table, batch)].explore_share

    for batch in SWEEP_BATCHES:
        assert share(settled, batch) <= share(fresh, batch) + 1e-12
    # Far from the crossovers only near ties are probed, at a quarter of the cap: halved.
    for batch in (96, 192, 256):
        assert share(fresh, batch) == pytest.approx(cap / 4)
        assert share(settled, batch) == pytest.approx(cap / 8)
        # The load just moved there (a reaction): the full rate comes back.
        assert share(settled, batch, {bs_bucket(batch): 1.0}) >= cap / 4 - 1e-12
    # Next to a crossover the posterior is still unsure: no halving there.
    assert share(fresh, 24) > 0
    assert share(settled, 24) == pytest.approx(share(fresh, 24))


def _tier_at(table: PolicyTable, batch: int) -> int:
    return max(i for i, t in enumerate(table.tiers) if t.min_batch <= batch)


def test_a_tier_running_off_probes_at_the_cap_while_a_change_settles() -> None:
    # Chat, then code 100 s later: acceptance rises at every depth, a change point. Off runs
    # at the largest batch sizes and measures no acceptance; its probes are the only evidence.
    chat = sweep_samples(DENSE, SWEEP_BATCHES, seconds_per_point=1.0, seed=3, phase="chat")
    code = sweep_samples(DENSE, SWEEP_BATCHES, seconds_per_point=1.0, seed=4, phase="code")
    shift = chat[-1].t_end + 100.0
    samples = chat + [dataclasses.replace(s, t_end=s.t_end + shift) for s in code]
    now = samples[-1].t_end
    cap = LearnerConfig().exploration_cap

    def off_tiers(at: float) -> list[Tier]:
        learner = Learner(DEPTHS)
        learner.fit(samples, now=at)
        assert learner.change is not None and learner.change.t < now
        table = learner.propose(at, live=None).table
        return [t for t in table.tiers if t.depth == 0 and t.explore_share > 0]

    settling = off_tiers(now)
    assert settling and all(t.explore_share == pytest.approx(cap) for t in settling)
    later = off_tiers(now + LearnerConfig().acceptance_settle_s + 60.0)
    assert later and all(t.explore_share < cap for t in later)


def _interval(t: float, depth: int, batch: int, accept: float) -> Sample:
    """One second of decode at `depth` and `batch` with accept length `accept`."""
    iterations = 100.0
    steps = iterations * batch
    return Sample("g", "t", t, 1.0, depth, bs_bucket(batch), iterations, steps, steps * accept,
                  0.02 * iterations)  # fmt: skip


def test_a_depth_s_evidence_from_before_the_change_reached_the_running_depth_is_not_kept():
    """A table benched on family a runs depth 1 at 256 streams, then depth 3 at 4 streams of
    a, then depth 1 under a crowd of family b. Depth 1 sees the change only at its first
    interval on b, so its change point lies before depth 3's seconds on a: those must not count
    as depth 3's accept length now (they did, and the table pushed depth 3 for the crowd). The
    same seconds on the new family are kept."""
    a_then = [_interval(float(t), 1, 256, 1.82) for t in range(1, 41)]
    b_now = [_interval(float(t), 1, 256, 1.52) for t in range(49, 61)]
    stale = [_interval(float(t), 3, 4, 3.04) for t in range(41, 49)]
    learner = Learner(DEPTHS)
    learner.fit(a_then + stale + b_now, now=60.0)
    change = learner.change
    assert change is not None and change.depth == 1 and change.t == 40.0
    assert change.gap_end == 48.0  # the scrape before depth 1's first interval on b
    chain = learner.acceptance.mean_length(3)
    assert chain < 2.2  # the chain prior, moved by depth 1's fresh counters (b's is ~1.9)
    # depth 3 before the change too: its level there is a's, and so is the gap's
    early = [_interval(float(t), 3, 4, 3.04) for t in range(1, 41, 4)]
    with_history = Learner(DEPTHS)
    with_history.fit(a_then + early + stale + b_now, now=60.0)
    assert with_history.acceptance.mean_length(3) < 2.2
    # the gap's depth-3 seconds on the new family are the new workload's: kept, and they count
    fresh = [_interval(float(t), 3, 4, 1.93) for t in range(41, 49)]
    kept = Learner(DEPTHS)
    kept.fit(a_then + early + fresh + b_now, now=60.0)
    assert kept.acceptance.request_steps_[3] > 0
    assert kept.acceptance.mean_length(3) == pytest.approx(1.93, abs=0.1)
