"""The GPU harness end to end on CPU: every phase, with two `specctl sim serve` processes in
place of the speculative and the plain SGLang server (real subprocesses in their own
sessions, real loopback HTTP, the real bench, smoke test and daemon as subprocesses).

What the simulator cannot show: SGLang's log lines (it writes none, so both counts are 0),
GPU memory (no nvidia-smi here) and real greedy numerics (its output ids depend on the prompt
only). Those are the GPU run's to measure.
"""

from __future__ import annotations

import json
import shutil
import socket
import tarfile

from benchmarks.gpu import harness
from benchmarks.gpu.options import PHASES
from benchmarks.gpu.procs import pid_alive


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def test_all_phases_against_simulated_servers_then_a_later_command(tmp_path, capsys):
    run_dir = tmp_path / "run"
    spec_port, plain_port = _free_ports(2)
    code = harness.main([
        "all", "--run-dir", str(run_dir), "--out-tar", str(tmp_path / "run.tar.gz"),
        "--backend", "sim", "--sim-speedup", "20", "--tiny",
        "--spec-port", str(spec_port), "--plain-port", str(plain_port),
        "--smoke-seconds", "0.5", "--greedy-prompts", "2", "--greedy-tokens", "16",
        "--switches", "20", "--switch-probe-every", "10", "--switch-load", "2",
        "--switch-interval", "0.01", "--bench-concurrency", "1,2", "--bench-depths", "0,3",
        "--bench-duration", "0.5", "--output-tokens", "16", "--prompt-tokens", "32",
        "--daemon-seconds", "4", "--daemon-segment", "2",
    ])  # fmt: skip
    out = capsys.readouterr().out
    state = json.loads((run_dir / "state.json").read_text())
    failed = {k: v["error"] for k, v in state["phases"].items() if v["status"] != "ok"}
    assert code == 0 and not failed, (failed, out[-3000:])
    assert list(state["phases"]) == list(PHASES)
    for phase in PHASES:
        assert f"== phase {phase}: ok in " in out  # elapsed time printed per phase

    summary = json.loads((run_dir / "summary.json").read_text())
    phases = summary["phases"]
    # each server's log read for SGLang's prefill lines (the stand-ins write none)
    assert summary["prefill_batches"]["plain"] == {"graphed": 0, "eager": 0,
                                                   "eager_one_token": 0}
    assert set(summary["prefill_batches"]) == {"spec", "plain"}
    # with the off modes, both trims' settings, the fence at the replay's, the draft prefill
    # skip's, and the plain decode switch's 400 (the simulator has no DECODE graphs)
    assert phases["smoke"]["result"]["result"] == "32 passed, 0 failed"
    greedy = phases["greedy"]["result"]["comparisons"]
    assert [c["mode"] for c in greedy] == ["plain-again", "spec-switching", "spec-d3"]
    assert all(c["flips"] == 0 and c["prompts"] == 2 for c in greedy)
    switch = phases["switch"]["result"]
    assert switch["pushes_sent"] == 20 and switch["ok"] and switch["failures"] == 0
    assert switch["checks"]["server RSS within limit"] is True  # /proc of the sim's process
    if shutil.which("nvidia-smi") is None:  # not measured is not a pass
        assert switch["checks"]["GPU memory within limit"] is None
    assert switch["iterations_by_depth"]["d0"] > 0 and switch["iterations_by_depth"]["d3"] > 0
    bench = phases["bench"]["result"]
    assert bench["levels"] == bench["levels_planned"] == 6
    assert set(bench["tok_per_s"]) == {f"{s} c={c}" for s in ("d0", "d3", "no-spec")
                                       for c in (1, 2)}
    assert phases["daemon"]["result"]["samples_stored"] > 0
    counts = summary["sglang_log_lines"]["lines"]
    assert counts["Adaptive spec params updated"] == {"total": 0, "under_table": 0}
    info = summary["server_info"]
    assert info["spec"]["max_running_requests"] and info["plain"]["max_total_num_tokens"]
    for name in ("summary.md", "greedy_report.json", "switch_report.json", "bench/bench.json",
                 "bench/bench.png", "smoke.txt", "daemon/daemon.log", "daemon/pushes.json",
                 "server_info_spec.json", "server_info_plain.json", "logs/spec.log",
                 "models/target-tiny/tokenizer.json"):
        assert (run_dir / name).is_file(), name
    assert "| smoke | ok |" in (run_dir / "summary.md").read_text()
    with tarfile.open(tmp_path / "run.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"run/summary.md", "run/summary.json", "run/state.json", "run/MANIFEST.txt"} <= names
    assert not any(pid_alive(int(s["pid"])) for s in state["servers"].values())

    # A later command continues from state.json: saved options, servers gone since `stop`.
    code = harness.main(["smoke", "greedy", "--run-dir", str(run_dir)])
    out = capsys.readouterr().out
    state = json.loads((run_dir / "state.json").read_text())
    assert code == 1 and state["options"]["tiny"] is True
    for phase in ("smoke", "greedy"):
        assert state["phases"][phase]["status"] == "failed"
        assert "does not answer /health: run the `start` phase" in state["phases"][phase]["error"]
        assert f"== phase {phase}: FAILED" in out
    assert "| greedy | failed |" in (run_dir / "summary.md").read_text()

    # A budget too short for any phase: each is skipped, the summary still written.
    assert harness.main(["smoke", "bench", "summary", "--run-dir", str(run_dir),
                         "--budget", "50"]) == 1
    state = json.loads((run_dir / "state.json").read_text())
    assert state["phases"]["bench"]["status"] == "skipped"
    assert state["phases"]["summary"]["status"] == "ok" and "budget" not in state["options"]
    assert harness.main(["smoke", "--run-dir", str(run_dir), "--budget", "10"]) == 2


def test_a_later_start_reuses_a_server_only_if_its_launch_is_the_same(tmp_path, capsys):
    """`start` again with the same options finds both servers up and keeps them; with the
    plugin asked into the plain server its environment differs, so that server alone is
    restarted (real `specctl sim serve` processes)."""
    run_dir = tmp_path / "run"
    spec_port, plain_port = _free_ports(2)
    base = ["--run-dir", str(run_dir), "--backend", "sim", "--tiny", "--spec-port",
            str(spec_port), "--plain-port", str(plain_port)]  # fmt: skip
    try:
        assert harness.main(["start", *base]) == 0
        first = json.loads((run_dir / "state.json").read_text())["servers"]
        assert first["plain"]["env"] == {"SGLANG_PLUGINS": "none"}
        assert harness.main(["start", *base]) == 0
        assert capsys.readouterr().out.count("already up") == 2
        assert harness.main(["start", *base, "--plain-with-plugin"]) == 0
        out = capsys.readouterr().out
        now = json.loads((run_dir / "state.json").read_text())["servers"]
        assert "spec: already up" in out and "plain: stopping the old server" in out
        assert now["spec"]["pid"] == first["spec"]["pid"]
        assert now["plain"]["pid"] != first["plain"]["pid"] and now["plain"]["env"] == {}
    finally:
        harness.main(["stop", "--run-dir", str(run_dir)])
