"""Table-shaping rules: runs, tie merging, min_gain merging, hysteresis, crossovers."""

from __future__ import annotations

import numpy as np

from models.tiers import Run, crossovers, hysteresis_for, merge_small_gain_runs, runs_of


def test_runs_group_equal_depths_by_batch_size() -> None:
    runs = runs_of(np.asarray([3, 3, 1, 1, 1, 0]))
    assert [(r.lo, r.hi, r.depth) for r in runs] == [(1, 2, 3), (3, 5, 1), (6, 6, 0)]


def test_a_run_that_never_gains_min_gain_takes_a_neighbour_depth() -> None:
    b = np.arange(1, 31)
    low, mid, high = b <= 5, (b > 5) & (b <= 15), b > 15
    tok = {
        3: np.where(low, 110.0, 100.0),
        2: np.where(mid, 101.0, 90.0),  # wins its stretch by only 1%
        1: np.where(high, 110.0, 100.0),
    }
    best = np.where(low, 3, np.where(mid, 2, 1))
    assert [r.depth for r in merge_small_gain_runs(runs_of(best), tok, 0.005)] == [3, 2, 1]
    merged = merge_small_gain_runs(runs_of(best), tok, 0.02)
    assert 2 not in [r.depth for r in merged]
    assert merged[0].lo == 1 and merged[-1].hi == 30


def test_a_run_that_carries_the_load_keeps_a_gain_below_min_gain() -> None:
    b = np.arange(1, 31)
    low, mid, high = b <= 5, (b > 5) & (b <= 15), b > 15
    tok = {
        3: np.where(low, 110.0, 100.0),
        2: np.where(mid, 101.5, 90.0),  # wins its stretch by 1.5%: under min_gain (2%)
        1: np.where(high, 110.0, 100.0),
    }
    best = np.where(low, 3, np.where(mid, 2, 1))
    on_mid = np.where(mid, 0.5 / 10, 0.5 / 20)  # half the load sits on batch sizes 6-15
    on_high = np.where(high, 0.9 / 15, 0.1 / 15)  # the load sits above 15

    def merged(load: np.ndarray, loaded_min_gain: float) -> list[int]:
        runs = merge_small_gain_runs(
            runs_of(best), tok, 0.02, load=load, loaded_share=0.2, loaded_min_gain=loaded_min_gain
        )
        return [r.depth for r in runs]

    assert merged(on_mid, 0.01) == [3, 2, 1]
    # Elsewhere the load does not earn it its tier; nor does a gain under loaded_min_gain.
    assert 2 not in merged(on_high, 0.01)
    assert 2 not in merged(on_mid, 0.016)


def test_crossover_is_interpolated_between_the_two_batch_sizes() -> None:
    tok = {3: np.asarray([10.0, 8.0, 6.0]), 1: np.asarray([7.0, 7.0, 7.0])}
    got = crossovers([Run(1, 2, 3), Run(3, 3, 1)], tok)
    assert got == [(3, 1, 2.5)]  # 8 - 7 = 1 at batch 2, 6 - 7 = -1 at batch 3


def test_hysteresis_is_a_fraction_of_min_batch_inside_the_tier_below() -> None:
    assert hysteresis_for(1, 0, 0.125) == 0  # first tier
    assert hysteresis_for(32, 8, 0.125) == 4
    assert hysteresis_for(10, 8, 0.5) == 1  # capped: band must stay above the tier below
    assert hysteresis_for(9, 8, 0.5) == 0
