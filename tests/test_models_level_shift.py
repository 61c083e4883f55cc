"""Evidence from early in a transition is rescaled to the acceptance level of the moment."""

from __future__ import annotations

import numpy as np
import pytest

from models.acceptance import chain_accepted
from models.evidence import sample_arrays
from models.level_shift import level_at, rescale_to_now
from models.samples import Sample

RHO = 0.9


def _sample(t: float, depth: int, q: float, batch: float = 24.0, iters: float = 100.0) -> Sample:
    steps = batch * iters
    accepted = float(chain_accepted(q, RHO, depth)) * steps
    return Sample("g", "sim", t, 15.0, depth, 24, iters, steps, steps + accepted, iters * 0.02)


def test_level_at_inverts_the_chain():
    for q in (0.3, 0.6, 0.8):
        rate = np.asarray([float(chain_accepted(q, RHO, 3))])
        assert level_at(rate, 3, RHO)[0] == pytest.approx(q, abs=0.003)


def test_a_depth_that_stopped_running_is_brought_to_the_running_depths_level():
    # Depth 4 ran while the level was 0.6 (t <= 150), then depth 3 ran on at 0.8.
    samples = [_sample(t, 4, 0.6) for t in range(15, 151, 15)]
    samples += [_sample(t, 3, 0.6) for t in range(15, 151, 15)]
    samples += [_sample(t, 3, 0.8) for t in range(165, 301, 15)]
    arrays = sample_arrays(samples)
    out = rescale_to_now(arrays, reference=3, rho=RHO, now=300.0)
    d4 = out["depth"] == 4
    per_step = (out["tokens"][d4] - out["request_steps"][d4]) / out["request_steps"][d4]
    assert per_step == pytest.approx(float(chain_accepted(0.8, RHO, 4)), rel=0.01)
    d3 = out["depth"] == 3
    assert np.array_equal(out["tokens"][d3], arrays["tokens"][d3])  # the reference is kept


def test_a_steady_workload_is_left_alone():
    samples = [_sample(t, d, 0.7) for t in range(15, 301, 15) for d in (2, 3)]
    arrays = sample_arrays(samples)
    out = rescale_to_now(arrays, reference=3, rho=RHO, now=300.0)
    assert out["tokens"] == pytest.approx(arrays["tokens"], rel=1e-6)
