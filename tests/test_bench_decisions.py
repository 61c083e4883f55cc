"""Which load levels may choose a depth: a sweep stopped part-way, an open loop below the
server's capacity, too few requests, repeats whose intervals overlap. Each level that cannot
decide says why in one line and is left out of the recommended table."""

from __future__ import annotations

from controller.bench.loadgen import StopRule
from controller.bench.prompts import synthetic_prompts
from controller.bench.report import (
    best_depths,
    recommend_table,
    recommendation_text,
    undecided_levels,
)
from controller.bench.server_client import ServerState
from controller.bench.sweep import LevelResult, SweepOutcome, SweepPlan, series_name


def level(  # type: ignore[no-untyped-def]
    depth: int | None, load: float, tok_s: float, batch: float | None = None, **kw
) -> LevelResult:
    """A closed-loop level at concurrency `load`, or with `rate=True` an open-loop level at
    `load` requests/s."""
    rate = kw.pop("rate", False)
    kw.setdefault("requests", 10)
    kw.setdefault("tpot_p50_ms", 1.0)
    return LevelResult(
        series=series_name(depth), depth=depth, concurrency=int(load) if not rate else 8,
        errors=0, elapsed_s=10.0, output_tok_per_s=tok_s, ttft_p50_ms=1.0, ttft_p90_ms=2.0,
        tpot_p90_ms=2.0, mean_batch=batch, accept_length=1.5, client_cpu_share=0.1,
        request_rate=load if rate else None, **kw,
    )  # fmt: skip


def outcome(results: list[LevelResult], depths: tuple[int, ...], rates: bool = False):  # type: ignore[no-untyped-def]
    plan = SweepPlan(
        url="http://127.0.0.1:1", depths=depths,
        concurrencies=() if rates else (1, 4), request_rates=(1.0, 2.0) if rates else (),
        stop=StopRule(duration_s=10), prompts=synthetic_prompts(1, 8, 8), prompt_source="t",
    )  # fmt: skip
    before = ServerState(None, 0, (0, 1, 2, 3), "none", None, 1)
    return SweepOutcome(plan=plan, before=before, results=results)


def test_a_sweep_stopped_after_depth_0_recommends_nothing_and_says_why_per_level() -> None:
    """Interrupted after d0's levels: comparing d0 with nothing recommended `1+: off`."""
    stopped = [level(0, 1, 300.0, 1.0), level(0, 4, 900.0, 4.0)]
    done = outcome(stopped, depths=(0, 1, 3))
    assert recommendation_text(done) is None
    assert recommend_table(stopped, depths=(0, 1, 3)) is None
    lines = [u.describe() for u in undecided_levels(stopped, depths=(0, 1, 3))]
    assert lines == [
        "c=1: only d0 measured (d1, d3 missing: the sweep stopped before them, or they were not "
        "asked for at this level); no depth chosen here",
        "c=4: only d0 measured (d1, d3 missing: the sweep stopped before them, or they were not "
        "asked for at this level); no depth chosen here",
    ]


def test_a_depth_measured_at_some_levels_only_decides_where_every_depth_ran() -> None:
    partial = [level(0, 1, 300.0, 1.0), level(0, 4, 900.0, 4.0), level(3, 1, 400.0, 1.0)]
    assert best_depths(partial, depths=(0, 3)) == {1: 3}
    table = recommend_table(partial, depths=(0, 3))
    assert table is not None and table.describe() == "1+: d3"
    [why] = undecided_levels(partial, depths=(0, 3))
    assert why.label == "c=4" and "d3 missing" in why.reason


def test_an_open_loop_below_capacity_is_compared_by_tpot_not_tok_s() -> None:
    """Every depth served its arrivals: 111.4 against 110.5 tok/s is the arrival rate's noise,
    while d3's TPOT was 8.8 ms against d1's 12.1 ms."""
    below = [
        level(1, 1.0, 55.6, 1.0, rate=True, offered_tok_per_s=55.5, tpot_p50_ms=12.0),
        level(3, 1.0, 55.2, 1.0, rate=True, offered_tok_per_s=55.5, tpot_p50_ms=8.7),
        level(1, 2.0, 110.5, 2.0, rate=True, offered_tok_per_s=111.0, tpot_p50_ms=12.1),
        level(3, 2.0, 111.4, 2.0, rate=True, offered_tok_per_s=111.0, tpot_p50_ms=8.8),
    ]
    done = outcome(below, depths=(1, 3), rates=True)
    assert recommendation_text(done) is None
    lines = [u.describe() for u in undecided_levels(below, depths=(1, 3))]
    assert len(lines) == 2
    assert lines[1].startswith("2/s: below capacity: every depth served the arrivals (tok/s d1 "
                               "110.5, d3 111.4; the arrivals asked for ~111.0)")  # fmt: skip
    assert "by TPOT p50 d3 serves each request fastest (d3 8.8 ms, d1 12.1 ms)" in lines[1]
    assert "raise --request-rate past the server's capacity or use --concurrency" in lines[1]


def test_an_open_loop_level_where_one_depth_alone_kept_up_chooses_it() -> None:
    """At 8/s d0 fell behind its arrivals (its queue grew) and d3 served them all: d3 wins
    there, whatever the tok/s noise; above capacity (16/s) tok/s decides as in a closed loop."""
    results = [
        level(0, 8.0, 700.0, 8.0, rate=True, offered_tok_per_s=890.0),
        level(3, 8.0, 880.0, 6.0, rate=True, offered_tok_per_s=890.0),
        level(0, 16.0, 1200.0, 48.0, rate=True, offered_tok_per_s=1780.0),
        level(3, 16.0, 1000.0, 48.0, rate=True, offered_tok_per_s=1780.0),
    ]
    assert best_depths(results, depths=(0, 3)) == {8.0: 3, 16.0: 0}
    assert undecided_levels(results, depths=(0, 3)) == []


def test_too_few_requests_in_a_window_cannot_tell_depths_apart() -> None:
    few = [level(0, 1, 300.0, 1.0), level(3, 1, 400.0, 1.0, requests=2)]
    assert best_depths(few) == {} and recommend_table(few) is None
    [why] = undecided_levels(few)
    assert "d3 too few requests" in why.reason and "--requests-per-level" in why.reason


def test_with_repeats_a_win_inside_the_confidence_intervals_keeps_the_depth() -> None:
    """d1 beats d3 by 5% at c=4, past the 2% noise margin, but the repeats' intervals
    (±30 tok/s each) cover the gap: d3, chosen at c=1, stays."""
    ci = {"output_tok_per_s": 30.0}
    n = {"repeats": 3, "requests": 30}
    results = [
        level(3, 1, 400.0, 1.0, **n, ci95=ci), level(1, 1, 300.0, 1.0, **n, ci95=ci),
        level(3, 4, 1000.0, 4.0, **n, ci95=ci), level(1, 4, 1050.0, 4.0, **n, ci95=ci),
    ]  # fmt: skip
    assert best_depths(results) == {1: 3, 4: 3}
    tight = [
        level(r.depth, r.concurrency, r.output_tok_per_s, r.mean_batch, **n,
              ci95={"output_tok_per_s": 5.0})
        for r in results
    ]  # fmt: skip
    assert best_depths(tight) == {1: 3, 4: 1}


def test_an_open_loop_held_at_its_stream_cap_is_decided_by_tok_s() -> None:
    """With --max-concurrency 8 reached, arrivals waited for a stream: the server's pace, not
    the arrival rate, set the tok/s, so it ranks the depths as in a closed loop."""
    capped = [
        level(1, 4.0, 800.0, 8.0, rate=True, offered_tok_per_s=820.0, max_concurrency=8),
        level(3, 4.0, 700.0, 8.0, rate=True, offered_tok_per_s=820.0, max_concurrency=8),
    ]
    assert undecided_levels(capped, depths=(1, 3)) == []
    assert best_depths(capped, depths=(1, 3)) == {4.0: 1}


def test_an_arrival_bound_level_whose_tpots_tie_says_so() -> None:
    tied = [
        level(1, 2.0, 135.7, 1.0, rate=True, offered_tok_per_s=135.7, tpot_p50_ms=2.15),
        level(3, 2.0, 135.5, 1.0, rate=True, offered_tok_per_s=135.7, tpot_p50_ms=2.13),
    ]
    [why] = undecided_levels(tied, depths=(1, 3))
    assert "TPOT p50 does not tell them apart either (d3 2.1 ms, d1 2.1 ms)" in why.reason
