"""`specctl sim evaluate`: the report's shape and the daemon's run through the simulator.

Short scenarios written to tmp_path keep these fast; the full built-in runs are the
benchmark (benchmarks/evaluate_all.py, results in docs/results/).
"""

from __future__ import annotations

import json

from typer.testing import CliRunner

from controller.cli import app
from controller.evaluation.evaluate import evaluate

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
    the simulator's own stats for scoring); its clock runs at 400x wall time. 12 simulated
    minutes: past the daemon's takeover wait, so at least one table is pushed over HTTP."""
    scenario = _scenario(tmp_path, duration_s=720)
    report = evaluate("kimi-k25-8x-rtxpro6000-pcie", scenario, 0, http_speedup=400.0)
    assert report["transport"] == "http"
    assert report["samples_stored"] > 10
    assert report["pushes"] >= 1
    assert report["achieved_tok_per_s"] > 0
    assert report["final_table"] is not None
