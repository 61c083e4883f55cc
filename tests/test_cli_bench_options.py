"""`specctl bench`'s open-loop, warm-up, SLO and dataset options, end to end over loopback
against the served simulator, and what the report says about flagged levels and a plain
server that wins."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from controller.bench.loadgen import OpenLoop, StopRule
from controller.bench.prompts import synthetic_prompts
from controller.bench.server_client import ServerState
from controller.bench.sweep import LevelObserver, LevelResult, SweepOutcome, SweepPlan, run_sweep
from controller.cli import load_commands
from controller.cli.bench_run import report

app = load_commands()
KEY = "options-key"


def flat(text: str) -> str:
    return " ".join(text.split())


def sharegpt(path: Path) -> Path:
    """Three conversations (one with no reply, skipped) as the ShareGPT dump is distributed."""
    convs = [
        [("human", "Write a short poem about the sea."), ("gpt", "w" * 60)],
        [("human", "Explain speculative decoding."), ("gpt", "x" * 60), ("human", "More?")],
        [("gpt", "a reply with no question before it")],
    ]
    rows = [{"conversations": [{"from": f, "value": v} for f, v in c]} for c in convs]
    path.write_text(json.dumps(rows))
    return path


@pytest.mark.parametrize("sim_server", [{"admin_key": KEY, "speedup": 100}], indirect=True)
def test_open_loop_sweep_with_slo_warm_up_and_sharegpt(sim_server, tmp_path: Path) -> None:
    out = tmp_path / "b"
    result = CliRunner().invoke(
        app,
        ["bench", "--url", sim_server.base_url, "--admin-key", KEY, "--depths", "1",
         "--request-rate", "8,2", "--burstiness", "0.5", "--max-concurrency", "4",
         "--duration-per-level", "1.5", "--warmup-per-level", "0.3",
         "--goodput", "ttft:500", "--goodput", "tpot:50",
         "--dataset", str(sharegpt(tmp_path / "sg.json")), "--out", str(out)],
        env={"COLUMNS": "200"},
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    text = flat(result.output)
    assert "request rate [2, 8] req/s (burstiness 0.5, at most 4 in flight)" in text
    assert "1.5 s per level after a 0.3 s warm-up" in text
    assert "goodput SLO ttft:500 tpot:50 ms" in text
    assert "2 conversations, 1 skipped" in text and "/ 15 output tokens on average" in text
    for header in ("rate/s", "max conc", "req/s", "TTFT p50/p99 ms", "ITL p50/p99 ms",
                   "goodput req/s"):  # fmt: skip
        assert header in result.output
    doc = json.loads((out / "bench.json").read_text())
    assert doc["mode"] == "rate" and doc["request_rates"] == [2.0, 8.0]
    assert doc["burstiness"] == 0.5 and doc["max_concurrency"] == 4
    assert doc["warmup_s"] == 0.3 and doc["slo_ms"] == {"ttft": 500.0, "tpot": 50.0}
    assert [r["request_rate"] for r in doc["results"]] == [2.0, 8.0]
    for r in doc["results"]:
        # the warm-up as asked; its end slips on a loaded machine (0.81 s seen), not below
        assert 1 <= r["concurrency"] <= 4 and 0.25 <= r["warmup_s"] <= 1.5
        assert r["requests"] > 0 and r["ttft_p99_ms"] >= r["ttft_p50_ms"] > 0
        assert r["itl_p99_ms"] >= r["itl_p50_ms"] > 0 and r["e2e_p50_ms"] > 0
        assert 0 <= r["goodput_req_per_s"] <= r["request_per_s"] + 1e-9
        assert 0 <= r["slo_attainment"] <= 1
    # More arrivals per second, more completions per second.
    assert doc["results"][1]["request_per_s"] > doc["results"][0]["request_per_s"]


class Started(LevelObserver):
    def __init__(self) -> None:
        self.started: list[tuple[str, object]] = []

    def level_started(self, series, shape, live) -> None:  # type: ignore[no-untyped-def]
        self.started.append((series, shape))


@pytest.mark.parametrize("sim_server", [{"admin_key": KEY, "speedup": 100}], indirect=True)
def test_the_progress_hook_hears_about_open_loop_levels_too(sim_server) -> None:
    plan = SweepPlan(
        url=sim_server.base_url, depths=(1,), concurrencies=(), request_rates=(4.0,),
        stop=StopRule(duration_s=0.4, warmup_s=0), prompts=synthetic_prompts(64, 16, 8),
        prompt_source="synthetic", admin_key=KEY, max_concurrency=2,
    )  # fmt: skip
    seen = Started()
    run_sweep(plan, seen)
    assert seen.started == [("d1", OpenLoop(4.0, 1.0, 2))]


def level(series: str, depth: int | None, conc: int, tok_s: float, **kw) -> LevelResult:  # type: ignore[no-untyped-def]
    fields = dict(
        series=series, depth=depth, concurrency=conc, requests=10, errors=0, elapsed_s=4.0,
        output_tok_per_s=tok_s, ttft_p50_ms=10.0, ttft_p90_ms=20.0, tpot_p50_ms=5.0,
        tpot_p90_ms=6.0, mean_batch=float(min(conc, 48)), accept_length=1.6,
        client_cpu_share=0.1,
    )  # fmt: skip
    return LevelResult(**{**fields, **kw})


def outcome(results: list[LevelResult]) -> SweepOutcome:
    plan = SweepPlan(
        url="http://127.0.0.1:9", depths=(1,), concurrencies=(16, 64),
        stop=StopRule(duration_s=4.0), prompts=synthetic_prompts(4, 8, 128), prompt_source="s",
        no_spec_url="http://127.0.0.1:8",
    )  # fmt: skip
    before = ServerState(None, 0, (0, 1), "none", None, 1)
    return SweepOutcome(plan=plan, before=before, results=results)


def printed(o: SweepOutcome, tmp_path: Path) -> str:
    out = io.StringIO()
    report(o, tmp_path / "out", Console(file=out, width=80))
    return flat(out.getvalue())


def test_the_report_says_when_a_plain_server_wins_everywhere(tmp_path: Path) -> None:
    text = printed(outcome([
        level("d1", 1, 16, 1000.0), level("d1", 1, 64, 1600.0),
        level("no-spec", None, 16, 1100.0, mean_batch=None),
        level("no-spec", None, 64, 2000.0, mean_batch=None),
    ]), tmp_path)  # fmt: skip
    assert (
        "the server without speculation is faster than every depth at every level measured, "
        "by +10% (c=16) to +25% (c=64) tok/s over the best depth: serve without speculation"
        in text
    )
    assert (tmp_path / "out" / "bench.json").is_file()


def test_the_report_leaves_out_too_short_levels_and_says_why(tmp_path: Path) -> None:
    text = printed(outcome([
        level("d1", 1, 16, 1000.0),
        level("d1", 1, 64, 800.0, requests=0, too_short=True, ttft_p50_ms=None),
    ]), tmp_path)  # fmt: skip
    assert "too short: no request that started in the window finished in it (d1 c=64)" in text
    assert "use a longer --duration-per-level (a request took about 10 s" in text
    assert "left out" in text and "too short" in text.split("left out")[1]
    assert "recommended table (batch size -> depth): 1+: d1" in text
