"""`specctl sim evaluate`: the report's shape and the daemon's run through the simulator.

Short scenarios written to tmp_path keep these fast; the full built-in runs are the
benchmark (benchmarks/evaluate_all.py, results in docs/results/).
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from controller.cli import app
from controller.evaluation.evaluate import baselines, evaluate
from sims.profile import load_profile
from sims.workload import load_scenario

REQUIRED = (
    "achieved_tok_per_s",
    "oracle_tok_per_s",
    "ratio_to_oracle",
    "static",
    "best_static",
    "exploration_share",
    "time_to_good_table_s",
    "thresholds_vs_oracle_at_10min",
    "oracle_crossovers_at_10min",
)


def _scenario(tmp_path, drift: bool = False, duration_s: int = 360) -> str:
    phases = "    - {at: 0, phase: code}\n" + (
        "    - {at: 150, phase: chat, blend_s: 30}\n" if drift else ""
    )
    path = tmp_path / ("drift.yaml" if drift else "short.yaml")
    path.write_text(
        f"name: {'short-drift' if drift else 'short'}\nduration_s: {duration_s}\nwarmup_s: 20\n"
        "sample_interval_s: 10\nworkload:\n  mode: closed\n"
        f"  concurrency: {{interpolation: linear, points: [[0, 2], [{duration_s}, 24]]}}\n"
        "  prompt_tokens: {dist: fixed, value: 512}\n"
        "  output_tokens: {dist: fixed, value: 128}\n"
        "  phases:\n" + phases
    )
    return str(path)


def test_cli_prints_one_json_object_with_every_required_key(tmp_path):
    import controller.cli.evaluate  # noqa: F401  registers `sim evaluate`

    result = CliRunner().invoke(
        app,
        [
            "sim",
            "evaluate",
            "--profile",
            "h100-llama8b-eagle3",
            "--scenario",
            _scenario(tmp_path, drift=True, duration_s=720),
            "--json",
            "--seed",
            "3",
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    for key in (*REQUIRED, "drift_recovery_s", "drift_at_s"):
        assert key in report, key
    assert report["drift_at_s"] == 150
    statics = report["static"]
    assert {"always off (depth 0)", "sglang default adaptive"} <= set(statics)
    assert "no speculation" not in statics  # another deployment, reported on its own:
    assert report["nospec_server"]["max_running_requests"] >= 1
    assert any(k.startswith("always full depth") for k in statics)
    assert any(k.startswith("best two-tier") for k in statics)
    assert 0.5 < report["ratio_to_oracle"] < 1.2
    assert report["samples_stored"] > 10 and report["pushes"] >= 1


def test_unknown_profile_is_a_clear_error(tmp_path):
    import controller.cli.evaluate  # noqa: F401

    result = CliRunner().invoke(app, ["sim", "evaluate", "--profile", "nope", "--json"])
    assert result.exit_code == 2
    assert "unknown profile 'nope'" in result.output


def test_evaluate_over_loopback_http_matches_the_contract(tmp_path):
    """The daemon reaches the simulator over real loopback HTTP (the FastAPI app and uvicorn
    server `specctl sim serve` runs, started in this process so that the evaluation can read
    the simulator's own stats for scoring). Each tick advances the served simulator, as
    in-process, so a loaded machine changes only how long this takes: the HTTP run must then
    be the in-process run, push for push (same seed, same request stream), which holds only
    if every scrape, read and push means the same over HTTP. 12 simulated minutes: past the
    first fit, so tables are pushed over HTTP."""
    scenario = _scenario(tmp_path, duration_s=720)
    profile = "kimi-k25-8x-rtxpro6000-pcie"
    pre = baselines(load_profile(profile), load_scenario(scenario), 0)
    report = evaluate(profile, scenario, 0, http_stepped=True, precomputed=pre)
    assert report["transport"] == "http"
    assert report["samples_stored"] > 10
    assert report["pushes"] >= 1
    assert report["achieved_tok_per_s"] > 0
    assert report["final_table"] is not None
    local = evaluate(profile, scenario, 0, precomputed=pre)
    assert local["transport"] == "in-process"
    pushed = [(p["t"], p["outcome"], p["table"]) for p in report["push_log"]]
    assert pushed == [(p["t"], p["outcome"], p["table"]) for p in local["push_log"]]
    for key in ("samples_stored", "pushes", "rollbacks", "final_table", "exploration_share"):
        assert report[key] == local[key], key
    assert report["achieved_tok_per_s"] == pytest.approx(local["achieved_tok_per_s"], rel=1e-9)


def test_evaluate_over_a_free_running_served_clock_reports_its_lead(tmp_path):
    """`--http SPEEDUP`: the served clock runs on its own; the daemon still pushes over HTTP,
    and the report says how far that clock got ahead of the daemon's ticks (never behind: each
    tick waits for it; and ahead by at least the part of an iteration it ran past the tick)."""
    scenario = _scenario(tmp_path, duration_s=360)
    profile = "kimi-k25-8x-rtxpro6000-pcie"
    pre = baselines(load_profile(profile), load_scenario(scenario), 0)
    report = evaluate(profile, scenario, 0, http_speedup=50.0, precomputed=pre)
    assert report["transport"] == "http" and report["served_clock_speedup"] == 50.0
    assert report["samples_stored"] > 10 and report["pushes"] >= 1
    assert report["served_clock_lead_s"] > 0


def test_a_daemon_from_a_bench_starts_with_its_levels_as_samples(tmp_path):
    """`seed_bench` (`specctl sim evaluate --seed-bench`): the evaluated daemon's store
    starts with a sample per usable level of the bench, as the daemon's own start does, and
    it has a table to push before any load; from an empty store it has neither. (An idle
    server: its scrapes store nothing, so the samples are the bench's alone.)"""
    from pathlib import Path

    from controller.daemon.bench_seed import read_bench, samples_from_bench
    from controller.evaluation.evaluate import run_daemon_eval

    bench = Path(__file__).parent / "data" / "gpu_trace_run" / "bench"
    seeded = samples_from_bench(read_bench(bench), "eval", "sim", 0.0)
    assert seeded  # the bench measured depths with the plugin's counters
    profile = load_profile("h200-llama8b-eagle3")
    path = tmp_path / "idle.yaml"
    path.write_text("name: idle\nduration_s: 120\nsample_interval_s: 10\n"
                    "workload: {mode: closed, concurrency: 0}\n")
    cold = run_daemon_eval(profile, load_scenario(path), 0)
    warm = run_daemon_eval(profile, load_scenario(path), 0, seed_bench=bench)
    assert (cold.samples, cold.pushes) == (0, 0)
    assert warm.samples == len(seeded) and warm.pushes >= 1


def test_a_partial_rerun_keeps_the_other_runs_in_the_summary(tmp_path) -> None:
    """`evaluate_all.py --keep-others`: the rerun's reports replace their own files, every
    other run's file in the folder is kept, and the summary sees them all in order."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "evaluate_all.py"
    spec = importlib.util.spec_from_file_location("evaluate_all", path)
    assert spec is not None and spec.loader is not None
    evaluate_all = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(evaluate_all)

    def report(profile: str, scenario: str, seed: int, ratio: float) -> dict:
        return {"profile": profile, "scenario": scenario, "seed": seed, "ratio": ratio}

    for old in (report("b", "ramp", 0, 0.9), report("a", "ramp", 1, 0.9),
                report("a", "ramp", 0, 0.9)):
        (tmp_path / evaluate_all.run_file(old)).write_text(json.dumps(old))
    (tmp_path / "summary.json").write_text("{}")  # not a run's file
    fresh = [report("a", "ramp", 0, 0.99)]
    every, kept = evaluate_all.with_kept_runs(fresh, tmp_path)
    assert [(r["profile"], r["seed"], r["ratio"]) for r in every] == [
        ("a", 0, 0.99), ("a", 1, 0.9), ("b", 0, 0.9)]
    assert len(kept) == 2
