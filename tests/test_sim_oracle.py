"""The oracle: best depth per batch size, crossovers, and the per-iteration oracle policy."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from sims.engine import Engine
from sims.oracle import OraclePolicy, decode_curves, oracle_curve
from sims.policies import FixedDepthPolicy, spec_cuda_graph_batch_sizes
from sims.profile import load_profile
from sims.workload import Workload


@pytest.fixture(scope="module")
def kimi():
    return load_profile("kimi-k25-8x-rtxpro6000-pcie")


@pytest.fixture(scope="module")
def llama():
    return load_profile("h100-llama8b-eagle3")


def test_best_depth_is_the_argmax_of_the_curves(kimi):
    curve = oracle_curve(kimi)
    _, curves, nospec = decode_curves(kimi)
    for row in curve.rows[:48]:
        i = row.batch - 1
        best = max(curves, key=lambda d: curves[d][i])
        assert row.best_depth == best
        assert row.tok_per_s == pytest.approx(curves[best][i])
        assert row.nospec_tok_per_s == pytest.approx(nospec[i])
    assert curve.rows[48].best_depth is None  # beyond the speculative running cap (48)


def _at_graph_sizes(profile) -> list[int]:
    """Best depth at the CUDA-graph batch sizes (between them padding adds a sawtooth)."""
    sizes = set(spec_cuda_graph_batch_sizes(profile.max_running(True)))
    return [r.best_depth for r in oracle_curve(profile).rows if r.batch in sizes]


def test_best_depth_falls_as_the_batch_grows(kimi, llama):
    for profile in (kimi, llama):
        depths = _at_graph_sizes(profile)
        assert depths[0] >= 2
        assert all(b <= a for a, b in itertools.pairwise(depths))
        assert depths[-1] < depths[0]


def test_crossovers_differ_between_profiles(kimi, llama):
    kimi_cross = oracle_curve(kimi).nospec_crossover()
    assert kimi_cross is not None and 2 <= kimi_cross <= 32
    # A dense 8B on one H100 is memory bound up to the speculative cap: speculation wins.
    assert oracle_curve(llama).nospec_crossover() is None
    assert oracle_curve(llama).best_depth_changes()
    assert _at_graph_sizes(llama)[-1] < _at_graph_sizes(llama)[0]


def test_oracle_policy_beats_every_fixed_depth(kimi):
    def run(policy) -> float:
        engine = Engine(
            kimi, Workload.closed(12, prompt_tokens=512, output_tokens=256), seed=3, policy=policy
        )
        engine.run_until(600)
        return engine.stats.tokens_generated / engine.now

    oracle = run(OraclePolicy(kimi))
    fixed = [run(FixedDepthPolicy(d)) for d in kimi.captured_depths]
    assert oracle >= max(fixed) * 0.99


def test_oracle_policy_follows_the_phase_of_the_batch(llama):
    policy = OraclePolicy(llama)
    chosen = {}
    for phase in ("chat", "code"):
        engine = Engine(
            llama,
            Workload.closed(40, prompt_tokens=512, output_tokens=128, phase=phase),
            seed=0,
            policy=policy,
        )
        engine.run_until(30)
        chosen[phase] = engine.stats.iterations_per_depth
    top = {p: max(c, key=lambda d: c[d]) for p, c in chosen.items()}
    assert top["code"] >= top["chat"]
    assert np.isfinite(list(chosen["chat"].values())).all()
