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
from asgi_record import RecordPosts
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


def _served(
    with_profiler: bool, steps_seen: list[dict[str, Any]],
    posts: list[tuple[str, Any]] | None = None,
) -> ServedSimulation:
    server = SimulatedServer(load_profile("h200-llama8b-eagle3"), Workload.closed(0.0), seed=0)
    served = ServedSimulation(server, speedup=20.0)
    app = served.uvicorn.config.app
    assert isinstance(app, FastAPI)
    if posts is not None:
        app.add_middleware(RecordPosts, posts=posts)
    if with_profiler:

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
    # the stand-in's 34 us of kernels every 100 us: 11 gaps of 66 us over 12 iterations
    assert summary["idle"]["idle_us_per_step"] == pytest.approx(11 * 66.0 / 12)
    assert summary["idle"]["by_boundary"][0]["before"] == "verify_tree"
    assert before.table is None and after.table is None  # forced for the capture, then released


def test_each_level_sends_its_own_prompts(tmp_path: Path) -> None:
    """A level replaying the last one's prompts would profile prefix-cache hits."""
    seen: list[dict[str, Any]] = []
    posts: list[tuple[str, Any]] = []
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text("".join(json.dumps({"prompt": f"Request {i}: hello"}) + "\n"
                               for i in range(10_000)))  # fmt: skip
    served = _served(True, seen, posts)
    try:
        rc = kernel_profile.main([
            "capture", "--url", served.base_url, "--label", "plain", "--streams", "1,1",
            "--steps", "4", "--seconds", "0.3", "--warmup", "0.1", "--output-tokens", "4",
            "--dataset", str(dataset), "--out", str(tmp_path),
        ])  # fmt: skip
    finally:
        served.stop()
    assert rc == 0
    # two levels over 10,000 prompts: the first starts at prompt 0, the second at 5,000
    heads = [body["prompt"].split(":")[0] for path, body in posts if path == "/v1/completions"]
    assert heads[0] == "Request 0" and "Request 5000" in heads
    second = heads.index("Request 5000")
    assert heads[:second] == [f"Request {i}" for i in range(second)]
    assert heads[second:] == [f"Request {5000 + i}" for i in range(len(heads) - second)]


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


def _k(name: str, ts: float, dur: float, stream: int) -> dict[str, Any]:
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "tid": stream,
            "args": {"stream": stream}}  # fmt: skip


def _two_stream_events(steps: int) -> list[dict[str, Any]]:
    """Per 200 us iteration, on streams 7 and 8: busy [0,25] (A, then X overlapping it on the
    other stream), [30,50] (B, then Y touching it), [100,110] (C), [111,112] (Z). Gaps: X->B 5,
    Y->C 50, C->Z 1 (under the 2 us floor), and Z->A 88 into the next iteration."""
    out: list[dict[str, Any]] = []
    for i in range(steps):
        t = 200.0 * i
        out += [
            _k("void A<float>", t, 10, 7), _k("X", t + 5, 20, 8),
            _k("B", t + 30, 10, 7), _k("Y", t + 40, 10, 8),
            _k("C", t + 100, 10, 7), _k("Z", t + 111, 1, 8),
            # not GPU kernels: neither fills a gap nor starts a stretch
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": t + 60, "dur": 30.0},
            {"ph": "B", "cat": "kernel", "name": "open", "ts": t + 60},
        ]  # fmt: skip
    return out


def test_idle_gaps_per_boundary_across_streams() -> None:
    idle = kernel_profile.idle_gaps(_two_stream_events(2), steps=2)
    # gaps 5, 50, 1, 88, 5, 50, 1 (the last iteration has no gap after it)
    assert idle["idle_us_per_step"] == pytest.approx(200.0 / 2)
    assert idle["gaps_per_step"] == pytest.approx(5 / 2)  # the two 1 us gaps left out
    assert idle["gap_us_quantiles"] == pytest.approx({"p50": 50.0, "p90": 72.8, "max": 88.0})
    assert idle["by_boundary"] == [
        {"before": "Y", "after": "C", "gaps_per_step": 1.0, "us_per_step": 50.0,
         "mean_us": 50.0},
        {"before": "Z", "after": "A<float>", "gaps_per_step": 0.5, "us_per_step": 44.0,
         "mean_us": 88.0},
        {"before": "X", "after": "B", "gaps_per_step": 1.0, "us_per_step": 5.0, "mean_us": 5.0},
    ]  # fmt: skip


def test_overlap_on_another_stream_is_not_idle() -> None:
    # stream 7 alone idles 20 us after A; X on stream 8 covers it
    idle = kernel_profile.idle_gaps(_two_stream_events(1), steps=1)
    assert all(b["before"] != "A<float>" for b in idle["by_boundary"])
    both = [_k("A", 0, 10, 7), _k("X", 5, 20, 8), _k("B", 25, 5, 7), _k("W", 2, 3, 8)]
    none = kernel_profile.idle_gaps(both, steps=1)
    assert none["idle_us_per_step"] == 0.0 and none["gaps_per_step"] == 0.0
    assert none["by_boundary"] == []
    assert none["gap_us_quantiles"] == {"p50": 0.0, "p90": 0.0, "max": 0.0}


def test_idle_gaps_floor_and_top() -> None:
    events = _two_stream_events(2)
    wide = kernel_profile.idle_gaps(events, steps=2, min_gap_us=60.0)
    assert wide["idle_us_per_step"] == pytest.approx(100.0)  # every gap, whatever the floor
    assert wide["gaps_per_step"] == pytest.approx(0.5)
    assert [(b["before"], b["after"]) for b in wide["by_boundary"]] == [("Z", "A<float>")]
    fine = kernel_profile.idle_gaps(events, steps=2, min_gap_us=1.0)
    assert fine["gaps_per_step"] == pytest.approx(7 / 2)
    # Y starting as B ends extends B's stretch: no zero-length gap between them
    assert kernel_profile.idle_gaps(events, steps=2, min_gap_us=0.0)["gaps_per_step"] == 3.5
    assert ("C", "Z") in [(b["before"], b["after"]) for b in fine["by_boundary"]]
    top = kernel_profile.idle_gaps(events, steps=2, top=1)["by_boundary"]
    assert [(b["before"], b["after"]) for b in top] == [("Y", "C")]


def test_idle_gaps_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="steps"):
        kernel_profile.idle_gaps(_two_stream_events(1), steps=0)
    cpu_only = [e for e in _two_stream_events(1) if e["cat"] == "cpu_op"]
    with pytest.raises(kernel_profile.ProfileError, match="activities GPU"):
        kernel_profile.idle_gaps(cpu_only, steps=1)


def _gaps_summary() -> dict[str, Any]:
    events = _two_stream_events(2)
    summary = kernel_profile.summarize(events, 2) | {"label": "d0", "streams": 16}
    return summary | {"idle": kernel_profile.idle_gaps(events, 2)}


def test_format_gaps_lists_boundaries() -> None:
    lines = kernel_profile.format_gaps(_gaps_summary(), top=2).splitlines()
    assert lines[0] == (
        "d0, 16 streams: 100.0 us GPU idle per iteration, 2.5 gaps >= 2 us per iteration "
        "(p50 50.0, p90 72.8, max 88.0 us)"
    )
    rows = lines[3:]
    assert len(rows) == 2  # top 2 of 3 boundaries
    assert rows[0].split() == ["Y", "->", "C", "1", "50.0", "50.0"]
    assert rows[1].split() == ["Z", "->", "A<float>", "0.5", "44.0", "88.0"]


def test_format_gaps_cuts_long_names() -> None:
    summary = _gaps_summary()
    summary["idle"]["by_boundary"][0]["before"] = "k" * 80
    row = kernel_profile.format_gaps(summary, top=1).splitlines()[3]
    assert row.startswith("k" * 44 + "~ -> C ")


def test_gaps_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "d0-c16.json"
    path.write_text(json.dumps(_gaps_summary()))
    assert kernel_profile.main(["gaps", str(path), "--top", "1"]) == 0
    out = capsys.readouterr().out
    assert "100.0 us GPU idle per iteration" in out and "Y -> C" in out
    assert "Z -> A<float>" not in out
    old = tmp_path / "old.json"
    old.write_text(json.dumps(kernel_profile.summarize(_two_stream_events(2), 2)))
    assert kernel_profile.main(["gaps", str(old)]) == 2
    err = capsys.readouterr().err
    assert "old.json has no 'idle'" in err and "captured before idle gaps were recorded" in err
