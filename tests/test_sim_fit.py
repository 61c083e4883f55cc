"""`specctl sim fit` without HTTP: the replay, the acceptance, the fit, the bench file's errors.

The end-to-end test over loopback HTTP (`specctl bench` against `specctl sim serve`, then the
fit) is tests/test_sim_fit_e2e.py. Here the measured side of a "bench" is the replay of a known
profile itself (the same protocol, in process), so the fit can be checked on every field,
two prompt lengths included, on the simulator's clock instead of a served bench's.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from controller.cli import app
from sims.engine import Engine
from sims.fit.bench_file import BenchFileError, BenchRun, Level, load_bench
from sims.fit.closed_form import host_floor_guesses
from sims.fit.fitting import FitResult, fit_profile, framed_only, split_levels
from sims.fit.framing import FitError, acceptance_rates, active_keys, frame
from sims.fit.outliers import slower_than_more_streams
from sims.fit.params import with_values
from sims.fit.repeats import find_repeats, pool_repeats, repeats_line
from sims.fit.replay import LevelShape, replay
from sims.fit.replayed_bench import replayed_bench
from sims.fit.report import (
    Report,
    Row,
    bench_names,
    best_depths,
    off_costs,
    render,
    replay_rows,
    summarize,
)
from sims.profile import load_profile
from sims.workload import Workload

TRUTH = Path(__file__).parent / "data" / "fit_truth.yaml"


def replayed(
    prompts: tuple[int, ...], concurrency=(1, 8), depths=(0, 1, 3), output=64, seconds=8.0
) -> list[BenchRun]:
    """One bench per prompt length, its levels measured by replaying the truth profile."""
    truth = load_profile(TRUTH)
    return [
        replayed_bench(truth, depths=depths, concurrency=concurrency, prompt_tokens=prompt,
                       output_tokens=output, seconds=seconds, phase="chat", name=f"p{prompt}")
        for prompt in prompts
    ]  # fmt: skip


def test_replay_of_one_stream_is_the_cost_model() -> None:
    """At one stream nothing interleaves: TPOT is the step, TTFT the prefill plus the client's
    time, tok/s the output over the whole cycle."""
    truth = load_profile(TRUTH).model_copy(update={"step_time_cv": 0.0})
    sched = truth.scheduler.model_copy(
        update={"request_overhead_ms": 30.0, "ttft_overhead_ms": 5.0}
    )
    prof = truth.model_copy(update={"scheduler": sched})
    r = replay(prof, LevelShape(None, 1, 200, 50, 20.0), phase="chat")
    step = float(prof.iteration_ms(None, 1, 200 + 25))
    prefill = sched.prefill_fixed_ms + sched.prefill_us_per_token * 200 / 1000
    assert r.tpot_p50_ms == pytest.approx(step, rel=0.02)
    assert r.server_ttft_ms == pytest.approx(prefill, rel=1e-6)
    assert r.ttft_p50_ms == pytest.approx(prefill + 5.0, rel=1e-6)
    cycle_s = (prefill + 49 * step + 30.0) / 1000
    assert r.tok_per_s == pytest.approx(50 / cycle_s, rel=0.05)


def test_replay_honours_a_request_limit_and_the_front_end() -> None:
    truth = load_profile(TRUTH)
    limited = replay(truth, LevelShape(0, 4, 100, 20, 30.0, request_limit=10), phase="chat")
    assert limited.completed == 10
    sched = truth.scheduler.model_copy(update={"frontend_ms": 50.0})
    slow = truth.model_copy(update={"scheduler": sched})
    # Eight requests sent at once pass a 50 ms front end one after the other.
    engine = Engine(slow, Workload.closed(8, prompt_tokens=100, output_tokens=20), seed=0)
    engine.request_log = []
    engine.run_until(3.0)
    first_wave = sorted(engine.request_log)[:8]
    assert [sent for sent, *_ in first_wave] == [0.0] * 8
    assert [round(queued, 3) for _, queued, *_ in first_wave] == [
        round(0.05 * k, 3) for k in range(1, 9)
    ]
    base = replay(truth, LevelShape(0, 8, 100, 20, 10.0), phase="chat")
    queued = replay(slow, LevelShape(0, 8, 100, 20, 10.0), phase="chat")
    assert queued.tok_per_s < base.tok_per_s


def test_acceptance_rates_reproduce_the_measured_lengths() -> None:
    truth = load_profile(TRUTH)
    lengths = {d: truth.acceptance.expected_length("chat", d) for d in (1, 3)}
    rates = acceptance_rates(lengths, 4)
    chain = np.cumprod(rates)
    assert 1 + chain[:1].sum() == pytest.approx(lengths[1], abs=1e-3)
    assert 1 + chain[:3].sum() == pytest.approx(lengths[3], abs=1e-3)
    assert rates[1] == rates[2]  # constant between two measured depths
    assert acceptance_rates({1: 1.0, 3: 1.0}, 3) == [0.0, 0.0, 0.0]  # random weights


# A whole fit: 50-65 s alone on one core, up to twice that under four workers on two
@pytest.mark.timeout(900)
def test_fit_recovers_every_cost_from_two_prompt_lengths() -> None:
    """Two prompt lengths pin the context and prefill terms too; the fit starts from the
    h200-llama8b-eagle3 profile, whose costs are 2-10x off the truth's."""
    truth = load_profile(TRUTH)
    runs = replayed((160, 800))
    result = fit_profile(runs, load_profile("h200-llama8b-eagle3"), "fitted")
    prof = result.profile
    assert "target.kv_us_per_req_per_1k_ctx" in result.keys and not result.unfit
    for prompt in (160, 800):
        ctx = prompt + 32
        for depth in (None, 0, 1, 2, 3):
            for batch in (1, 4, 8):
                got = float(prof.iteration_ms(depth, batch, ctx))
                want = float(truth.iteration_ms(depth, batch, ctx))
                assert got == pytest.approx(want, rel=0.03), (depth, batch, prompt)
        for wave in (1, 8):
            s, t = prof.scheduler, truth.scheduler
            got = s.prefill_fixed_ms + s.prefill_us_per_token * wave * prompt / 1000
            want = t.prefill_fixed_ms + t.prefill_us_per_token * wave * prompt / 1000
            assert got == pytest.approx(want, rel=0.05), (wave, prompt)
    for depth in (1, 2, 3):
        assert prof.acceptance.expected_length("bench", depth) == pytest.approx(
            truth.acceptance.expected_length("chat", depth), rel=0.02
        )
    # The part of each iteration the GPU timer does not see: from depth 0 alone, where time
    # per token is the whole iteration and the counters give the timed part.
    assert prof.scheduler.untimed_ms == pytest.approx(truth.scheduler.untimed_ms, abs=0.2)
    assert prof.scheduler.max_running_requests_spec == 32
    assert prof.scheduler.max_running_requests_nospec == 64


@pytest.fixture(scope="module")
def one_prompt_fit() -> tuple[BenchRun, FitResult]:
    """One prompt length at one and four streams fitted from the truth, its prompts come round
    (which changes only the result's notes): one fit for the tests of what it keeps and says."""
    run = replace(replayed((160,), concurrency=(1, 4))[0], prompts_came_round=True)
    return run, fit_profile([run], load_profile(TRUTH), "f")


def test_one_prompt_length_keeps_the_context_term_and_says_why(
    one_prompt_fit: tuple[BenchRun, FitResult],
) -> None:
    _, result = one_prompt_fit
    assert "target.kv_us_per_req_per_1k_ctx" not in result.keys
    assert "one context length" in result.kept["target.kv_us_per_req_per_1k_ctx"]


def test_a_bench_whose_prompts_came_round_gets_a_note(
    one_prompt_fit: tuple[BenchRun, FitResult],
) -> None:
    """The model has no prefix cache: a bench whose repeats the server's cache could serve
    whole is fitted, and the result says which and why."""
    run, result = one_prompt_fit
    assert [n for n in result.notes if "came round" in n] == [
        f"{run.path}: its prompts came round within a server's KV pool, so its prefix "
        "cache may have served repeats whole (one token left to prefill, which SGLang's plain "
        "server runs eager); the model has no prefix cache, so its prefill fields take that "
        "in: fit benches of more prompts than requests"]


def test_a_kept_field_holds_the_base_value_and_says_why() -> None:
    """`--keep FIELD`: the field is not fitted even where the benches could tell it, and the
    result names why; a name that is no fitted field is refused before any replay."""
    base = load_profile(TRUTH)
    pinned = base.scheduler.prefill_fixed_ms * 3
    base = base.model_copy(
        update={"scheduler": base.scheduler.model_copy(update={"prefill_fixed_ms": pinned})}
    )
    runs = replayed((160,), concurrency=(1, 4))
    result = fit_profile(runs, base, "f", keep=["scheduler.prefill_fixed_ms"])
    assert "scheduler.prefill_fixed_ms" not in result.keys
    assert result.kept["scheduler.prefill_fixed_ms"] == "held at the base's value (--keep)"
    assert result.profile.scheduler.prefill_fixed_ms == pinned
    assert "scheduler.prefill_us_per_token" in result.keys  # the others still fitted
    with pytest.raises(FitError, match=r"--keep draft\.prefil_ms: not a fitted field; one of"):
        fit_profile(runs, base, "f", keep=["draft.prefil_ms"])


def test_a_level_the_model_cannot_reproduce_is_an_outlier_with_its_reason() -> None:
    """A level whose tokens came 70% slower than the server's own step allows (as if
    something outside the GPU timer stalled it) is set aside and named; the rest still
    recovers the truth, and the report gives the error with and without it."""
    truth = load_profile(TRUTH)
    run = replayed((160,))[0]
    levels = list(run.levels)
    i = next(k for k, lv in enumerate(levels) if lv.label == "d1 c=8")
    slow = levels[i]
    assert slow.tpot_p50_ms and slow.server_itl_ms
    levels[i] = replace(
        slow, tok_per_s=slow.tok_per_s / 1.7, tpot_p50_ms=slow.tpot_p50_ms * 1.7,
        server_itl_ms=slow.server_itl_ms * 1.7,
    )  # fmt: skip
    result = fit_profile([replace(run, levels=tuple(levels))], truth, "f")
    [outlier] = result.outliers
    assert outlier.level is levels[i] and levels[i] not in result.levels
    assert "misses it by" in outlier.reason and "outside the timer" in outlier.reason
    for depth, batch in ((None, 8), (0, 8), (1, 1), (3, 8)):
        got, want = (float(p.iteration_ms(depth, batch, 192)) for p in (result.profile, truth))
        assert got == pytest.approx(want, rel=0.03), (depth, batch)
    limits = {run.path: None}
    rows = replay_rows(result.profile, result.levels, limits, None, [levels[i]])
    report = Report(result, truth, rows, "f.yaml").to_json()
    assert [r["outlier"] for r in report["rows"]].count(True) == 1
    assert report["error"]["tok_per_s"]["worst"] < 0.1
    assert report["error_with_outliers"]["tok_per_s"]["worst_at"] == "d1 c=8"
    assert report["outliers"][0]["reason"] == outlier.reason


def test_several_benches_are_named_by_what_tells_their_paths_apart() -> None:
    """With two bench files the table, the worst level and the outlier lines name each file
    by its folder ("bench_w512"), not its whole path, which pushed the figures out of a
    110-column table; a legend under the table gives the paths."""
    a, b = "res/run6/bench_w512/bench.json", "res/run6/bench_family/bench.json"
    assert bench_names([a, b, a]) == {a: "bench_w512", b: "bench_family"}
    assert bench_names(["x/s1.json", "x/s2.json"]) == {
        "x/s1.json": "s1.json", "x/s2.json": "s2.json"}  # fmt: skip
    assert bench_names(["only/bench.json"]) == {"only/bench.json": "bench.json"}
    assert bench_names(["a/bench.json", "a/b/bench.json"]) == {
        "a/bench.json": "bench.json", "a/b/bench.json": "b/bench.json"}  # fmt: skip
    run = replayed((160,), concurrency=(1, 4), depths=(0,))[0]
    levels = [replace(lv, source=src) for lv in run.levels for src in (a, b)]
    rows = [Row(level=lv, tok_per_s=lv.tok_per_s * (1.2 if lv.source == b else 1.0),
                tpot_ms=lv.tpot_p50_ms, ttft_ms=None, outlier=False) for lv in levels]  # fmt: skip
    worst = summarize(rows, "tok_per_s")
    assert worst is not None and worst.worst == pytest.approx(0.2)
    assert worst.worst_at.endswith(", bench_family")
    truth = load_profile(TRUTH)
    result = framed_only([run], truth)  # these lines come from the rows, not from fitted costs
    report = Report(replace(result, levels=levels), truth, rows, "f.yaml")
    table, *lines = render(report)
    cells = [str(c) for c in table.columns[0]._cells]
    assert "d0 (bench_w512)" in cells and "d0 (bench_family)" in cells
    assert not any("res/run6" in c for c in cells)
    assert f"bench_w512 = {a}" in " ".join(str(x) for x in lines)
    assert summarize(rows[:2][::2], "tok_per_s").worst_at == "d0 c=1"  # type: ignore[union-attr]


def test_the_report_sets_the_benchs_best_depth_beside_the_replays() -> None:
    """Depths 0 and 3 at two levels: the replay agrees at one stream and, made 60% slower at
    depth 3 with four streams, picks depth 0 there; the line and the JSON say where."""
    run = replayed((160,), concurrency=(1, 4), depths=(0, 3))[0]

    def replayed_as(lv):  # the replay's tok/s: measured, but depth 3 at 4 streams 60% slower
        slow = lv.depth == 3 and lv.concurrency == 4
        return Row(level=lv, tok_per_s=lv.tok_per_s * (0.4 if slow else 1.0),
                   tpot_ms=lv.tpot_p50_ms, ttft_ms=None)  # fmt: skip

    rows = [replayed_as(lv) for lv in run.levels]
    measured = {(lv.series, lv.concurrency): lv.tok_per_s for lv in run.levels}
    assert measured[("d3", 4)] > measured[("d0", 4)] > measured[("d3", 4)] * 0.4  # it flips
    best = best_depths(rows)
    assert [(b.concurrency, b.bench, b.replay, b.agrees) for b in best] == [
        (1, "d3", "d3", True), (4, "d3", "d0", False)]  # fmt: skip
    truth = load_profile(TRUTH)
    result = framed_only([run], truth)  # these lines come from the rows, not from fitted costs
    report = Report(replace(result, levels=list(run.levels)), truth, rows, "f.yaml")
    _, *lines = render(report)
    text = " ".join(str(x) for x in lines)
    assert "best depth per level: c=1 d3, c=4 d3/d0; the replay picks another depth at 1 of 2" \
        in text
    written = report.to_json()["best_depth"]
    assert [b["agrees"] for b in written] == [True, False] and written[1]["replay"] == "d0"
    assert all(b.agrees for b in best_depths([replace(r, tok_per_s=r.level.tok_per_s)
                                              for r in rows]))  # fmt: skip
    assert "at every level" in str(render(replace(report, rows=[
        replace(r, tok_per_s=r.level.tok_per_s) for r in rows]))[1:])  # fmt: skip


def test_levels_benched_twice_report_the_servers_own_spread() -> None:
    """The same levels in two bench files, one 10% faster at one stream: the report says how
    far the server repeated itself, beside the fit's error. Other request shapes (a longer
    prompt, spread outputs) and a level one bench alone measured are not repeats."""
    run = replayed((160,), concurrency=(1, 4), depths=(0,))[0]
    d0 = [lv for lv in run.levels if lv.depth == 0]  # the plain server's levels left out
    assert [lv.concurrency for lv in d0] == [1, 4]
    a, b = "r/one/bench.json", "r/two/bench.json"
    first = [replace(lv, source=a) for lv in d0]
    faster = {1: 1.1, 4: 1.0}
    second = [replace(lv, source=b, tok_per_s=lv.tok_per_s * faster[lv.concurrency])
              for lv in d0]  # fmt: skip
    longer = replace(first[0], source="r/three/bench.json",
                     prompt_tokens=4 * (first[0].prompt_tokens or 1))  # fmt: skip
    spread = replace(first[0], source="r/four/bench.json", output_tokens_min=16,
                     output_tokens_max=300)  # fmt: skip
    found = find_repeats([*first, *second, longer, spread])
    assert [(r.label, r.benches) for r in found] == [("d0 c=1", 2), ("d0 c=4", 2)]
    assert found[0].tok_spread == pytest.approx(0.1) and found[1].tok_spread == pytest.approx(0)
    assert found[0].tpot_spread == pytest.approx(0.0)
    assert find_repeats(first) == [] and repeats_line([]) is None
    line = repeats_line(found)
    assert line is not None and "most +10.0% (d0 c=1, 2 benches)" in line
    truth = load_profile(TRUTH)
    result = framed_only([run], truth)  # these lines come from the rows, not from fitted costs
    rows = [Row(level=lv, tok_per_s=lv.tok_per_s, tpot_ms=lv.tpot_p50_ms, ttft_ms=None)
            for lv in [*first, *second]]  # fmt: skip
    report = Report(replace(result, levels=[*first, *second], repeats=found), truth, rows,
                    "f.yaml")  # fmt: skip
    assert any("the server's own spread over 2 levels" in str(x) for x in render(report))
    written = report.to_json()["repeats"]
    assert written[0] == {"level": "d0 c=1", "benches": 2, "tok_per_s_spread": 0.1,
                          "tpot_spread": 0.0}  # fmt: skip


def test_repeats_pool_into_their_mean_and_the_fit_judges_that() -> None:
    """Two benches of the same levels, the second 20% faster at one stream over a window half
    as long: pooled, that level's tok/s is over both windows together (+6.7%) and its TPOT the
    mean; a level one bench alone measured, or with another request shape, stays as it was. The
    fit with `pool` replays each pooled level once and reports it as the mean of two."""
    run = replayed((160,), concurrency=(1, 4), depths=(0,))[0]
    a, b = "r/one/bench.json", "r/two/bench.json"
    first = [replace(lv, source=a) for lv in run.levels]
    second = [
        replace(lv, source=b, tok_per_s=lv.tok_per_s * 1.2, elapsed_s=lv.elapsed_s / 2,
                tpot_p50_ms=(lv.tpot_p50_ms or 0) * 0.8)
        if lv.concurrency == 1 and lv.depth == 0 else replace(lv, source=b)
        for lv in run.levels
    ]  # fmt: skip
    longer = replace(first[0], source="r/three/bench.json",
                     prompt_tokens=4 * (first[0].prompt_tokens or 1))  # fmt: skip
    pooled = pool_repeats([*first, *second, longer])
    assert len(pooled) == len(first) + 1 and pooled[-1] is longer
    one = next(lv for lv in pooled if lv.label == "d0 c=1")
    base = first[[lv.label for lv in first].index("d0 c=1")]
    assert one.benches == 2 and one.source == a
    assert one.tok_per_s == pytest.approx(base.tok_per_s * (1 + 1.2 / 2) / 1.5)
    assert one.tpot_p50_ms == pytest.approx((base.tpot_p50_ms or 0) * 0.9)
    assert one.requests == 2 * base.requests
    runs = [replace(run, path=a, levels=tuple(first)), replace(run, path=b, levels=tuple(second))]
    result = fit_profile(runs, load_profile(TRUTH), "f", pool=True, set_aside=False)
    assert result.pooled and [r.label for r in result.repeats] == [lv.label for lv in first]
    assert len(result.levels) == len(first) and {lv.benches for lv in result.levels} == {2}
    limits = {a: None, b: None}
    rows = replay_rows(result.profile, result.levels, limits)
    report = Report(result, load_profile(TRUTH), rows, "f.yaml")
    text = "\n".join(str(x) for x in render(report)[1:])
    assert "judged as the mean of its repeats" in text
    assert {r["benches"] for r in report.to_json()["rows"]} == {2}


def test_unfit_levels_are_named_with_their_reason() -> None:
    run = replayed((160,), concurrency=(1, 4))[0]
    levels = list(run.levels)
    levels[1] = replace(levels[1], foreign_traffic=True)
    levels[2] = replace(levels[2], requests=0)
    levels[3] = replace(levels[3], errors=2)
    fit, unfit = split_levels([replace(run, levels=tuple(levels))])
    reasons = {u.level.label: u.reason for u in unfit}
    assert len(fit) == len(levels) - 3
    assert "flagged foreign traffic" in reasons[levels[1].label]
    assert reasons[levels[2].label] == "no finished request"
    assert reasons[levels[3].label] == "2 failed request(s)"


# ----------------------------------------------------------------------------- bench files


def bench_json(tmp_path: Path, **changes: object) -> Path:
    """A minimal valid bench.json (one level), with top-level keys changed or removed."""
    facts = {"max_running_requests": 48, "effective_max_running_requests_per_dp": 48,
             "captured_depths": [0, 1, 2, 3], "speculative_num_steps": 3}  # fmt: skip
    data: dict[str, object] = {
        "format": "specctl-bench/2",
        "stop_rule": {"requests": None, "duration_s": 10.0},
        "servers": {"spec": facts},
        "results": [
            {"series": "d1", "depth": 1, "concurrency": 2, "requests": 5, "errors": 0,
             "elapsed_s": 10.0, "output_tok_per_s": 100.0, "ttft_p50_ms": 20.0,
             "tpot_p50_ms": 8.0, "step_ms": 12.0, "mean_batch": 2.0, "accept_length": 1.6,
             "prompt_tokens": 128.0, "output_tokens": 64.0, "foreign_traffic": False}
        ],
    }  # fmt: skip
    for key, value in changes.items():
        if value is None:
            data.pop(key)
        else:
            data[key] = value
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(data))
    return path


def test_a_valid_bench_file_loads(tmp_path: Path) -> None:
    run = load_bench(bench_json(tmp_path))
    assert run.spec.cap == 48 and run.duration_s == 10.0
    assert run.levels[0].step_ms == 12.0 and run.levels[0].unfit_reason() is None
    assert run.prompts_came_round is False  # benches before the key existed
    assert load_bench(bench_json(tmp_path, prompts_came_round=True)).prompts_came_round


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"format": None}, "format: no 'format', the fit needs 'specctl-bench/2'"),
        ({"servers": None}, "servers: must be an object"),
        ({"servers": {"spec": {"max_running_requests": None}}},
         "servers.spec.max_running_requests: must be an integer >= 1, got None"),
        ({"stop_rule": {"requests": 5, "duration_s": 3.0}},
         "stop_rule: give exactly one of requests and duration_s"),
        ({"results": []}, "results: must be a non-empty list of levels"),
        ({"results": [{"series": "d1", "depth": 1, "concurrency": 2, "requests": 5,
                       "errors": 0, "elapsed_s": 1.0, "output_tok_per_s": "fast"}]},
         "results[0].output_tok_per_s: must be a number, got 'fast'"),
        ({"results": [{"series": "no-spec", "depth": None, "concurrency": 1}]},
         "servers.no_spec: missing, but results[0] is a 'no-spec' level"),
        ({"results": [{"series": "d1", "depth": 1, "concurrency": 2, "requests": 5,
                       "errors": 0, "elapsed_s": 1.0, "output_tok_per_s": 9.0,
                       "output_tokens_min": 90, "output_tokens_max": 30}]},
         "results[0].output_tokens_min: 90 is above output_tokens_max (30)"),
        ({"results": [{"series": "d1", "depth": 1, "concurrency": 2, "requests": 5,
                       "errors": 0, "elapsed_s": 1.0, "output_tok_per_s": 9.0,
                       "output_tokens_max": 2.5}]},
         "results[0].output_tokens_max: must be an integer or null >= 1, got 2.5"),
        ({"results": [{"series": "d1", "depth": 1, "concurrency": 2, "requests": 5,
                       "errors": 0, "elapsed_s": 1.0, "output_tok_per_s": 9.0,
                       "prefill_passes": -3, "decode_passes": 40}]},
         "results[0].prefill_passes: must be an integer or null >= 0, got -3"),
    ],
)  # fmt: skip
def test_bench_file_errors_name_the_field(tmp_path: Path, changes: dict, message: str) -> None:
    path = bench_json(tmp_path, **changes)
    with pytest.raises(BenchFileError) as err:
        load_bench(path)
    assert str(err.value).startswith(f"{path}: {message}")


def test_the_recv_interval_the_servers_ran_with_goes_into_the_profile(tmp_path: Path) -> None:
    """SGLang's --scheduler-recv-interval, as the bench recorded it from /server_info, is the
    profile's `scheduler.recv_interval`; benches of servers that differ in it cannot share one."""
    facts = {"max_running_requests": 48, "captured_depths": [0, 1, 3],
             "speculative_num_steps": 3}  # fmt: skip
    base = load_profile("h200-sglang-llama8b-seeded")
    runs = []
    for value in (8, 4):
        folder = tmp_path / f"recv{value}"
        folder.mkdir()
        run = load_bench(
            bench_json(folder, servers={"spec": {**facts, "scheduler_recv_interval": value}})
        )
        assert run.spec.recv_interval == value
        runs.append(run)
    assert frame(base, runs[:1], runs[0].levels, "x").scheduler.recv_interval == 8
    unrecorded = load_bench(bench_json(tmp_path, servers={"spec": facts}))
    framed = frame(base, [unrecorded], unrecorded.levels, "x")
    assert framed.scheduler.recv_interval == base.scheduler.recv_interval
    with pytest.raises(FitError, match=r"different --scheduler-recv-interval values \(4, 8\)"):
        frame(base, runs, [*runs[0].levels, *runs[1].levels], "x")
    bad = bench_json(tmp_path, servers={"spec": {**facts, "scheduler_recv_interval": 0}})
    with pytest.raises(BenchFileError, match=r"servers\.spec\.scheduler_recv_interval: must be"):
        load_bench(bad)


def test_the_depth_0_extend_the_bench_recorded_goes_into_the_profile(tmp_path: Path) -> None:
    """Whether depth 0 ran the draft extend (`draft.extend_at_depth0`): SGLang's own depth 0
    did, the plugin's off path did not. Read from the `off_path` a bench records now, or from
    an older bench's `off_mode` (its three modes); `--off-path` overrides either; unrecorded,
    the base's, with a note saying so. A value of neither kind is refused naming it."""
    from sims.fit.framing import off_path_note

    facts = {"max_running_requests": 48, "captured_depths": [0, 1, 3],
             "speculative_num_steps": 3}  # fmt: skip
    base = load_profile("h200-llama8b-eagle3")
    assert base.draft.extend_at_depth0
    recorded: list[tuple[dict[str, object], str, bool]] = [
        ({"off_path": {"path": "specctl", "features": ["skip-extend"]}}, "specctl", False),
        ({"off_path": {"path": "sglang", "features": []}}, "sglang", True),
        ({"off_mode": "skip-extend"}, "specctl", False),
        ({"off_mode": "skip-extend-all"}, "specctl", False),
        ({"off_mode": "sglang"}, "sglang", True),
    ]
    for i, (fields, path, extend) in enumerate(recorded):
        folder = tmp_path / str(i)
        folder.mkdir()
        run = load_bench(bench_json(folder, servers={"spec": {**facts, **fields}}))
        assert run.spec.off_path == path, fields
        assert frame(base, [run], run.levels, "x").draft.extend_at_depth0 is extend, fields
        assert off_path_note([run], base, None) is None
        flipped = "sglang" if path == "specctl" else "specctl"
        assert frame(base, [run], run.levels, "x", flipped).draft.extend_at_depth0 is not extend
    unrecorded = load_bench(bench_json(tmp_path, servers={"spec": facts}))
    assert unrecorded.spec.off_path is None
    assert frame(base, [unrecorded], unrecorded.levels, "x").draft.extend_at_depth0
    note = off_path_note([unrecorded], base, None)
    assert note is not None and "--off-path" in note
    assert off_path_note([unrecorded], base, "specctl") is None
    with pytest.raises(FitError, match="off path 'fast' is not one of sglang, specctl"):
        frame(base, [unrecorded], unrecorded.levels, "x", "fast")
    for fields, where in (({"off_path": {"path": "fast", "features": []}}, "off_path"),
                          ({"off_path": "specctl"}, "off_path"),
                          ({"off_mode": "fast"}, "off_mode")):
        bad = bench_json(tmp_path, servers={"spec": {**facts, **fields}})
        with pytest.raises(BenchFileError, match=rf"servers\.spec\.{where}: must be"):
            load_bench(bad)


def test_the_draft_prefill_skip_the_bench_recorded_goes_into_the_profile(tmp_path: Path) -> None:
    """The plugin's draft prefill skip, as the bench recorded it, is the profile's
    `draft.prefill_at_depth0` (negated) on the plugin's off path: from the `off_path` a bench
    records now (its `skip-draft-prefill` piece), or from an older bench's `skip_draft_prefill`
    and `off_mode`; unrecorded, the base's. A bench of depth 0 alone then cannot fit
    `draft.prefill_ms`, which no level paid."""
    facts = {"max_running_requests": 48, "captured_depths": [0, 1, 3],
             "speculative_num_steps": 3}  # fmt: skip
    base = load_profile("h200-llama8b-eagle3")
    assert base.draft.prefill_at_depth0
    recorded: list[tuple[dict[str, object], bool, bool]] = [
        # today's benches: the path and its pieces
        ({"off_path": {"path": "specctl", "features": ["skip-draft-prefill", "skip-extend"]}},
         True, False),
        ({"off_path": {"path": "specctl", "features": ["skip-extend"]}}, False, True),
        ({"off_path": {"path": "sglang", "features": []}}, False, True),
        # older benches (checked in under benchmarks/results/): the switch and the mode
        ({"skip_draft_prefill": True, "off_mode": "skip-extend"}, True, False),
        ({"skip_draft_prefill": False, "off_mode": "skip-extend"}, False, True),
        ({"skip_draft_prefill": True, "off_mode": "sglang"}, True, True),
    ]
    for i, (fields, skip, expected) in enumerate(recorded):
        folder = tmp_path / str(i)
        folder.mkdir()
        run = load_bench(bench_json(folder, servers={"spec": {**facts, **fields}}))
        assert run.spec.skip_draft_prefill is skip, fields
        assert frame(base, [run], run.levels, "x").draft.prefill_at_depth0 is expected, fields
    unrecorded = load_bench(bench_json(tmp_path, servers={"spec": facts}))
    assert frame(base, [unrecorded], unrecorded.levels, "x").draft.prefill_at_depth0
    depth0 = [replace(lv, depth=0) if lv.depth is not None else lv
              for lv in replayed((64,))[0].levels]
    keys, kept = active_keys(depth0, extend_at_depth0=False, prefill_at_depth0=False)
    assert "skipped the draft's prefill" in kept["draft.prefill_ms"]
    assert "draft.prefill_skipped_ms" in keys  # what depth 0's admissions still pay
    keys, kept = active_keys(depth0, extend_at_depth0=False, prefill_at_depth0=True)
    assert "draft.prefill_ms" not in kept
    assert "draft.prefill_skipped_ms" not in keys and "skips" in kept["draft.prefill_skipped_ms"]


def run_cli(*args: str) -> tuple[int, str]:
    import controller.cli.sim_fit  # noqa: F401  (registers `sim fit`)

    result = CliRunner().invoke(app, ["sim", "fit", *args])
    return result.exit_code, result.output


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        ("missing", "no such file (give the bench.json `specctl bench` wrote)"),
        ("not-json", "not JSON (line 1: Expecting value)"),
        ("old", "format: no 'format'"),
        ("all-unfit", "no level can be fitted (d1 c=2: no finished request)"),
    ],
)
def test_cli_errors_are_one_line_and_exit_2(tmp_path: Path, setup: str, expected: str) -> None:
    path = tmp_path / "bench.json"
    if setup == "not-json":
        path.write_text("nope")
    elif setup == "old":
        bench_json(tmp_path, format=None)
    elif setup == "all-unfit":
        level = json.loads(bench_json(tmp_path).read_text())["results"][0]
        bench_json(tmp_path, results=[{**level, "requests": 0}])
    code, output = run_cli(str(path), "--out", str(tmp_path / "p.yaml"))
    assert code == 2
    lines = output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], output
    assert not (tmp_path / "p.yaml").exists()


def test_a_spread_of_output_lengths_is_replayed_as_one(tmp_path: Path) -> None:
    """A bench whose outputs spread evenly (shortest 32, longest 96, mean 64) replays them
    drawn from that range; a skewed spread, or none, keeps every request at the mean."""
    from sims.fit.framing import output_range, shape_of

    level = json.loads(bench_json(tmp_path).read_text())["results"][0]
    even = {**level, "output_tokens_min": 32, "output_tokens_max": 96}
    skewed = {**level, "output_tokens_min": 4, "output_tokens_max": 900}
    run = load_bench(bench_json(tmp_path, results=[level, even, skewed]))
    plain, spread, skew = run.levels
    assert spread.output_tokens_min == 32 and spread.output_tokens_max == 96
    assert output_range(plain) is None and output_range(skew) is None
    shape = shape_of(spread, None)
    assert shape.output_range == (32, 96) and shape.output_tokens == 64

    truth = load_profile(TRUTH)
    engine = Engine(truth, Workload.closed(8, prompt_tokens=100, output_tokens=(32, 96)), seed=0)
    engine.request_log = []
    engine.run_until(20.0)
    outputs = [out for *_, out in engine.request_log]
    assert min(outputs) >= 32 and max(outputs) <= 96 and len(set(outputs)) > 10
    assert abs(np.mean(outputs) - 64) < 6
    # Requests that do not end together: the finishes of the first wave spread out.
    ends = sorted(end for _, _, _, end, _ in engine.request_log)[:8]
    fixed = Engine(truth, Workload.closed(8, prompt_tokens=100, output_tokens=64), seed=0)
    fixed.request_log = []
    fixed.run_until(20.0)
    fixed_ends = sorted(end for _, _, _, end, _ in fixed.request_log)[:8]
    assert ends[-1] - ends[0] > 2 * (fixed_ends[-1] - fixed_ends[0])
    assert replay(truth, shape, phase="chat").completed > 0


def test_cli_checks_out_and_base_before_fitting(tmp_path: Path) -> None:
    path = bench_json(tmp_path)
    code, output = run_cli(str(path), "--out", str(tmp_path / "no" / "p.yaml"))
    assert code == 2 and "does not exist; create it first" in output
    code, output = run_cli(str(path), "--out", str(tmp_path / "p.yaml"), "--base", "nope")
    assert code == 2 and "--base: unknown profile 'nope'" in output


def test_the_reader_expects_what_the_bench_writes() -> None:
    from controller.bench import report, sweep
    from sims.fit import bench_file

    assert bench_file.BENCH_FORMAT == report.BENCH_FORMAT
    assert bench_file.NO_SPEC == sweep.NO_SPEC


def test_host_floor_start_and_the_trend_reason() -> None:
    """The host floor's start comes from a level that accepts nothing and ran slower per token
    than its step; a level slower per iteration than the same series at twice the requests is
    named as against the model's trend."""
    truth = load_profile(TRUTH)
    run = replayed((160,), concurrency=(1, 8))[0]
    plain8 = next(lv for lv in run.levels if lv.label == "no-spec c=8")
    host = "scheduler.host_us_per_req"
    assert host_floor_guesses(truth, run.levels)[host] == 0.0  # the truth has no floor
    assert plain8.tpot_p50_ms is not None
    slow = replace(plain8, tpot_p50_ms=3 * plain8.tpot_p50_ms)
    assert host_floor_guesses(truth, [slow])[host] == pytest.approx(1000 * slow.tpot_p50_ms / 8)
    d1 = [lv for lv in run.levels if lv.series == "d1"]
    one, eight = sorted(d1, key=lambda lv: lv.concurrency)
    assert slower_than_more_streams(one, d1) is None
    assert eight.server_itl_ms is not None
    stalled = replace(one, server_itl_ms=eight.server_itl_ms)
    reason = slower_than_more_streams(stalled, [stalled, eight])
    assert reason is not None and "about as long as at 8 streams" in reason


def test_a_speculative_servers_own_host_work_is_told_from_the_plain_servers() -> None:
    """A server whose speculative iterations carry more host work per request than its plain
    server's (as SGLang's spec-v2 preparation does, at depth 0 too): both servers host-bound
    at 8 streams, the plain one at 4.5 ms a request, the speculative one 1.5 ms more. The fit,
    started from the same server without host work, recovers both servers' host work an
    iteration within 5% and the extra within 10%; without the plain server the extra is kept
    and said why."""
    truth = with_values(load_profile(TRUTH), {
        "scheduler.host_us_per_req": 4500.0, "scheduler.spec_host_us_per_req": 1500.0})  # fmt: skip
    plain8 = truth.decode_step_ms(None, 8)
    d0_8 = truth.decode_step_ms(0, 8)
    assert float(plain8) == pytest.approx(36.0 + truth.scheduler.untimed_ms)
    assert float(d0_8) == pytest.approx(48.0 + truth.scheduler.untimed_ms)
    runs = [replayed_bench(truth, depths=(0, 1, 3), concurrency=(1, 8), prompt_tokens=160,
                           output_tokens=64, seconds=8.0, phase="chat", name="p160")]  # fmt: skip
    tpot = {lv.label: lv.tpot_p50_ms for lv in runs[0].levels}  # the engine runs the same
    assert tpot["no-spec c=8"] == pytest.approx(float(plain8), rel=0.03)
    assert tpot["d0 c=8"] == pytest.approx(float(d0_8), rel=0.03)
    start = with_values(truth, {
        "scheduler.host_us_per_req": 0.0, "scheduler.spec_host_us_per_req": 0.0})  # fmt: skip
    result = fit_profile(runs, start, "f")
    assert not result.outliers  # one floor for both would have to set a level aside
    fitted = result.profile
    # Per request and per token are one term where every request emits a token an
    # iteration (the plain server, depth 0): the host work of an iteration is what is pinned.
    for spec in (False, True):
        got, want = (float(p.host_ms(8, 8, spec)) for p in (fitted, truth))
        assert got == pytest.approx(want, rel=0.05), spec
    assert fitted.scheduler.spec_host_us_per_req == pytest.approx(1500.0, rel=0.1)
    spec_only = [lv for lv in runs[0].levels if lv.depth is not None]
    keys, kept = active_keys(spec_only, extend_at_depth0=True)
    assert "scheduler.spec_host_us_per_req" not in keys
    assert "--no-spec-url" in kept["scheduler.spec_host_us_per_req"]


def test_depth_0_against_the_plain_server_is_set_beside_the_replays() -> None:
    """Per level where a bench measured depth 0 and the plain server: the tok/s ratio measured
    and replayed (what speculation switched off costs there), in the lines and the JSON.
    Positive depths and outliers stay out; a level without its plain twin gives none."""
    run = replayed((160,), concurrency=(1, 4), depths=(0, 3))[0]

    def replayed_as(lv: Level) -> Row:  # the replay: depth 0 10% slower at four streams
        slow = lv.depth == 0 and lv.concurrency == 4
        return Row(level=lv, tok_per_s=lv.tok_per_s * (0.9 if slow else 1.0),
                   tpot_ms=lv.tpot_p50_ms, ttft_ms=None)  # fmt: skip

    rows = [replayed_as(lv) for lv in run.levels]
    measured = {(lv.series, lv.concurrency): lv.tok_per_s for lv in run.levels}
    costs = off_costs(rows)
    assert [(c.concurrency, c.source) for c in costs] == [(1, "p160"), (4, "p160")]
    for c in costs:
        assert c.bench == pytest.approx(measured[("d0", c.concurrency)]
                                        / measured[("no-spec", c.concurrency)])
    assert costs[0].replay == pytest.approx(costs[0].bench)
    assert costs[1].replay == pytest.approx(0.9 * costs[1].bench)
    no_twin = [r for r in rows if not (r.level.depth is None and r.level.concurrency == 4)]
    assert [c.concurrency for c in off_costs(no_twin)] == [1]
    marked = [replace(r, outlier=r.level.depth == 0 and r.level.concurrency == 1) for r in rows]
    assert [c.concurrency for c in off_costs(marked)] == [4]
    truth = load_profile(TRUTH)
    report = Report(framed_only([run], truth), truth, rows, "", fitted=False)
    lines = " ".join(str(x) for x in render(report)[1:])
    assert f"c=4 {costs[1].bench:.3f}/{costs[1].replay:.3f}" in lines
    assert [c["concurrency"] for c in report.to_json()["depth0_vs_plain"]] == [1, 4]


def test_a_replay_frames_the_profile_by_the_bench_and_fits_nothing() -> None:
    """`framed_only`: the profile's costs as written, its limits and acceptance the bench's;
    the report says it was not fitted."""
    run = replayed((160,), concurrency=(1, 4), depths=(0, 3))[0]
    base = load_profile("h200-llama8b-eagle3")
    result = framed_only([run], base)
    assert result.keys == () and result.evaluations == 0 and not result.pooled
    assert result.profile.target == base.target and result.profile.draft.step_us_per_req \
        == base.draft.step_us_per_req
    assert {0, 3} <= set(result.profile.captured_depths)  # what the bench served
    assert result.accept_lengths[3] == pytest.approx(
        load_profile(TRUTH).acceptance.expected_length("chat", 3))
    rows = replay_rows(result.profile, result.levels, {run.path: run.request_limit})
    report = Report(result, base, rows, "", fitted=False)
    table, *lines = render(report)
    assert "the profile as given" in str(table.title)
    assert any(f"error over the {len(result.levels)} levels" in str(line) for line in lines)
    assert report.to_json()["fitted"] is False
    with pytest.raises(FitError, match="no level can be replayed"):
        framed_only([replace(run, levels=[])], base)


def test_depth_0_as_a_plain_decode_fits_its_own_cost_and_keeps_the_verifys(
    tmp_path: Path,
) -> None:
    """The plugin's DECODE runners, as the bench recorded them, say whether depth 0 ran as a
    plain decode (`draft.plain_decode_at_depth0`); a bench that recorded none ran it through
    the verify. On such a bench depth 0 against the plain server is the path's own cost: the
    fit recovers it (a made-up server whose plain decode costs 0.6 ms an iteration beyond a
    plain server's, its verify 2 ms) and keeps verify mode's cost, which only drafting depths
    show beside the draft extend, at the start's value."""
    facts = {"max_running_requests": 48, "captured_depths": [0, 1, 3],
             "speculative_num_steps": 3,
             "off_path": {"path": "specctl", "features": ["plain-decode", "skip-extend"]}}
    base = load_profile("h200-sglang-llama8b-seeded")
    assert base.draft.plain_decode_at_depth0  # the built-in: what the plugin runs on 0.5.17
    for runners, expected in ((1, True), (0, False), (None, False)):
        folder = tmp_path / str(runners)
        folder.mkdir()
        recorded = {} if runners is None else {"plain_decode_runners": runners}
        run = load_bench(bench_json(folder, servers={"spec": {**facts, **recorded}}))
        assert run.spec.plain_decode is (None if runners is None else expected)
        assert frame(base, [run], run.levels, "x").draft.plain_decode_at_depth0 is expected
    bad = bench_json(tmp_path, servers={"spec": {**facts, "plain_decode_runners": -1}})
    with pytest.raises(BenchFileError, match=r"servers\.spec\.plain_decode_runners"):
        load_bench(bad)
    both = [load_bench(tmp_path / str(r) / "bench.json") for r in (1, 0)]
    with pytest.raises(FitError, match=r"two ways: as a plain decode in .*1/bench\.json"):
        frame(base, both, [*both[0].levels, *both[1].levels], "x")

    truth = load_profile(TRUTH)
    truth = truth.model_copy(update={"draft": truth.draft.model_copy(update={
        "extend_at_depth0": False, "plain_decode_at_depth0": True,
        "spec_sched_ms": 2.0, "plain_decode_sched_ms": 0.6})})  # fmt: skip
    d0, plain = (float(truth.iteration_ms(d, 8, 200)) for d in (0, None))
    assert d0 - plain == pytest.approx(0.6)
    [run] = [replayed_bench(truth, depths=(0, 1, 3), concurrency=(1, 8), prompt_tokens=160,
                            output_tokens=64, seconds=8.0, phase="chat", name="p160")]  # fmt: skip
    run = replace(run, spec=replace(run.spec, plain_decode=True))
    start = with_values(truth, {"draft.plain_decode_sched_ms": 0.0})
    result = fit_profile([run], start, "f")
    fitted = result.profile
    assert fitted.draft.plain_decode_at_depth0
    assert fitted.draft.plain_decode_sched_ms == pytest.approx(0.6, abs=0.15)
    assert "draft.spec_sched_ms" not in result.keys
    assert "only at drafting depths" in result.kept["draft.spec_sched_ms"]
    assert fitted.draft.spec_sched_ms == 2.0
    keys, kept = active_keys(run.levels, extend_at_depth0=False, plain_decode_at_depth0=False)
    assert "draft.spec_sched_ms" in keys and "draft.plain_decode_sched_ms" not in keys
    assert "through the verify" in kept["draft.plain_decode_sched_ms"]
