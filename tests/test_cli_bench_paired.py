"""`specctl bench --paired` over loopback against two served simulators (`sim_server_factory`):
each load's levels back to back, on the same requests, for every depth and the plain server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from test_cli_bench import KEY, flat, push_before, state_of
from typer.testing import CliRunner

from controller.bench.sweep import SweepPlan
from controller.cli import app

# Every prompt asks for its own length, so a level's lengths tell which prompts it served.
LENGTHS = [20 + 7 * i for i in range(24)]


def dataset(tmp_path: Path) -> Path:
    path = tmp_path / "prompts.jsonl"
    lines = [json.dumps({"prompt": f"prompt {i} " * 8, "output_tokens": n})
             for i, n in enumerate(LENGTHS)]  # fmt: skip
    path.write_text("\n".join(lines) + "\n")
    return path


def paired_bench(sim_server_factory, tmp_path: Path, depths: str, requests: int,
                 *extra: str, concurrency: str = "1,3") -> tuple[Any, Any, Path]:  # fmt: skip
    """A paired bench (at 1 and 3 streams unless told) over two served simulators: (spec
    server, CLI result, output folder)."""
    spec = sim_server_factory(admin_key=KEY, speedup=50)
    nospec = sim_server_factory(speedup=50, speculative=False)
    push_before(spec.base_url)
    out = tmp_path / "bench"
    result = CliRunner().invoke(
        app,
        ["bench", "--url", spec.base_url, "--admin-key", KEY, "--depths", depths,
         "--concurrency", concurrency, "--no-spec-url", nospec.base_url, "--paired", *extra,
         "--requests-per-level", str(requests), "--warmup-per-level", "0", "--dataset",
         str(dataset(tmp_path)), "--out", str(out), "--client-bound-share", "100"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return spec, result, out


def test_paired_levels_run_back_to_back_on_the_same_requests(
    sim_server_factory, tmp_path: Path
) -> None:
    spec, result, out = paired_bench(sim_server_factory, tmp_path, "0,3", 5)
    assert "back to back on the same requests (paired)" in flat(result.output)
    report = json.loads((out / "bench.json").read_text())
    assert report["paired"] is True
    # 20 requests on the speculative server, 10 on the plain one: none of 24 prompts repeated
    assert report["prompt_count"] == 24 and report["prompts_came_round"] is False
    assert "prompts came round" not in flat(result.output)
    levels = report["results"]
    assert [(r["series"], r["concurrency"]) for r in levels] == [
        ("d0", 1), ("d3", 1), ("no-spec", 1), ("d0", 3), ("d3", 3), ("no-spec", 3),
    ]  # fmt: skip
    one, three = levels[:3], levels[3:]
    # One stream: the same five prompts in the same order on every series.
    assert {r["prompt_offset"] for r in one} == {0}
    assert {(r["output_tokens_min"], r["output_tokens_max"]) for r in one} == {(20, 48)}
    # The next load starts past every prompt the first one sent, on every series alike.
    assert len({r["prompt_offset"] for r in three}) == 1
    assert three[0]["prompt_offset"] >= 5
    # Each depth against the plain server, load by load, as the files have it.
    text = flat(result.output)
    plain = {r["concurrency"]: r for r in levels if r["series"] == "no-spec"}
    for depth in ("d0", "d3"):
        head = f"{depth} against the plain server, tok/s ratio by load: "
        line = text[text.index(head) + len(head):].split(" against ")[0].split(" crossovers")[0]
        mine = [r for r in levels if r["series"] == depth]
        ratios = [r["output_tok_per_s"] / plain[r["concurrency"]]["output_tok_per_s"]
                  for r in mine]  # fmt: skip
        assert [p.split(" (")[0] for p in line.split(", ")] == [
            f"c={r['concurrency']} {q:.3f}" for r, q in zip(mine, ratios, strict=True)
        ]
    # The forced depths ran where they were asked for, and the old table is back.
    assert levels[0]["accept_length"] == 1.0 and levels[1]["accept_length"] > 1.3
    assert state_of(spec.base_url)["table"] == report["table_before"]


def test_paired_without_a_plain_server_is_refused_before_anything_runs(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["bench", "--url", "http://127.0.0.1:9", "--paired", "--out", str(tmp_path / "b")]
    )
    assert result.exit_code == 2
    assert "--paired" in flat(result.output) and "give --no-spec-url" in flat(result.output)
    assert not (tmp_path / "b").exists()


def test_a_paired_plan_runs_each_load_across_every_series() -> None:
    plan = SweepPlan(
        url="http://a", depths=(0, 3), concurrencies=(1, 8), stop=None,  # type: ignore[arg-type]
        prompts=[], prompt_source="", no_spec_url="http://b", paired=True,
    )  # fmt: skip
    assert plan.levels() == [(0, plan.shapes()[0]), (3, plan.shapes()[0]),
                             (None, plan.shapes()[0]), (0, plan.shapes()[1]),
                             (3, plan.shapes()[1]), (None, plan.shapes()[1])]  # fmt: skip
    first = SweepPlan(
        url="http://a", depths=(0,), concurrencies=(1,), stop=None,  # type: ignore[arg-type]
        prompts=[], prompt_source="", no_spec_url="http://b", paired=True, plain_first=True,
    )  # fmt: skip
    assert first.levels() == [(None, first.shapes()[0]), (0, first.shapes()[0])]


def test_plain_first_runs_the_plain_server_first_at_every_load(
    sim_server_factory, tmp_path: Path
) -> None:
    _, result, out = paired_bench(sim_server_factory, tmp_path, "0", 4, "--plain-first")
    assert "(paired, the plain server first)" in flat(result.output)
    report = json.loads((out / "bench.json").read_text())
    assert report["paired_order"] == "plain-first"
    levels = report["results"]
    assert [(r["series"], r["concurrency"]) for r in levels] == [
        ("no-spec", 1), ("d0", 1), ("no-spec", 3), ("d0", 3)]
    # Still the same requests within a load, whichever server goes first.
    assert levels[0]["prompt_offset"] == levels[1]["prompt_offset"] == 0
    assert levels[2]["prompt_offset"] == levels[3]["prompt_offset"] >= 4
    assert {(r["output_tokens_min"], r["output_tokens_max"]) for r in levels[:2]} == {(20, 41)}
    assert levels[1]["accept_length"] == 1.0  # depth 0 was forced after the plain level


def test_plain_first_without_paired_is_refused_before_anything_runs(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["bench", "--url", "http://127.0.0.1:9", "--no-spec-url", "http://127.0.0.1:8",
              "--plain-first", "--out", str(tmp_path / "b")])  # fmt: skip
    assert result.exit_code == 2
    assert "--plain-first" in flat(result.output) and "give --paired" in flat(result.output)
    assert not (tmp_path / "b").exists()
    with pytest.raises(ValueError, match="only in paired levels"):
        SweepPlan(url="http://a", depths=(0,), concurrencies=(1,), stop=None,  # type: ignore[arg-type]
                  prompts=[], prompt_source="", no_spec_url="http://b", plain_first=True)


def test_prompts_that_came_round_are_said_and_recorded(
    sim_server_factory, tmp_path: Path
) -> None:
    """30 requests a level on 24 prompts: each server saw some prompts twice, and the
    simulator's KV pool holds all 24, so the bench says so and bench.json records it."""
    _, result, out = paired_bench(sim_server_factory, tmp_path, "0", 30, concurrency="4")
    text = flat(result.output)
    assert "prompts came round: 24 prompts" in text
    assert "to the speculative server and" in text and "to the plain server" in text
    report = json.loads((out / "bench.json").read_text())
    assert report["prompt_count"] == 24 and report["prompts_came_round"] is True


def test_flush_cache_empties_each_server_before_each_of_its_levels(
    sim_server_factory, tmp_path: Path
) -> None:
    """`--flush-cache`: each server's /flush_cache answered once per level of its own (the
    simulator counts the calls), every level records it, and the plan says so."""
    spec, result, out = paired_bench(sim_server_factory, tmp_path, "0,3", 3, "--flush-cache")
    assert "the prefix cache emptied before each level" in flat(result.output)
    report = json.loads((out / "bench.json").read_text())
    assert report["flush_cache"] is True
    levels = report["results"]
    assert len(levels) == 6 and all(r["cache_flushed"] is True for r in levels)
    assert spec.server.cache_flushes == 4  # d0 and d3 at 1 and 3 streams
    # The simulator exports no eviction histogram: the levels say unknown, not zero.
    assert {r["evictions"] for r in levels} == {None}


def test_a_refused_flush_is_named_and_the_level_runs_on(sim_server_factory, tmp_path) -> None:
    """A plain server whose admin key is not the bench's answers /flush_cache 401: each of its
    levels still runs, records `cache_flushed: false`, and the output says why."""
    spec = sim_server_factory(admin_key=KEY, speedup=50)
    nospec = sim_server_factory(speedup=50, speculative=False, admin_key="another-key")
    push_before(spec.base_url)
    out = tmp_path / "bench"
    result = CliRunner().invoke(
        app,
        ["bench", "--url", spec.base_url, "--admin-key", KEY, "--depths", "0",
         "--concurrency", "2", "--no-spec-url", nospec.base_url, "--paired", "--flush-cache",
         "--requests-per-level", "3", "--warmup-per-level", "0", "--dataset",
         str(dataset(tmp_path)), "--out", str(out), "--client-bound-share", "100"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    levels = {r["series"]: r for r in json.loads((out / "bench.json").read_text())["results"]}
    assert levels["d0"]["cache_flushed"] is True and levels["no-spec"]["cache_flushed"] is False
    assert levels["no-spec"]["requests"] >= 3
    assert nospec.server.cache_flushes == 0 and spec.server.cache_flushes == 1
    text = flat(result.output)
    assert f"{nospec.base_url}/flush_cache did not empty the prefix cache before level no-spec" \
        in text
