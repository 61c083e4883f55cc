"""The GPU kernel profile's capture and summary, on CPU.

The capture runs against the real simulated server over loopback HTTP, with one stand-in: the
simulator has no `/start_profile`, so the test adds a route that writes what SGLang's profiler
writes (a gzipped Chrome trace named `<prefix>-<id>-TP-0.trace.json.gz`, complete 'X' events of
category `kernel`), with durations the test chooses, so the per-iteration figures are known.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request

from benchmarks.gpu import kernel_profile
from controller.bench.server_client import ServerClient
from sims.http import ServedSimulation
from sims.profile import load_profile
from sims.server import SimulatedServer
from sims.workload import Workload


def _events(steps: int, gemm_us: float, extra_us: float) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    t = 0.0
    for _ in range(steps):
        out.append(
            {
                "ph": "X",
                "cat": "kernel",
                "name": "void sm90_gemm<long, args>",
                "ts": t,
                "dur": gemm_us,
            }
        )
        # overlaps the gemm on a second stream: counted in kernel time, not twice in busy time
        out.append({"ph": "X", "cat": "kernel", "name": "fill_kernel", "ts": t, "dur": 1.0})
        if extra_us:
            out.append(
                {
                    "ph": "X",
                    "cat": "kernel",
                    "name": "verify_tree",
                    "ts": t + gemm_us,
                    "dur": extra_us,
                }
            )
        out.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": t, "dur": 500.0})
        t += 100.0
    return out


def test_summary_per_iteration_and_busy_union() -> None:
    s = kernel_profile.summarize(_events(10, 40.0, 5.0), steps=10)
    assert s["kernel_us_per_step"] == pytest.approx(46.0)
    assert s["busy_us_per_step"] == pytest.approx(45.0)  # the overlapping fill not counted twice
    assert s["span_us_per_step"] == pytest.approx((900 + 45) / 10)
    names = [k["name"] for k in s["kernels"]]
    assert names[0] == "sm90_gemm<long, args>" and "aten::mm" not in names
    assert s["kernels"][0]["launches_per_step"] == pytest.approx(1.0)


def test_summary_without_gpu_events_says_what_is_missing() -> None:
    with pytest.raises(kernel_profile.ProfileError, match="activities GPU"):
        kernel_profile.summarize([e for e in _events(3, 1, 0) if e["cat"] == "cpu_op"], steps=3)


def test_compare_ranks_the_largest_change_first() -> None:
    base = kernel_profile.summarize(_events(4, 40.0, 0.0), 4) | {"label": "plain"}
    other = kernel_profile.summarize(_events(4, 41.0, 6.0), 4) | {"label": "d0"}
    text = kernel_profile.compare(base, other)
    kernel_lines = text.splitlines()[6:]
    assert kernel_lines[0].startswith("verify_tree") and "+6.0" in kernel_lines[0]
    assert "+7.0" in text.splitlines()[1]  # kernel time 41+6+1 vs 40+1


def test_unreadable_trace_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "x.trace.json.gz"
    bad.write_bytes(b"not gzip")
    with pytest.raises(kernel_profile.ProfileError, match=r"x\.trace\.json\.gz"):
        kernel_profile.read_trace(bad)


def _served(with_profiler: bool, steps_seen: list[dict[str, Any]]) -> ServedSimulation:
    server = SimulatedServer(load_profile("h200-llama8b-eagle3"), Workload.closed(0.0), seed=0)
    served = ServedSimulation(server, speedup=20.0)
    if with_profiler:
        app = served.uvicorn.config.app
        assert isinstance(app, FastAPI)

        async def start_profile(request: Request) -> dict[str, bool]:
            body = await request.json()
            steps_seen.append(body)
            out = Path(body["output_dir"])
            out.mkdir(parents=True, exist_ok=True)
            trace = {"traceEvents": _events(body["num_steps"], 30.0, 4.0)}
            name = f"{body['profile_prefix']}-1700000000.0-TP-0.trace.json.gz"
            with gzip.open(out / name, "wt") as f:
                json.dump(trace, f)
            return {"success": True}

        app.add_api_route("/start_profile", start_profile, methods=["POST"])
    served.start()
    return served


def test_capture_writes_one_summary_per_level(tmp_path: Path) -> None:
    seen: list[dict[str, Any]] = []
    served = _served(True, seen)
    try:
        before = ServerClient(served.base_url).state()
        rc = kernel_profile.main([
            "capture", "--url", served.base_url, "--label", "d0", "--depth", "0",
            "--streams", "1,4",
            "--steps", "12", "--seconds", "0.5", "--warmup", "0.2", "--output-tokens", "16",
            "--out", str(tmp_path),
        ])  # fmt: skip
        after = ServerClient(served.base_url).state()
    finally:
        served.stop()
    assert rc == 0
    assert [b["profile_prefix"] for b in seen] == ["d0-c1", "d0-c4"]
    assert all(b["activities"] == ["GPU"] and b["num_steps"] == 12 for b in seen)
    summary = json.loads((tmp_path / "d0-c4.json").read_text())
    assert summary["streams"] == 4 and summary["busy_us_per_step"] == pytest.approx(34.0)
    assert summary["depth"] == 0
    assert before.table is None and after.table is None  # forced for the capture, then released


def test_capture_on_a_server_without_a_profiler_fails_clearly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    served = _served(False, [])
    try:
        rc = kernel_profile.main([
            "capture", "--url", served.base_url, "--label", "x", "--streams", "1",
            "--steps", "5", "--seconds", "0.3", "--warmup", "0.1", "--output-tokens", "8",
            "--out", str(tmp_path),
        ])  # fmt: skip
    finally:
        served.stop()
    assert rc == 2
    assert "/start_profile answered 404" in capsys.readouterr().err


def test_host_sections_count_operators_per_iteration(tmp_path: Path, capsys) -> None:
    events = _events(10, 40.0, 5.0)
    for i in range(10):  # the deeper path launches twice per iteration
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                       "ts": i * 100.0, "dur": 3.0})  # fmt: skip
    plain = kernel_profile.summarize(_events(10, 40.0, 0.0), 10) | {"label": "plain"}
    plain["host_ops"] = kernel_profile.summarize(_events(10, 40.0, 0.0), 10, ("cpu_op",))
    d0 = kernel_profile.summarize(events, 10) | {"label": "d0"}
    for section, categories in kernel_profile.HOST_SECTIONS.items():
        d0[section] = kernel_profile.summarize(events, 10, categories)
    assert d0["host_ops"]["kernels"][0]["name"] == "aten::mm"
    assert d0["runtime_calls"]["kernels"][0]["launches_per_step"] == pytest.approx(1.0)
    a, b = tmp_path / "plain.json", tmp_path / "d0.json"
    a.write_text(json.dumps(plain))
    b.write_text(json.dumps(d0))
    assert kernel_profile.main(["compare", str(a), str(b), "--part", "host_ops"]) == 0
    out = capsys.readouterr().out
    assert "host_ops (calls per iteration)" in out and "aten::mm (1)" in out
    assert kernel_profile.main(["compare", str(a), str(b), "--part", "runtime_calls"]) == 2
    assert "plain.json has no 'runtime_calls': capture it with --host" in capsys.readouterr().err


def test_capture_with_host_asks_for_cpu_activity(tmp_path: Path, capsys) -> None:
    seen: list[dict[str, Any]] = []
    served = _served(True, seen)
    try:
        rc = kernel_profile.main([
            "capture", "--url", served.base_url, "--label", "plain", "--streams", "2",
            "--steps", "8", "--seconds", "0.5", "--warmup", "0.2", "--output-tokens", "16",
            "--out", str(tmp_path), "--host",
        ])  # fmt: skip
    finally:
        served.stop()
    assert rc == 0 and seen[0]["activities"] == ["CPU", "GPU"]
    summary = json.loads((tmp_path / "plain-c2.json").read_text())
    assert summary["host_ops"]["kernels"][0]["name"] == "aten::mm"
    # the stand-in trace has no runtime calls: recorded as missing, not a failed capture
    assert summary["runtime_calls"] is None
    assert "no runtime_calls in the trace" in capsys.readouterr().out
