"""Guardrails: captured depths only, bounded boundary moves, rollback after a measured drop."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from controller.daemon.config import parse_config
from controller.daemon.guardrails import (
    bound_change,
    changed_buckets,
    compare_after_push,
    decision_runs,
    restrict_to_captured,
)
from controller.daemon.loop import Controller
from controller.daemon.own_metrics import DaemonMetrics
from controller.daemon.push_gate import missing_probes
from controller.daemon.runner import run_simulated
from controller.daemon.store import Store
from controller.daemon.transport import InProcessTransport
from models.learner import Proposal
from models.samples import Sample
from sglang_hooks.contract import PolicyTable, Tier
from sglang_hooks.draft_shape import DraftShape
from sims.profile import load_profile
from sims.server import SimulatedServer
from sims.workload import Workload


def table(*tiers: tuple[int, int] | tuple[int, int, int], version: int = 1) -> PolicyTable:
    return PolicyTable.build([Tier(*t) for t in tiers], version=version)


def test_uncaptured_depths_map_down_and_identical_neighbours_merge():
    t = PolicyTable.build(
        [
            Tier(1, 7, explore_share=0.03, explore_depths=(5, 2)),
            Tier(8, 5, explore_share=0.03, explore_depths=(1,)),
            Tier(16, 4),
            Tier(32, 0),
        ]
    )
    out = restrict_to_captured(t, [0, 1, 3])
    # 7 and 5 both map to 3 with the same probes: one tier; 4 -> 3 without probes stays apart.
    assert [(x.min_batch, x.depth) for x in out.tiers] == [(1, 3), (16, 3), (32, 0)]
    assert out.tiers[0].explore_depths == (1,)  # 5 -> 3 is the tier's own depth; 2 -> 1


def test_boundary_moves_are_clamped_when_the_decisions_keep_their_order():
    live = table((1, 3), (8, 1, 1), (32, 0, 4))
    proposed = table((1, 3), (40, 1, 5), (64, 0, 8))
    out, clamped = bound_change(live, proposed, max_move=0.5)
    assert clamped
    assert decision_runs(out) == [(1, 3), (12, 1), (48, 0)]
    # A proposal within the bounds passes unchanged.
    near = table((1, 3), (10, 1, 1), (36, 0, 4))
    assert bound_change(live, near, 0.5) == (near, False)


def test_structural_change_is_not_clamped_but_exploration_splits_are_kept_in_their_run():
    live = table((1, 3), (8, 1))
    assert bound_change(live, table((1, 2), (8, 0)), 0.1)[1] is False
    split = PolicyTable.build(
        [Tier(1, 3), Tier(4, 3, 0, 0.03, (2,)), Tier(30, 1, 3), Tier(40, 1, 3, 0.02, (0,))]
    )
    out, clamped = bound_change(live, split, 0.5)
    assert clamped
    assert [(t.min_batch, t.depth) for t in out.tiers] == [(1, 3), (4, 3), (12, 1), (40, 1)]


def test_a_tree_and_the_chain_of_its_steps_are_two_decisions_and_a_clamp_keeps_the_tree():
    """3x4x16 and d3 have the same depth: the guardrails tell them apart by shape."""
    tree = Tier(1, 3, topk=4, draft_tokens=16)
    live = PolicyTable.build([tree, Tier(20, 3, 2), Tier(100, 0, 12)])
    proposed = PolicyTable.build([tree, Tier(50, 3, 6), Tier(100, 0, 12)])
    out, clamped = bound_change(live, proposed, max_move=0.5)
    assert clamped and [t.min_batch for t in out.tiers] == [1, 30, 100]
    assert out.tiers[0] == tree  # not turned into the chain d3
    assert changed_buckets(live, proposed) == {20, 24, 28, 32, 40, 48}
    swapped = PolicyTable.build([Tier(1, 3), Tier(20, 3, 2, topk=4, draft_tokens=16)])
    assert bound_change(PolicyTable.build([tree, Tier(20, 3, 2)]), swapped, 0.5)[1] is False
    assert 1 in changed_buckets(live, swapped)
    probing = PolicyTable.build([Tier(1, 3, explore_share=0.03, explore_depths=(0,),
                                      explore_trees=(DraftShape(3, 4, 16),))])
    assert missing_probes(probing, table((1, 3)), {1: 1.0}, 0.03) == [(1, "off"), (1, "3x4x16")]


def _sample(bucket: int, tok_per_s: float, t: float, depth: int = 1) -> Sample:
    return Sample(
        "g",
        "t",
        t,
        5.0,
        depth,
        bucket,
        500.0,
        500.0 * bucket,
        500.0 * bucket * 2,
        500.0 * bucket * 2 / tok_per_s,
    )


def test_compare_after_push_uses_only_matched_changed_buckets():
    before = [_sample(16, 1000.0, 1.0), _sample(1, 100.0, 1.0)]
    after = [_sample(16, 800.0, 2.0), _sample(1, 50.0, 2.0)]
    cmp = compare_after_push(before, after, {16}, min_iterations=100)
    assert cmp.matched_buckets == (16,)
    assert cmp.drop == pytest.approx(0.2)
    assert compare_after_push(before, after, {16}, min_iterations=10_000).drop is None
    assert changed_buckets(table((1, 3), (8, 1)), table((1, 3), (10, 1))) == {8}


class ScriptedLearner:
    """A stand-in learner with scripted proposals, so that a push can be made bad on purpose
    (the real learner would not propose it); everything else in the loop is real."""

    version = "scripted"

    def __init__(self, tables: list[PolicyTable]) -> None:
        self.tables = tables
        self.calls = 0

    def fit(self, samples: Any, now: float) -> None:
        return None

    def propose(self, now: float, live: Any, batch_histogram: Any = None, **_: Any) -> Any:
        t = self.tables[min(self.calls, len(self.tables) - 1)]
        self.calls += 1
        return Proposal(t, {16: 1000.0}, [], 0.0, f"scripted {t.describe()}")

    def predicted_gain(self, candidate: Any, live: Any, hist: Any, *, probes: bool = True) -> float:
        return 0.2  # the script claims every table is better: the after-push check must catch it

    def best_depth(self, batch: int) -> int:
        return 1

    def to_json(self) -> dict[str, Any]:
        return {}

    def curves(self, batch: np.ndarray) -> dict[int, Any]:
        return {}


def test_a_push_that_lowers_measured_throughput_is_rolled_back(tmp_path):
    profile = load_profile("kimi-k25-8x-rtxpro6000-pcie")
    sim = SimulatedServer(profile, Workload.closed(16), seed=0)
    good, bad = table((1, 1)), table((1, 4))  # at batch 16: d1 beats d4 by ~20%
    cfg = parse_config(
        {
            "targets": [{"name": "sim", "simulated": {}}],
            "schedule": {
                "clock": "simulated",
                "scrape_interval_s": 10,
                "decide_interval_s": 10,
                "fit_interval_s": 10,
            },
            "guardrails": {
                "min_dwell_s": 120,
                "rollback_window_s": 120,
                "rollback_min_iterations": 50,
                "takeover_min_gain": 0.0,
            },
            "store": {"path": str(tmp_path / "s.sqlite")},
            "metrics": {"enabled": False},
        }
    )
    store = Store(cfg.store.resolved_path())
    learner = ScriptedLearner([good, bad, good])
    ctl = Controller(
        cfg,
        store,
        {"sim": InProcessTransport(sim)},
        metrics=DaemonMetrics(),
        learner_factory=lambda captured, overrides, seed: learner,
    )
    run_simulated(ctl, {"sim": sim}, until_s=900, speedup=None)
    pushes = store.pushes("sim")
    kinds = [(p.kind, p.outcome) for p in pushes]
    assert ("learned", "rolled_back") in kinds
    rolled = next(p for p in pushes if p.outcome == "rolled_back")
    assert rolled.table is not None and rolled.table["tiers"][0]["depth"] == 4
    back = pushes[pushes.index(rolled) + 1]
    assert back.kind == "rollback" and back.outcome == "applied"
    assert back.table is not None and back.table["tiers"][0]["depth"] == 1
    assert "fell" in back.reason
    assert store.count_rollbacks("sim") == 1
    # The bad table is quarantined: not pushed again within the run.
    assert sum(1 for p in pushes if p.table and p.table["tiers"][0]["depth"] == 4) == 1
    ctl.close()
