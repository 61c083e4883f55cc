"""`specctl bench` analysis: best depth per concurrency, crossovers, the recommended table."""

from __future__ import annotations

import dataclasses

import pytest

from controller.bench.prompts import DatasetError, load_dataset, synthetic_prompts
from controller.bench.report import (
    best_depths,
    crossovers,
    eviction_hint,
    recommend_table,
    stall_hint,
    undecided_levels,
)
from controller.bench.sweep import LevelResult, series_name


def level(depth: int | None, conc: int, tok_s: float, batch: float | None = None) -> LevelResult:
    return LevelResult(
        series=series_name(depth), depth=depth, concurrency=conc, requests=10, errors=0,
        elapsed_s=1.0, output_tok_per_s=tok_s, ttft_p50_ms=1.0, ttft_p90_ms=2.0,
        tpot_p50_ms=1.0, tpot_p90_ms=2.0, mean_batch=batch, accept_length=1.5,
        client_cpu_share=0.1,
    )  # fmt: skip


# Shaped like the seed team's measurements: deep drafting wins alone, loses under load.
SWEEP = [
    level(3, 1, 100, 1.0), level(3, 4, 300, 4.0), level(3, 16, 500, 16.0), level(3, 64, 520, 48.0),
    level(1, 1, 80, 1.0), level(1, 4, 260, 4.0), level(1, 16, 560, 16.0), level(1, 64, 640, 48.0),
    level(0, 1, 60, 1.0), level(0, 4, 200, 4.0), level(0, 16, 480, 16.0), level(0, 64, 700, 48.0),
]  # fmt: skip


def test_best_depth_per_concurrency_follows_the_measurements() -> None:
    assert best_depths(SWEEP) == {1: 3, 4: 3, 16: 1, 64: 0}


def test_a_win_inside_the_noise_margin_does_not_switch_depth() -> None:
    close = [level(3, 1, 100), level(1, 1, 90), level(3, 8, 100), level(1, 8, 101.5)]
    assert best_depths(close) == {1: 3, 8: 3}


def test_crossovers_interpolate_between_levels_and_report_batch_sizes() -> None:
    cross = crossovers(SWEEP)
    assert [(c.from_series, c.to_series) for c in cross] == [("d3", "d1"), ("d1", "d0")]
    # d3 - d1: +40 at 4, -60 at 16 -> 40% of the way in log2 space: 4 * 4**0.4 ~ 6.96
    assert cross[0].concurrency == pytest.approx(4 * 4**0.4, rel=1e-6)
    assert cross[0].batch == pytest.approx(4 + 0.4 * 12, rel=1e-6)
    assert 16 < cross[1].concurrency < 64 and 16 < cross[1].batch < 48


def test_a_level_left_out_of_one_series_decides_nothing_and_leaves_that_crossover_unplaced() -> (
    None
):
    """d1 is best at 16 and only d3 finished a request at 64 (d1's level was too short): d1 may
    still be best at 64, so that level chooses no depth and says why, and the change of best
    depth after 16 is neither interpolated nor guessed."""
    too_short = dataclasses.replace(level(1, 64, 900, 8.0), too_short=True)
    sweep = [level(3, 4, 300, 4.0), level(3, 16, 500, 16.0), level(3, 64, 520, 48.0),
             level(1, 4, 200, 4.0), level(1, 16, 560, 16.0), too_short]  # fmt: skip
    assert best_depths(sweep) == {4: 3, 16: 1}
    assert [(c.from_series, c.to_series) for c in crossovers(sweep)] == [("d3", "d1")]
    [why] = undecided_levels(sweep)
    assert why.label == "c=64" and "d1 too short" in why.reason and "no depth chosen" in why.reason


def test_recommended_table_is_a_valid_contract_table_keyed_by_batch() -> None:
    table = recommend_table(SWEEP, captured_depths=[0, 1, 3])
    assert table is not None
    assert [t.depth for t in table.tiers] == [3, 1, 0]
    assert table.tiers[1].min_batch == 9  # ceil(8.8)
    assert all(t.hysteresis < t.min_batch for t in table.tiers)
    assert table.depth_for(1) == 3 and table.depth_for(100) == 0


def test_no_spec_crossover_is_reported_where_it_overtakes_the_best_depth() -> None:
    nospec = [level(None, 1, 70), level(None, 4, 250), level(None, 16, 600), level(None, 64, 800)]
    cross = crossovers(SWEEP + nospec)
    assert cross[-1].from_series == "best spec" and cross[-1].to_series == "no-spec"
    assert 4 < cross[-1].concurrency < 16


def test_dataset_errors_name_the_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "hi"}\n\n{"prompt": "x", "output_tokens": 0}\n')
    with pytest.raises(DatasetError, match=r"p.jsonl:3: 'output_tokens' must be an integer >= 1"):
        load_dataset(path, 16)
    path.write_text('{"prompt": "hi", "output_tokens": 5}\nnot json\n')
    with pytest.raises(DatasetError, match=r"p.jsonl:2: not valid JSON"):
        load_dataset(path, 16)
    path.write_text('{"prompt": "hi", "output_tokens": 5}\n{"prompt": "yo"}\n')
    assert [(p.text, p.output_tokens) for p in load_dataset(path, 16)] == [("hi", 5), ("yo", 16)]


def test_synthetic_prompts_are_distinct_and_about_the_requested_length() -> None:
    prompts = synthetic_prompts(50, 100, 8)
    assert len({p.text for p in prompts}) == 50
    assert all(95 <= len(p.text.split()) <= 100 for p in prompts)


def test_stall_hint_names_stalled_levels_and_what_to_try() -> None:
    calm = dataclasses.replace(level(0, 4, 100), ttft_p50_ms=30.0, ttft_p99_ms=60.0)
    stalled = dataclasses.replace(level(0, 16, 100), ttft_p50_ms=40.0, ttft_p99_ms=480.0)
    tiny = dataclasses.replace(level(0, 1, 100), ttft_p50_ms=5.0, ttft_p99_ms=40.0)  # < 100 ms
    assert stall_hint([calm, tiny], gc_frozen=False) is None
    hint = stall_hint([calm, stalled, tiny], gc_frozen=False)
    assert hint is not None and "d0 c=16 (480 ms vs 40)" in hint and "c=4" not in hint
    assert "rerun with --freeze-gc" in hint
    frozen = stall_hint([stalled], gc_frozen=True)
    assert frozen is not None and "collectors were frozen" in frozen


def test_eviction_hint_names_levels_that_spent_a_share_of_the_window_evicting() -> None:
    """A share of the window at or above EVICTION_SHARE is named with its calls; the advice
    depends on whether the caches were emptied before each level."""
    light = dataclasses.replace(level(0, 16, 100), elapsed_s=10.0, evict_ms=20.0, evictions=40)
    heavy = dataclasses.replace(level(0, 64, 100), elapsed_s=10.0, evict_ms=350.0, evictions=700)
    unknown = dataclasses.replace(level(0, 128, 100), elapsed_s=10.0)
    assert eviction_hint([light, unknown], flushed=False) is None
    hint = eviction_hint([light, heavy, unknown], flushed=False)
    assert hint is not None and "d0 c=64 (3.5%, 700 calls)" in hint and "c=16" not in hint
    assert "--flush-cache" in hint
    emptied = eviction_hint([heavy], flushed=True)
    assert emptied is not None and "the level alone filled the KV pool" in emptied
