"""Calibration: the benchmark's CPU fallback, the fit, and the shipped H200 profiles.

The benchmark needs torch, which the default install leaves out; it runs here in a subprocess
under the first interpreter that has torch: this one, or the SGLang test venv that
scripts/test.sh builds (CPU torch 2.13). Real forwards on tiny shapes, no mocks.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import sglang_venv

from sims.calibrate.fit import (
    Point,
    fit_draft,
    fit_profile,
    fit_report,
    load_points,
    nonneg_lstsq,
)
from sims.calibrate.shapes import LLAMA_8B, QWEN3_30B_A3B
from sims.profile import load_profile

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "sims" / "calibrate" / "data"
SHIPPED = {"llama8b": ("h200-llama8b-eagle3", LLAMA_8B), "moe": ("h200-moe-eagle3", QWEN3_30B_A3B)}


@sglang_venv.needs("torch")
def test_bench_cpu_fallback_runs_tiny_models(tmp_path: Path) -> None:
    """The calibration bench on CPU, in the plugin tests' venv (the one with torch)."""
    python = str(sglang_venv.PYTHON)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [python, "-m", "sims.calibrate.bench", "--preset", "tiny-dense", "--preset", "tiny-moe",
         "--device", "cpu", "--out", str(tmp_path)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    meta = json.loads((tmp_path / "meta.json").read_text())
    # The timed attention layouts and the grouped MoE compute what plain references compute.
    assert meta["attention"] == "fused"
    assert max(meta["self_check_rel_error"].values()) < 2e-2
    rows = list(csv.DictReader((tmp_path / "steps_tiny-dense.csv").open()))
    kinds = {r["kind"] for r in rows}
    assert kinds == {"target", "draft_extend", "draft_step", "iteration"}
    # every (context, batch, tokens) of the plan, for target and extend
    targets = {(r["context"], r["batch"], r["tokens"]) for r in rows if r["kind"] == "target"}
    assert len(targets) == 2 * 3 * 3
    assert all(float(r["ms"]) > 0 for r in rows)
    moe_rows = list(csv.DictReader((tmp_path / "steps_tiny-moe.csv").open()))
    assert {(r["batch"], r["tokens"]) for r in moe_rows if r["kind"] == "target"} == {
        (b, n) for b in ("1", "4") for n in ("1", "2", "3")
    }


def _grid_points(profile, contexts=(1024, 8192)) -> list[Point]:  # type: ignore[no-untyped-def]
    pts = []
    for ctx in contexts:
        for b in (1, 2, 4, 8, 16, 32, 64, 128, 256):
            for n in range(1, 9):
                pts.append(Point("target", ctx, b, n, None, float(profile.target_ms(b, n, ctx))))
                ms = float(profile.draft_extend_ms(b, n, ctx))
                pts.append(Point("draft_extend", ctx, b, n, None, ms))
            ms = float(profile.draft_step_ms(b, ctx))
            pts.append(Point("draft_step", ctx, b, 1, None, ms))
    return pts


@pytest.mark.parametrize("kv_in_roofline", [True, False])
def test_fit_recovers_known_parameters(kv_in_roofline: bool) -> None:
    base = load_profile("h200-llama8b-eagle3")
    truth_target = {
        "fixed_ms": 1.7, "weight_read_ms": 3.5, "kv_us_per_req_per_1k_ctx": 38.0,
        "compute_us_per_token": 24.0, "roofline_sharpness": 3.0, "kv_in_roofline": kv_in_roofline,
    }
    truth_draft = {
        "step_fixed_ms": 0.42, "step_us_per_req": 2.0, "extend_fixed_ms": 0.5,
        "extend_us_per_token": 1.1, "extend_us_per_req": 0.7, "kv_us_per_req_per_1k_ctx": 1.5,
    }
    data = base.model_dump()
    data["target"].update(truth_target)
    data["draft"].update(truth_draft)
    truth = type(base).model_validate(data)
    points = _grid_points(truth)
    fitted = fit_profile(base, points, weight_read_ms=3.5)
    got = fitted.target
    assert got.kv_in_roofline == kv_in_roofline
    for name in ("fixed_ms", "kv_us_per_req_per_1k_ctx", "compute_us_per_token",
                 "roofline_sharpness"):
        assert getattr(got, name) == pytest.approx(truth_target[name], rel=0.02), name
    for name, value in truth_draft.items():
        assert getattr(fitted.draft, name) == pytest.approx(value, rel=0.01), name
    errors = fit_report(fitted, points)
    assert errors["target/held_out"]["worst"] < 0.005


def test_fit_recovers_moe_expert_read() -> None:
    base = load_profile("h200-moe-eagle3")
    data = base.model_dump()
    data["target"].update(
        {"fixed_ms": 6.0, "weight_read_ms": 0.6, "kv_us_per_req_per_1k_ctx": 30.0,
         "compute_us_per_token": 20.0, "roofline_sharpness": 2.0, "kv_in_roofline": False}
    )
    data["target"]["moe"]["expert_read_ms"] = 15.0
    truth = type(base).model_validate(data)
    fitted = fit_profile(base, _grid_points(truth), weight_read_ms=0.6)
    assert fitted.target.moe is not None
    assert fitted.target.moe.expert_read_ms == pytest.approx(15.0, rel=0.02)
    assert fitted.target.fixed_ms == pytest.approx(6.0, rel=0.02)


def test_nonneg_lstsq_drops_negative_coefficients() -> None:
    a = np.array([[1.0, 0.0], [1.0, 1.0], [1.0, 2.0]])
    y = np.array([3.0, 2.0, 1.0])  # unconstrained slope would be -1
    x = nonneg_lstsq(a, y)
    assert x[1] == 0.0 and x[0] == pytest.approx(2.0)


def test_fit_draft_refuses_missing_measurements() -> None:
    with pytest.raises(ValueError, match="draft_step"):
        fit_draft([Point("target", 1024, 1, 1, None, 5.0)])


def _weight_ms(key: str) -> float:
    meta = json.loads((DATA / "meta.json").read_text())
    bw = max(meta["ceilings"]["copy_tb_s"], meta["ceilings"]["read_tb_s"])
    return SHIPPED[key][1].dense_bytes() / (bw * 1e12) * 1000.0


@pytest.mark.parametrize("key", sorted(SHIPPED))
def test_shipped_profile_is_the_fit_of_the_checked_in_data(key: str) -> None:
    name, _ = SHIPPED[key]
    shipped = load_profile(name)
    points = load_points([DATA / f"steps_{key}.csv"])
    refit = fit_profile(shipped, points, weight_read_ms=_weight_ms(key))
    for section in ("target", "draft"):
        want = getattr(refit, section).model_dump()
        got = getattr(shipped, section).model_dump()
        for field, value in want.items():
            if isinstance(value, float):
                assert got[field] == pytest.approx(value, rel=1e-3), f"{section}.{field}"


@pytest.mark.parametrize("key", sorted(SHIPPED))
def test_shipped_profile_fit_error_within_targets(key: str) -> None:
    """Median < 5% and worst < 15% on held-out points, except where docs/simulator.md
    ("Calibrating the cost model on a GPU") says.

    Known miss: Llama-3.1-8B at 8k context, where the attention kernel's split heuristic
    makes KV time jump between B=16 and B=32; the linear KV term cannot follow it there.
    """
    profile = load_profile(SHIPPED[key][0])
    points = load_points([DATA / f"steps_{key}.csv"])
    errors = fit_report(profile, points)
    for kind in ("target", "draft_step", "draft_extend", "iteration"):
        assert errors[f"{kind}/held_out"]["median"] < 0.05, kind
    short = [p for p in points if p.context == 1024]
    short_errors = fit_report(profile, short)
    for kind in ("target", "draft_step", "draft_extend", "iteration"):
        assert short_errors[f"{kind}/held_out"]["worst"] < 0.15, kind
    worst_allowed = 0.15 if key == "moe" else 0.20
    assert errors["target/held_out"]["worst"] < worst_allowed
