"""What bench makes of its levels: flagged levels left out, a plain server that wins, latency
percentiles, goodput under an SLO, ShareGPT datasets, and bench.json staying compatible."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from controller.bench.latency import Slo, SloError, goodput, latencies, parse_slo, percentile_ms
from controller.bench.loadgen import RequestResult, StopRule
from controller.bench.prompts import DatasetError, read_dataset, synthetic_prompts
from controller.bench.report import (
    best_depths,
    crossovers,
    outcome_json,
    plain_server_wins,
    plot,
    recommend_table,
    recommendation_text,
    too_short_hint,
)
from controller.bench.server_client import ServerState
from controller.bench.sweep import LevelResult, SweepOutcome, SweepPlan, series_name


def level(  # type: ignore[no-untyped-def]
    depth: int | None, conc: int, tok_s: float, batch: float | None = None, **kw
) -> LevelResult:
    return LevelResult(
        series=series_name(depth), depth=depth, concurrency=conc, requests=10, errors=0,
        elapsed_s=1.0, output_tok_per_s=tok_s, ttft_p50_ms=1.0, ttft_p90_ms=2.0,
        tpot_p50_ms=1.0, tpot_p90_ms=2.0, mean_batch=batch, accept_length=1.5,
        client_cpu_share=0.1, **kw,
    )  # fmt: skip


def outcome(results: list[LevelResult], **plan_kw) -> SweepOutcome:  # type: ignore[no-untyped-def]
    """A sweep of `results`; its plan asked for the depths they hold unless `depths` says."""
    plan_kw.setdefault("depths", tuple(sorted({r.depth for r in results if r.depth is not None})))
    plan = SweepPlan(
        url="http://127.0.0.1:1", concurrencies=(1, 4, 16),
        stop=StopRule(duration_s=10), prompts=synthetic_prompts(1, 8, 8), prompt_source="t",
        **plan_kw,
    )  # fmt: skip
    before = ServerState(None, 0, (0, 1, 2, 3), "none", None, 1)
    return SweepOutcome(plan=plan, before=before, results=results)


def test_a_level_with_no_finished_request_is_left_out_of_the_recommendation() -> None:
    # At c=64, d0 "wins" on a partial tok/s; no request finished there, so it must not count,
    # and without it c=64 cannot compare the depths at all.
    short = level(0, 64, 900, 48.0, too_short=True)
    results = [level(3, 1, 100, 1.0), level(0, 1, 60, 1.0), level(3, 64, 500, 48.0), short]
    assert best_depths(results) == {1: 3}
    table = recommend_table(results, captured_depths=[0, 3])
    assert table is not None and table.describe() == "1+: d3"
    hint = too_short_hint(results, output_tokens=256)
    assert hint is not None and "d0 c=64" in hint and "--duration-per-level" in hint
    # 900 tok/s over 64 streams is ~14 tok/s each: a 256-token request needs ~18 s.
    assert "about 18 s" in hint


def test_only_flagged_levels_give_no_table_at_all() -> None:
    flagged = [level(3, 8, 500, 8.0, too_short=True), level(1, 8, 400, 13.0, foreign_traffic=True)]
    assert best_depths(flagged) == {} and recommend_table(flagged) is None
    assert crossovers(flagged) == []


def test_a_plain_server_that_wins_everywhere_is_said_with_its_margin() -> None:
    spec = [
        level(0, 1, 100, 1.0), level(1, 1, 90, 1.0),
        level(0, 16, 800, 16.0), level(1, 16, 700, 16.0),
    ]  # fmt: skip
    nospec = [level(None, 1, 110), level(None, 16, 1000)]
    wins = plain_server_wins(spec + nospec)
    assert wins is not None
    assert wins.gains == pytest.approx({1: 0.10, 16: 0.25})
    text = recommendation_text(outcome(spec + nospec))
    assert text is not None
    assert "server without speculation is faster than every depth at every level" in text
    assert "+10% (c=1) to +25% (c=16)" in text and "1+: off" in text
    # Where speculation still wins somewhere, it is the table that is recommended.
    mixed = [*spec, level(None, 1, 80), level(None, 16, 1000)]
    assert plain_server_wins(mixed) is None
    assert recommendation_text(outcome(mixed)) == "recommended table (batch size -> depth): 1+: off"


def test_bench_json_keeps_its_keys_and_adds_the_new_ones() -> None:
    spec = [level(3, 1, 100, 1.0), level(3, 4, 300, 4.0, too_short=True)]
    data = outcome_json(outcome(spec))
    for key in (
        "url", "no_spec_url", "depths", "concurrencies", "stop", "prompts", "table_before",
        "table_before_source", "restored", "interrupted", "results", "best_depth_by_concurrency",
        "crossovers", "recommended_table", "recommended_table_text",
    ):  # fmt: skip
        assert key in data, key
    assert data["best_depth_by_concurrency"] == {"1": 3}
    assert data["flagged_levels"] == [{"series": "d3", "level": 4, "flags": ["too short"]}]
    assert data["mode"] == "closed" and data["warmup_s"] == 1.0
    old_fields = {"series", "concurrency", "output_tok_per_s", "ttft_p90_ms", "foreign_traffic"}
    assert old_fields <= set(data["results"][0])
    json.dumps(data)  # serialisable as is


def test_the_figure_marks_flagged_levels(tmp_path: Path) -> None:
    results = [level(3, 1, 100, 1.0), level(3, 4, 300, 4.0, too_short=True),
               level(3, 16, 500, 40.0, foreign_traffic=True)]  # fmt: skip
    path = tmp_path / "bench.svg"
    plot(outcome(results), path)
    svg = path.read_text()
    # matplotlib writes each text as a comment before its glyphs.
    assert "<!-- too short -->" in svg and "<!-- other traffic -->" in svg
    assert "<!-- flagged (left out) -->" in svg


def result(ttft: float, tokens: int, duration: float, complete: bool = True) -> RequestResult:
    gaps = tuple([(duration - ttft) / (tokens - 1)] * (tokens - 1))
    return RequestResult(
        start_s=0.0, end_s=duration, ttft_s=ttft, last_token_s=duration, output_tokens=tokens,
        complete=complete, chunk_gaps_s=gaps,
    )  # fmt: skip


def test_percentiles_include_p99_and_stay_inside_the_data() -> None:
    values = [i / 1000 for i in range(1, 101)]  # 1..100 ms
    assert percentile_ms(values, 50) == pytest.approx(50.5)
    assert percentile_ms(values, 99) == pytest.approx(99.01)
    assert percentile_ms([0.004], 99) == pytest.approx(4.0) and percentile_ms([], 50) is None
    lat = latencies([result(0.1, 11, 1.1), result(0.2, 11, 2.2)])
    assert lat.tpot[0] == pytest.approx(150.0)  # (100 + 200) / 2 ms
    assert lat.itl[2] == pytest.approx(200.0) and lat.e2e[0] == pytest.approx(1650.0)


def test_goodput_counts_requests_that_meet_every_slo() -> None:
    slo = parse_slo(["ttft:150,tpot:120"])
    assert slo == Slo(ttft_ms=150, tpot_ms=120)
    done = [result(0.1, 11, 1.1), result(0.2, 11, 1.2), result(0.1, 11, 3.1)]
    failed = dataclasses.replace(done[0], complete=False, error="HTTP 500")
    # Good: the first only (the second misses TTFT, the third TPOT 300 ms); 4 finished.
    g = goodput(slo, [*done, failed], window_s=2.0)
    assert g.req_per_s == pytest.approx(0.5) and g.attainment == pytest.approx(0.25)
    assert parse_slo(["ttft:500", "e2el:2000"]).describe() == "ttft:500 e2el:2000 ms"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (["ttft"], "expected KEY:MILLISECONDS with KEY one of ttft, tpot, e2el"),
        (["latency:5"], "expected KEY:MILLISECONDS"),
        (["tpot:fast"], "'fast' is not a number of milliseconds"),
        (["tpot:0"], "the bound must be > 0 ms"),
        (["tpot:5,tpot:6"], "tpot is given twice"),
        ([""], "no SLO given"),
    ],
)
def test_slo_errors_name_the_part(text: list[str], message: str) -> None:
    with pytest.raises(SloError, match=message):
        parse_slo(text)


SHAREGPT = [
    {"id": "a", "conversations": [
        {"from": "human", "value": "What is speculative decoding?"},
        {"from": "gpt", "value": "x" * 400},
        {"from": "human", "value": "More?"},
    ]},
    {"id": "b", "conversations": [{"from": "gpt", "value": "no question first"}]},
    {"id": "c", "conversations": [
        {"from": "system", "value": "be brief"},
        {"from": "user", "value": "Hi"},
        {"from": "assistant", "value": "Hello there, friend"},
    ]},
]  # fmt: skip


def test_sharegpt_json_array_and_jsonl_give_prompts_and_reply_lengths(tmp_path: Path) -> None:
    array = tmp_path / "sharegpt.json"
    array.write_text(json.dumps(SHAREGPT))
    lines = tmp_path / "sharegpt.jsonl"
    lines.write_text("\n".join(json.dumps(r) for r in SHAREGPT) + "\n")
    for path in (array, lines):
        data = read_dataset(path, default_output_tokens=256)
        assert [(p.text, p.output_tokens) for p in data.prompts] == [
            ("What is speculative decoding?", 100),  # 400 characters ~ 100 tokens
            ("Hi", 5),
        ]
        assert data.skipped == 1 and data.conversations
        assert "2 conversations, 1 skipped" in data.describe()
    fixed = read_dataset(array, 256, fixed_output_tokens=64)
    assert {p.output_tokens for p in fixed.prompts} == {64}


def test_dataset_errors_name_the_record_and_the_field(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    path.write_text(json.dumps([{"conversations": "hi"}]))
    with pytest.raises(DatasetError, match=r"d.json: record 0: 'conversations' must be a list"):
        read_dataset(path, 16)
    path.write_text(json.dumps([{"conversations": [{"from": "human"}]}]))
    with pytest.raises(DatasetError, match=r"conversations\[0\] must be an object with 'from'"):
        read_dataset(path, 16)
    path.write_text(json.dumps([{"conversations": [{"from": "gpt", "value": "x"}]}]))
    with pytest.raises(DatasetError, match="1 conversations had no human turn with a reply"):
        read_dataset(path, 16)
    path.write_text('[{"prompt": "x"},')
    with pytest.raises(DatasetError, match=r"d.json:1: not valid JSON"):
        read_dataset(path, 16)


def test_chunked_streams_are_named_beside_the_itl_columns() -> None:
    """A server that streams every 4th token makes ITL a gap between 4-token chunks: the hint
    names which server and how many; one chunk per token needs no hint."""
    from controller.bench.report import stream_interval_hint
    from controller.bench.server_facts import server_facts

    spec = server_facts({"stream_interval": 4, "internal_states": [{}]})
    plain = server_facts({"stream_interval": 1})
    assert spec["stream_interval"] == 4 and spec["scheduler_recv_interval"] is None
    hint = stream_interval_hint({"spec": spec, "no_spec": plain})
    assert hint is not None and "the speculative server every 4" in hint
    assert "plain server" not in hint
    assert stream_interval_hint({"spec": plain, "no_spec": server_facts({})}) is None


def test_the_facts_say_whether_depth_0_ran_as_a_plain_decode() -> None:
    """Read from the /server_info bodies of the H200 run that ran depth 0 both ways: one
    DECODE runner on the plain decode path, none without; a server without the plugin (or
    an older plugin) says nothing."""
    from controller.bench.server_facts import server_facts

    run = Path(__file__).parents[1] / "benchmarks/results/gpu/h200-sglang-0.5.17-seeded-8b-run20"
    on = server_facts(json.loads((run / "server_info_spec_series.json").read_text()))
    off = server_facts(json.loads((run / "server_info_spec_off.json").read_text()))
    plain = server_facts(json.loads((run / "server_info_plain.json").read_text()))
    assert (on["plain_decode_runners"], off["plain_decode_runners"]) == (1, 0)
    assert plain["plain_decode_runners"] is None
    assert server_facts({"internal_states": [{"specctl": {"plain_decode": {"runners": True}}}]})[
        "plain_decode_runners"] is None


def test_the_facts_say_what_depth_0_ran() -> None:
    """The plugin's `off_path` (the path and its pieces) is kept as it reports it; a report
    of another shape, an older plugin's (whose keys were others) or none is null, and the
    keys the plugin no longer reports are not recorded."""
    from controller.bench.server_facts import server_facts

    def facts(specctl: dict[str, object]) -> dict[str, object]:
        return server_facts({"internal_states": [{"specctl": specctl}]})

    ours = facts({"off_path": {"path": "specctl", "features": ["skip-extend", "plain-decode"]}})
    assert ours["off_path"] == {"path": "specctl", "features": ["plain-decode", "skip-extend"]}
    assert facts({"off_path": {"path": "sglang", "features": []}})["off_path"] == {
        "path": "sglang", "features": []}
    for bad in ({"path": None, "features": []}, {"path": "specctl"}, "specctl",
                {"path": "specctl", "features": [1]}):
        assert facts({"off_path": bad})["off_path"] is None
    older = facts({"off_mode": "skip-extend", "lean_host": True, "skip_draft_prefill": True})
    assert older["off_path"] is None
    for gone in ("off_mode", "lean_host", "lean_relay", "fence_at_replay", "skip_draft_prefill",
                 "verify_schedule_backends"):
        assert gone not in older
    assert server_facts({})["off_path"] is None


def test_prompts_that_came_round_within_the_kv_pool_are_flagged() -> None:
    """512 prompts of about 160 tokens with their outputs fit a 266,246-token pool: once a
    server took more than 512 requests, its cache could hold repeats whole. The hint names the
    servers past the count; a pool too small to hold them all, or no pool reported, says
    nothing."""
    from controller.bench.report import prompts_came_round, repeat_hint

    def hint(results, prompts, pools):  # type: ignore[no-untyped-def]
        return repeat_hint(prompts_came_round(results, prompts, pools))

    def lv(depth: int | None, requests: int) -> LevelResult:
        return dataclasses.replace(level(depth, 128, 1000.0, prompt_tokens=32.0,
                                         output_tokens=128.0), requests=requests)  # fmt: skip

    results = [lv(0, 300), lv(0, 400), lv(None, 500)]
    pools = {"spec": {"max_total_num_tokens": 305_491},
             "no_spec": {"max_total_num_tokens": 266_246}}
    line = hint(results, 512, pools)
    assert line is not None
    assert ("512 prompts (about 81,920 tokens with their outputs, within a KV pool of "
            "266,246), 700 to the speculative server, so") in line
    more = hint([*results, lv(None, 100)], 512, pools)
    assert more is not None and "700 to the speculative server and 600 to the plain" in more
    assert hint(results, 4096, pools) is None  # 655k tokens: more than the pool holds
    assert hint(results, 1000, pools) is None  # nobody past 1,000 requests
    assert hint(results, 512, {"spec": {"max_total_num_tokens": None}}) is None
