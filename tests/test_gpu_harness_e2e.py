"""The GPU harness end to end on CPU through its entry, `python -m benchmarks.gpu`: every step,
with two `specctl sim serve` processes in place of the speculative and the plain SGLang server
(real subprocesses in their own sessions, real loopback HTTP, the real bench, smoke test,
trace and daemon as subprocesses), over two commands that share the run's state.

The load is the tiny seeded pair's two prompt families (written by the seeded pair's own
generator, benchmarks/gpu/seeded/datasets.py, from the tiny plan), served as --dataset and
--trace-datasets: the stand-ins load no model, so the prompt families are the part of the
pair that reaches them, and building the pair itself trains a head for minutes on a CPU
(tests/sglang/test_real_seeded_build.py builds it).

What the simulator cannot show: SGLang's log lines (it writes none, so both counts are 0),
GPU memory (no nvidia-smi here) and real greedy numerics (its output ids depend on the prompt
only). Those are the GPU run's to measure.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from ports import free_ports

from benchmarks.gpu import harness
from benchmarks.gpu.procs import pid_alive
from benchmarks.gpu.seeded.datasets import family_rows, write_family
from benchmarks.gpu.seeded.plan import SEEDED_TINY, make_plan
from benchmarks.gpu.steps import order


def _families(folder: Path) -> dict[str, Path]:
    plan = make_plan(SEEDED_TINY, 0)
    out = {}
    for family in ("a", "b"):
        out[family] = folder / f"family_{family}.jsonl"
        write_family(out[family], family_rows(plan, family, 64, 12, 16, seed=0))
    return out


def _state(run_dir: Path) -> dict:
    return json.loads((run_dir / "state.json").read_text())


# A real `specctl bench` of the seeded pair on an H200, checked in.
REAL_BENCH = (Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "gpu"
              / "h200-sglang-0.5.17-seeded-8b-run8" / "bench_family")  # fmt: skip


@pytest.mark.slow
def test_every_step_through_the_entry_over_two_commands(tmp_path, capsys):
    run_dir = tmp_path / "run"
    fam = _families(tmp_path)
    spec_port, plain_port = free_ports(2)
    first = [
        sys.executable, "-m", "benchmarks.gpu", "setup", "acceptance", "check", "bench",
        "parity", "--run-dir", str(run_dir), "--out-tar", str(tmp_path / "one.tar.gz"),
        "--tiny", "--backend", "sim", "--sim-speedup", "100",
        "--spec-port", str(spec_port), "--plain-port", str(plain_port),
        "--dataset", str(fam["a"]), "--trace-datasets", f"a={fam['a']},b={fam['b']}",
        "--acceptance-depths", "1,3", "--acceptance-requests", "4",
        "--acceptance-concurrency", "2", "--acceptance-off-spell", "4",
        "--smoke-seconds", "0.5", "--greedy-prompts", "2", "--greedy-tokens", "16",
        "--switches", "20", "--switch-probe-every", "10", "--switch-load", "2",
        "--switch-interval", "0.01", "--bench-concurrency", "2", "--bench-depths", "0,3",
        "--bench-families", "b", "--level-seconds", "0.5", "--warmup-seconds", "0.1",
        "--client-processes", "1",
        "--output-tokens", "16", "--parity-streams", "1,4", "--parity-series", "2",
        "--output-spread", "8:24", "--fresh-prompts", "200",
        "--trace-policies", "static:3 bench-table daemon-from-bench plain", "--trace-repeats", "2",
        "--trace-bench", str(REAL_BENCH),
        "--trace-phases", "1:2:a,1:4:b",
        "--daemon-seconds", "12", "--daemon-segment", "2",
    ]  # fmt: skip
    done = subprocess.run(first, capture_output=True, text=True, timeout=240)
    state = _state(run_dir)
    failed = {k: v["error"] for k, v in state["steps"].items() if v["status"] != "ok"}
    assert done.returncode == 0 and not failed, (failed, done.stdout[-3000:], done.stderr)
    for step in ("setup", "acceptance", "check", "bench", "parity"):
        assert f"== step {step}: ok in " in done.stdout
    servers = {role: s["pid"] for role, s in state["servers"].items()}
    try:
        # The second command finds both servers up: no warm pass again, the series numbered
        # on and judged with the first two, then the trace, the daemon, and both stopped.
        code = harness.main(["parity", "trace", "daemon", "summary", "stop", "--run-dir",
                             str(run_dir), "--parity-series", "1",
                             "--out-tar", str(tmp_path / "two.tar.gz")])
    finally:
        for pid in servers.values():
            if pid_alive(pid):
                harness.main(["stop", "--run-dir", str(run_dir)])
                break
    out = capsys.readouterr().out
    state = _state(run_dir)
    failed = {k: v["error"] for k, v in state["steps"].items() if v["status"] != "ok"}
    assert code == 0 and not failed, (failed, out[-3000:])
    # every step but `compare`, which needs SGLang's client (tests/test_gpu_compare_clients.py),
    # `shapes`, which stops both servers to run its own (tests/test_gpu_harness_shapes.py), and
    # `treeswitch`, which needs SGLang's draft shapes (tests/test_gpu_treeswitch.py)
    assert list(state["steps"]) == [s for s in order()
                                    if s not in ("compare", "shapes", "treeswitch")]
    assert {r: s["pid"] for r, s in state["servers"].items()} == servers
    assert not any(pid_alive(p) for p in servers.values())
    assert "warmed and frozen by an earlier parity command" in out

    steps = json.loads((run_dir / "summary.json").read_text())["steps"]
    setup = steps["setup"]["result"]
    assert setup["server_info"]["spec"]["max_running_requests"]
    assert state["machine"]["cpus"] >= 1 and (run_dir / "cpu_topology.txt").is_file()
    if shutil.which("nvidia-smi") is None:
        assert state["machine"]["gpus"] is None  # not read is not "no GPU"
    assert state["servers"]["spec"]["env"] == {}  # the stand-ins take no plugin settings
    assert state["servers"]["plain"]["env"] == {"SGLANG_PLUGINS": "none"}
    accepted = steps["acceptance"]["result"]
    assert set(accepted["families"]["family_a"]["accept_length"]) == {"1", "3"}
    assert accepted["off_spell"]["off_tokens"] == 4
    check = steps["check"]["result"]
    assert check["smoke"]["result"].endswith(" 0 failed")
    assert [c["mode"] for c in check["greedy"]["comparisons"]] == [
        "plain-again", "spec-switching", "spec-d3"]
    assert check["switch"]["pushes_sent"] == 20 and check["switch"]["failures"] == 0
    bench = steps["bench"]["result"]
    assert bench["levels"] == bench["levels_planned"] == 3 and bench["folder"] == "bench"
    assert set(bench["tok_per_s"]) == {"d0 c=2", "d3 c=2", "no-spec c=2"}
    # --bench-families b: the same levels on family b, into their own folder
    family_b = bench["families"]["b"]
    assert family_b["folder"] == "bench_b" and family_b["dataset"] == str(fam["b"])
    assert set(family_b["tok_per_s"]) == set(bench["tok_per_s"])
    assert json.loads((run_dir / "bench_b/bench.json").read_text())["results"]

    # parity: the warm pass once, three series in two commands, the order alternating
    parity = steps["parity"]["result"]
    assert [s["series"] for s in parity["series"]] == [3] and "warm" not in parity
    orders = [json.loads((run_dir / f"parity/series_{n}/bench.json").read_text())
              ["paired_order"] for n in (1, 2, 3)]
    assert orders == ["spec-first", "plain-first", "spec-first"]
    # each series its own draw of prompts, the warm pass another
    assert parity["series"][0]["seed"] == 3
    assert sorted(p.name for p in (run_dir / "prompts").glob("draw_*.jsonl")) == [
        "draw_1.jsonl", "draw_1000.jsonl", "draw_2.jsonl", "draw_3.jsonl"]
    verdict = parity["verdict"]
    assert verdict["series_judged"] == 3
    assert [v["concurrency"] for v in verdict["levels"]] == [1, 4]
    assert all(v["runs"] == 3 and v["interval"] is not None for v in verdict["levels"])
    assert "d0 against the plain server over 3 bench runs" in (
        run_dir / "parity/parity.txt").read_text()

    # the trace: each policy twice, the second repeat in reverse order, from the run's bench;
    # the bench's table is static:3's (1+: d3), so bench-table is not run again
    trace = steps["trace"]["result"]
    assert list(trace["policies"]) == [
        "static-3-r1", "daemon-from-bench-r1", "plain-r1",
        "plain-r2", "daemon-from-bench-r2", "static-3-r2"]  # fmt: skip
    assert trace["same_runs"] == {"bench-table": "static:3"}
    assert all(p["tok_per_s"] > 0 for p in trace["policies"].values())
    assert "| plain-r2 |" in (run_dir / "trace/compare.md").read_text()
    closed = json.loads((run_dir / "trace/closed_loop.json").read_text())
    assert set(closed["policies"]) == {"static:3", "bench-table", "daemon-from-bench", "plain"}
    assert closed["policies"]["bench-table"] == closed["policies"]["static:3"]
    assert closed["same_runs"] == {"bench-table": "static:3"}
    assert closed["policies"]["plain"] == [trace["policies"]["plain-r1"]["tok_per_s"],
                                           trace["policies"]["plain-r2"]["tok_per_s"]]
    assert closed["trace"] == "trace.json" and (run_dir / "trace/trace.json").is_file()
    # every run in order, with its latency figures; the daemon's with its pushes
    assert [r["policy"] for r in closed["runs"]] == [
        "static:3", "daemon-from-bench", "plain", "plain", "daemon-from-bench", "static:3"]
    assert all(r["tpot_p99_ms"] > 0 and r["ttft_p99_ms"] > 0 for r in closed["runs"])
    assert ["pushes" in r for r in closed["runs"]] == [False, True, False, False, True, False]
    assert closed["runs"][0]["final_table"] == "1+: d3"
    # the done-when with the trace's own noise: the daemon against the best static and the
    # bench's table, which share their runs (counted once in the spread)
    best, frozen = closed["criterion"]
    assert best["daemon"] == frozen["daemon"] == "daemon-from-bench"
    assert best["against"] == "static:3 (best static)" and frozen["against"] == "bench-table"
    assert frozen["ratio"] == best["ratio"] and frozen["low"] == best["low"]
    assert best["low"] <= best["ratio"] <= best["high"]
    criterion_md = (run_dir / "trace/criterion.md").read_text()
    assert "| daemon-from-bench | bench-table |" in criterion_md, criterion_md
    assert "bench-table's runs are static:3's" in criterion_md, criterion_md
    assert not (run_dir / "trace/bench-table-r1.json").exists()
    seeded = json.loads((run_dir / "trace/daemon-from-bench-r2.json").read_text())
    assert seeded["daemon"]["seed_bench"] == str(REAL_BENCH)
    daemon = steps["daemon"]["result"]
    assert daemon["samples_stored"] > 0, (daemon, (run_dir / "daemon/daemon.log").read_text())
    text = (run_dir / "summary.md").read_text()
    for line in ("| parity | ok |", "| trace | ok |", "## The plugin (/server_info)",
                 "| 1 | ", "GPU: "):
        assert line in text, (line, text)
    with tarfile.open(tmp_path / "two.tar.gz") as tar:
        names = set(tar.getnames())
        manifest = tar.extractfile("run/MANIFEST.txt").read().decode()  # type: ignore[union-attr]
    assert {"run/summary.md", "run/state.json", "run/parity/parity.txt",
            "run/parity/series_3/bench.json", "run/trace/compare.md"} <= names
    assert not any(n.startswith("run/prompts/") for n in names)
    assert "prompts/draw_1.jsonl" in manifest

    # After `stop`, a step that needs the servers fails and says what to run; the summary
    # still comes; a budget too short for any step skips them.
    assert harness.main(["check", "--run-dir", str(run_dir)]) == 1
    assert "run the `setup` step" in _state(run_dir)["steps"]["check"]["error"]
    assert harness.main(["bench", "summary", "--run-dir", str(run_dir), "--budget", "50"]) == 1
    state = _state(run_dir)
    assert state["steps"]["bench"]["status"] == "skipped", state["steps"]["bench"]
    assert state["steps"]["summary"]["status"] == "ok" and "budget" not in state["options"]


@pytest.mark.slow
def test_a_later_setup_reuses_a_server_only_if_its_launch_is_the_same(tmp_path, capsys):
    """`setup` again with the same options finds both servers up and keeps them; with the
    plugin asked into the plain server its environment differs, so that server alone is
    restarted (real `specctl sim serve` processes)."""
    run_dir = tmp_path / "run"
    spec_port, plain_port = free_ports(2)
    base = ["--run-dir", str(run_dir), "--backend", "sim", "--tiny", "--spec-port",
            str(spec_port), "--plain-port", str(plain_port)]  # fmt: skip
    try:
        assert harness.main(["setup", *base]) == 0
        first = _state(run_dir)["servers"]
        assert first["plain"]["env"] == {"SGLANG_PLUGINS": "none"}
        assert harness.main(["setup", *base]) == 0
        assert capsys.readouterr().out.count("already up") == 2
        assert harness.main(["setup", *base, "--plain-with-plugin"]) == 0
        out = capsys.readouterr().out
        now = _state(run_dir)["servers"]
        assert "spec: already up" in out and "plain: stopping the old server" in out
        assert now["spec"]["pid"] == first["spec"]["pid"]
        assert now["plain"]["pid"] != first["plain"]["pid"] and now["plain"]["env"] == {}
    finally:
        harness.main(["stop", "--run-dir", str(run_dir)])


@pytest.mark.slow
def test_the_speculative_server_alone_benches_without_the_plain_one(tmp_path, capsys):
    """`--start-order spec`: setup starts one server (real `specctl sim serve`), and stops
    the plain server an earlier setup started; the bench runs its depths without the plain
    server's series; a step that needs the plain server fails and names the start order that
    starts it."""
    run_dir = tmp_path / "run"
    spec_port, plain_port = free_ports(2)
    base = ["--run-dir", str(run_dir), "--backend", "sim", "--tiny", "--sim-speedup", "20",
            "--spec-port", str(spec_port), "--plain-port", str(plain_port)]  # fmt: skip
    try:
        assert harness.main(["setup", *base]) == 0
        plain_pid = int(_state(run_dir)["servers"]["plain"]["pid"])
        base += ["--start-order", "spec"]
        assert harness.main(["setup", "bench", *base]) == 0
        assert list(_state(run_dir)["servers"]) == ["spec"]
        assert not pid_alive(plain_pid)
        bench = json.loads((run_dir / "bench/bench.json").read_text())
        assert bench["no_spec_url"] is None
        series = {r["series"] for r in bench["results"]}
        assert "d0" in series and "no-spec" not in series  # the tiny preset's depths only
        assert harness.main(["parity", "--run-dir", str(run_dir)]) == 1
        error = _state(run_dir)["steps"]["parity"]["error"]
        assert "no plain server" in error and "--start-order spec,plain" in error
    finally:
        harness.main(["stop", "--run-dir", str(run_dir)])
