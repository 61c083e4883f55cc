"""`benchmarks.gpu.switch_verdict`: a switch phase cut by its budget against a real failure,
read from summary.json files written here (the phase's own result shape)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.gpu import switch_verdict

CHECKS = {
    "all 1000 pushes sent": True,
    "every push applied": True,
    "no hang (pushes, requests, health)": True,
    "no request failed under the pushes": True,
    "both d0 and d3 ran": True,
    "GPU memory within limit": None,  # not measured: neither a pass nor a failure
    "server RSS within limit": True,
    "greedy outputs identical after the stress": True,
}


def _summary(tmp_path: Path, stopped: str | None, **failed: bool) -> Path:
    checks = dict(CHECKS)
    for name, ok in failed.items():
        checks[name.replace("_", " ")] = ok
    phase = {"status": "failed", "result": {"switches_planned": 1000, "stopped_early": stopped,
                                            "checks": checks}}
    path = tmp_path / "summary.json"
    path.write_text(json.dumps({"phases": {"switch": phase}}))
    return path


def _run(path: Path) -> int:
    return switch_verdict.main([str(path)])


def test_cut_by_the_budget_alone_keeps_the_trims(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = _summary(tmp_path, "out of time (--budget) after 327 pushes",
                    all_1000_pushes_sent=False)
    assert _run(path) == 0
    assert "after 327 pushes" in capsys.readouterr().out


@pytest.mark.parametrize("failed", ["greedy_outputs_identical_after_the_stress",
                                    "every_push_applied", "server_RSS_within_limit"])
def test_a_real_failure_beside_the_cut_turns_them_off(tmp_path: Path, failed: str,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    path = _summary(tmp_path, "out of time (--budget) after 327 pushes",
                    all_1000_pushes_sent=False, **{failed: False})
    assert _run(path) == 1
    assert failed.replace("_", " ") in capsys.readouterr().err


def test_short_of_pushes_without_running_out_of_time_is_a_failure(tmp_path: Path) -> None:
    assert _run(_summary(tmp_path, None, all_1000_pushes_sent=False)) == 1


def test_no_switch_phase_is_a_failure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "summary.json"
    path.write_text(json.dumps({"phases": {}}))
    assert _run(path) == 1
    assert "no switch phase" in capsys.readouterr().err
    assert _run(tmp_path / "missing.json") == 1
