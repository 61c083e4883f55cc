"""The learner of a shape server: each captured shape's tok/s per batch bucket, from counter
samples shaped as the daemon's scraper builds them (a tree's carry its label)."""

from __future__ import annotations

import math
import random

from models.learner import LearnerConfig
from models.samples import Sample
from models.shape_learner import ShapeLearner, sample_shape
from sglang_hooks.contract import PolicyTable, Tier, tier_label
from sglang_hooks.draft_shape import DraftShape

SHAPES = ["3x4x16", "3x1x4", "plain"]
# tok/s per bucket: the tree leads at 1-16 streams, the chain at 64, off at 128 and above.
TRUTH = {
    "3x4x16": {1: 400.0, 4: 1450.0, 16: 4000.0, 64: 3300.0, 128: 6000.0, 256: 6600.0},
    "3x1x4": {1: 250.0, 4: 930.0, 16: 3250.0, 64: 7800.0, 128: 9200.0, 256: 12000.0},
    "plain": {1: 150.0, 4: 600.0, 16: 2300.0, 64: 7000.0, 128: 11000.0, 256: 19000.0},
}


def sample(shape: str, bucket: int, tok_per_s: float, t: float, iterations: float = 100.0,
           accept: float = 2.0) -> Sample:  # fmt: skip
    """One scrape interval of `shape` at `bucket`: tokens over GPU seconds is `tok_per_s`."""
    steps = iterations * bucket
    tokens = steps * (1.0 if shape == "plain" else accept)
    depth = 0 if shape == "plain" else 3
    tree = shape if shape == "3x4x16" else ""
    return Sample("g", "t", t, 1.0, depth, bucket, iterations, steps, tokens, tokens / tok_per_s,
                  tree=tree)  # fmt: skip


def measured_everywhere(seed: int = 0, rounds: int = 12) -> list[Sample]:
    rng = random.Random(seed)
    return [sample(shape, b, tok * rng.gauss(1.0, 0.03), float(t))
            for t in range(rounds) for shape, row in TRUTH.items()
            for b, tok in row.items()]  # fmt: skip


HIST = {1: 0.2, 4: 0.2, 16: 0.2, 64: 0.2, 128: 0.1, 256: 0.1}


def runs_at(table: PolicyTable, batch: int) -> str:
    return tier_label(table.tier_for(batch))


def test_each_bucket_runs_its_fastest_shape_and_clear_winners_need_no_probes() -> None:
    learner = ShapeLearner(SHAPES)
    assert learner.startup == "3x4x16"  # the server's start-up shape: the one that dominates
    learner.fit(measured_everywhere(), now=12.0)
    proposal = learner.propose(12.0, None, HIST)
    table = proposal.table
    assert [runs_at(table, b) for b in (1, 4, 16, 64, 128, 256)] == [
        "3x4x16", "3x4x16", "3x4x16", "d3", "off", "off"], table.describe()  # fmt: skip
    assert table.tier_for(1).shape == DraftShape(3, 4, 16)
    assert proposal.exploration_share == 0.0, table.describe()
    assert math.isclose(proposal.predicted_tok_per_s[256], 19000.0, rel_tol=0.05)
    gain = learner.predicted_gain(table, None, HIST)  # over the start-up tree everywhere
    assert gain is not None and gain > 0.5


def test_a_shape_seen_for_a_few_steps_is_probed_not_run() -> None:
    """Two probe steps at batch 1 that happened to accept well say too little to switch on."""
    learner = ShapeLearner(SHAPES)
    samples = [sample("3x4x16", 1, 400.0, float(t)) for t in range(10)]
    samples.append(sample("3x1x4", 1, 900.0, 10.0, iterations=2.0))
    learner.fit(samples, now=10.0)
    tier = learner.propose(10.0, None, {1: 1.0}).table.tier_for(1)
    assert tier_label(tier) == "3x4x16"
    assert set(tier.explore_shapes) == {DraftShape(3, 1, 4), None}  # both still cold: probed
    assert tier.explore_share == LearnerConfig().exploration_cap


def test_a_bucket_reached_first_takes_a_cold_shape_s_ratio_from_the_nearest_bucket() -> None:
    """At 64 streams only the running tree has run yet; at 16 the chain ran at 1.3 times the
    tree, so 64 runs the chain while its probes measure the rest."""
    learner = ShapeLearner(SHAPES)
    samples = []
    for t in range(10):
        samples += [sample("3x4x16", 16, 4000.0, float(t)), sample("3x1x4", 16, 5200.0, float(t)),
                    sample("plain", 16, 2300.0, float(t)), sample("3x4x16", 64, 3300.0, float(t))]
    learner.fit(samples, now=10.0)
    assert math.isclose(learner.estimates(64)["3x1x4"], 3300.0 * 1.3, rel_tol=1e-9)
    tier = learner.propose(10.0, None, {16: 0.5, 64: 0.5}).table.tier_for(64)
    assert tier_label(tier) == "d3"
    assert tier.explore_share > 0 and None in tier.explore_shapes  # off: not measured at 64


def test_with_no_evidence_the_live_table_runs_probing_every_other_shape() -> None:
    live = PolicyTable.build([Tier(1, 3)], version=4)
    learner = ShapeLearner(SHAPES)
    learner.fit([], now=0.0)
    proposal = learner.propose(0.0, live, {1: 1.0})
    tier = proposal.table.tiers[0]
    assert (tier_label(tier), proposal.table.version) == ("d3", 5)
    assert set(tier.explore_shapes) == {None, DraftShape(3, 4, 16)}
    assert proposal.predicted_tok_per_s == {}


def test_garbage_and_shapes_not_captured_are_ignored() -> None:
    learner = ShapeLearner(SHAPES)
    good = measured_everywhere(rounds=3)
    bad = [
        Sample("g", "t", 1.0, 1.0, 3, 1, float("nan"), 10.0, 20.0, 0.1),
        Sample("g", "t", 1.0, 1.0, 3, 1, 10.0, 10.0, 20.0, 0.0),
        Sample("g", "t", 1.0, 1.0, 3, 1, 10.0, 10.0, 5.0, 0.1),  # fewer tokens than requests
        Sample("g", "t", 1.0, 1.0, 5, 1, 10.0, 10.0, 20.0, 0.1, tree="5x8x32"),
    ]
    learner.fit(good + bad, now=3.0)
    clean = ShapeLearner(SHAPES)
    clean.fit(good, now=3.0)
    assert learner.cells == clean.cells
    assert sample_shape(bad[-1]) == "5x8x32" and sample_shape(good[0]) == "3x4x16"


def test_a_snapshot_proposes_what_the_learner_did() -> None:
    learner = ShapeLearner(SHAPES, seed=3)
    learner.fit(measured_everywhere(rounds=2), now=2.0)
    again = ShapeLearner.from_json(learner.to_json())
    assert again.propose(2.0, None, HIST).table == learner.propose(2.0, None, HIST).table
