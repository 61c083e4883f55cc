"""The harness's `shapes` step end to end on CPU through its entry, `python -m benchmarks.gpu`:
each draft shape starts its own server in turn, benches it with
`python -m benchmarks.gpu.shape_bench` (a real subprocess, real loopback HTTP, the real
`sweep_as_is`), stops it, and the report is written over what the folders hold.

The servers are stand-ins: `specctl sim serve` processes (real subprocesses in their own
sessions), a speculative one for each chain or tree and a plain one for `plain`. The shape's
own flags (steps, topk, draft tokens, attention backend) do not reach a stand-in, so the two
speculative shapes serve alike and the figures say nothing about trees against chains: what
is tested is the step's plumbing (folders, levels, the report, the summary, the servers
stopped, shapes measured once per run folder, the --budget). The load is the tiny seeded
pair's family a, given as --dataset: with no seeded build, the step benches the run's prompts
as one family named "prompts".
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ports import free_ports

from benchmarks.gpu import harness
from benchmarks.gpu.procs import pid_alive, session_pids
from benchmarks.gpu.seeded.datasets import family_rows, write_family
from benchmarks.gpu.seeded.plan import SEEDED_TINY, make_plan

SHAPES = ("plain", "3x1x4", "2x2x4")




def _family(folder: Path) -> Path:
    path = folder / "family_a.jsonl"
    write_family(path, family_rows(make_plan(SEEDED_TINY, 0), "a", 64, 12, 16, seed=0))
    return path


def _state(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "state.json").read_text())


@pytest.mark.slow
def test_every_shape_benched_alone_then_measured_once_per_run_folder(tmp_path, capsys):
    run_dir = tmp_path / "run"
    spec_port, plain_port = free_ports(2)
    argv = [
        sys.executable, "-m", "benchmarks.gpu", "setup", "shapes", "summary", "stop",
        "--tiny", "--backend", "sim", "--sim-speedup", "20", "--run-dir", str(run_dir),
        "--no-setup-servers", "--spec-port", str(spec_port), "--plain-port", str(plain_port),
        "--level-seconds", "0.5", "--warmup-seconds", "0.1", "--client-processes", "1",
        "--shape-streams", "1,4", "--shapes", ",".join(SHAPES),
        "--dataset", str(_family(tmp_path)),
    ]  # fmt: skip
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=240)
    finally:
        if (run_dir / "state.json").is_file():
            pid = _state(run_dir)["servers"].get("shape", {}).get("pid")
            if pid is not None and pid_alive(pid):
                harness.main(["stop", "--run-dir", str(run_dir)])
    state = _state(run_dir)
    failed = {k: v.get("error") for k, v in state["steps"].items() if v["status"] != "ok"}
    assert done.returncode == 0 and not failed, (failed, done.stdout[-3000:], done.stderr)
    assert list(state["steps"]) == ["setup", "shapes", "summary", "stop"]
    assert "servers not started (--no-setup-servers)" in done.stdout
    # the one server of the step, the last shape's, stopped with its whole session
    assert list(state["servers"]) == ["shape"]
    shape_pid = state["servers"]["shape"]["pid"]
    assert not pid_alive(shape_pid) and not session_pids(shape_pid)
    assert state["servers"]["shape"]["url"] == f"http://127.0.0.1:{spec_port}"

    out = run_dir / "shapes"
    result = state["steps"]["shapes"]["result"]
    assert list(result["shapes"]) == list(SHAPES) and result["families"] == ["prompts"]
    assert result["streams"] == "1,4" and result["stopped"] == {}
    assert "cut_by_budget" not in result
    for name in SHAPES:
        entry = result["shapes"][name]
        assert entry["stopped"] == "stopped" and entry["attempts"] == [], entry
        assert entry["families"]["prompts"]["returncode"] == 0
        assert entry["start_seconds"] > 0 and (out / name / "server_info.json").is_file()
        doc = json.loads((out / name / "prompts.json").read_text())
        assert doc["series"] == name
        # every shape is sent the same requests, drawn once
        assert doc["dataset"] == str(out / "prompts" / "prompts.jsonl")
        levels = {lv["concurrency"]: lv for lv in doc["levels"]}
        assert sorted(levels) == [1, 4], name
        for streams, level in levels.items():
            assert level["series"] == name and level["depth"] is None
            assert level["output_tok_per_s"] > 0 and level["requests"] > 0, (name, streams)
            assert level["errors"] == 0
            assert isinstance(level["flags"], list)  # the bench's verdict on the level, kept
            if name == "plain":
                assert level["accept_length"] is None
            else:
                assert level["accept_length"] > 1.0, (name, streams)
    # a plain stand-in for `plain`, speculative ones for the chain and the tree
    logs = {name: (run_dir / "logs" / f"shape_{name}.log").read_text() for name in SHAPES}
    assert "--no-speculative" in logs["plain"]
    assert "--no-speculative" not in logs["3x1x4"] + logs["2x2x4"]
    drawn = [json.loads(line) for line in
             (out / "prompts" / "prompts.jsonl").read_text().splitlines()]
    assert drawn and all(16 <= r["output_tokens"] <= 48 for r in drawn)  # --tiny: 16:48

    verdict = result["verdict"]
    report = json.loads((out / "shapes.json").read_text())["analysis"]
    assert report["verdict"] == verdict and report["shapes"] == list(SHAPES)
    assert result["tree_wins"] == report["tree_wins"]
    # A level the bench flagged (on this shared two-core machine, a client-bound one, say)
    # decides nothing; every other names its best chain and tree.
    figures = json.loads((out / "shapes.json").read_text())["figures"]
    for lv in report["families"]["prompts"]["levels"]:
        levels = {name: figures[name]["prompts"][str(lv["streams"])] for name in SHAPES}
        chain = None if levels["3x1x4"]["flags"] else "3x1x4"
        tree = None if levels["2x2x4"]["flags"] else "2x2x4"
        assert (lv["best_chain"], lv["best_tree"]) == (chain, tree), (lv, levels)
    assert [lv["streams"] for lv in report["families"]["prompts"]["levels"]] == [1, 4]
    text = (out / "shapes.txt").read_text()
    assert text.endswith(f"verdict: {verdict}\n")
    assert all(f"\n{name} " in text for name in SHAPES)
    assert f"verdict: {verdict} (shapes/shapes.txt)" in done.stdout
    summary = (run_dir / "summary.md").read_text()
    assert "## shapes" in summary and f"Verdict: {verdict}" in summary
    assert "| 2x2x4 | fa3 |" in summary and "| shapes | ok |" in summary

    # A later command finds every shape measured: no server started, the report rewritten.
    assert harness.main(["shapes", "--run-dir", str(run_dir)]) == 0
    printed = capsys.readouterr().out
    for name in SHAPES:
        assert f"  {name}: measured by an earlier command" in printed
    again = _state(run_dir)
    assert again["servers"]["shape"] == state["servers"]["shape"]
    assert again["steps"]["shapes"]["result"]["shapes"] == result["shapes"]
    assert again["steps"]["shapes"]["result"]["verdict"] == verdict


@pytest.mark.slow
def test_the_shapes_stop_the_run_s_servers_and_keep_to_the_budget(tmp_path, capsys):
    """With both servers of `setup` up, `shapes` stops them first (the shapes take the GPU);
    a --budget that cannot hold a shape's start (150 s guessed before one is timed) leaves
    every shape to a later command instead of starting one."""
    run_dir = tmp_path / "run"
    spec_port, plain_port = free_ports(2)
    base = ["--run-dir", str(run_dir), "--backend", "sim", "--tiny", "--spec-port",
            str(spec_port), "--plain-port", str(plain_port), "--dataset",
            str(_family(tmp_path))]  # fmt: skip
    try:
        assert harness.main(["setup", *base]) == 0
        started = {role: s["pid"] for role, s in _state(run_dir)["servers"].items()}
        assert sorted(started) == ["plain", "spec"] and all(map(pid_alive, started.values()))
        capsys.readouterr()
        assert harness.main(["shapes", "--run-dir", str(run_dir), "--budget", "100"]) == 0
    finally:
        harness.main(["stop", "--run-dir", str(run_dir)])
    printed = capsys.readouterr().out
    state = _state(run_dir)
    assert not any(pid_alive(p) for p in started.values())
    assert "shape" not in state["servers"]  # none started
    result = state["steps"]["shapes"]["result"]
    assert result["stopped"] == {"spec": "stopped", "plain": "stopped"}
    assert result["cut_by_budget"].startswith("plain and the shapes after it left for a later "
                                              "command")
    assert result["cut_by_budget"] in printed and result["shapes"] == {}
    assert result["verdict"] == "no tree shape measured"
    assert not list((run_dir / "shapes").glob("*/*.json"))
    assert (run_dir / "shapes" / "prompts" / "prompts.jsonl").is_file()  # drawn already
