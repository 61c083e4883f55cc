"""The harness's `treeswitch` step end to end on CPU through its entry, `python -m
benchmarks.gpu`: the shape server started with the plugin's shapes, each shape held and benched,
the held benches' table pushed and benched against the best held shape, greedy passes while
the shapes switch until the switches asked, the stress, the plain server's reference and a
stock server, every server stopped; and with plain among the shapes, off held, tabled where it
is best and traced on the kept server.

The servers are stand-ins: `specctl sim serve` processes (real subprocesses in their own
sessions, real loopback HTTP), the shape server a simulated one (`--shapes`) of the profile
fitted to run 30's real bench of shapes. What the simulator cannot show: greedy numerics (its
output ids depend on the prompt only, so every pass is identical), GPU memory, the capture's
time and memory. Those are the GPU run's to measure.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from ports import free_ports

from benchmarks.gpu import harness
from benchmarks.gpu.procs import pid_alive, session_pids
from benchmarks.gpu.seeded.datasets import family_rows, write_family
from benchmarks.gpu.seeded.plan import SEEDED_TINY, make_plan
from controller.bench.level_flags import level_flags

PROFILE = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "shape_sim_run30.yaml"


@pytest.mark.slow
def test_the_treeswitch_step_on_a_simulated_shape_server(tmp_path: Path) -> None:
    family = tmp_path / "family_a.jsonl"
    write_family(family, family_rows(make_plan(SEEDED_TINY, 0), "a", 64, 12, 16, seed=0))
    run_dir = tmp_path / "run"
    spec_port, plain_port = free_ports(2)
    argv = [
        sys.executable, "-m", "benchmarks.gpu", "setup", "treeswitch", "summary", "stop",
        "--tiny", "--backend", "sim", "--sim-speedup", "2", "--sim-profile", str(PROFILE),
        "--run-dir", str(run_dir), "--no-setup-servers", "--spec-port", str(spec_port),
        "--plain-port", str(plain_port), "--level-seconds", "1", "--warmup-seconds", "0.2",
        "--client-processes", "1", "--switch-streams", "1,4", "--switch-stress-streams", "4",
        "--switch-stress-seconds", "2", "--switch-greedy-switches", "100",
        "--dataset", str(family),
    ]  # fmt: skip
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=240)
    finally:
        state_file = run_dir / "state.json"
        if state_file.is_file():
            pid = json.loads(state_file.read_text())["servers"].get("shape", {}).get("pid")
            if pid is not None and pid_alive(pid):
                harness.main(["stop", "--run-dir", str(run_dir)])
    state = json.loads((run_dir / "state.json").read_text())
    failed = {k: v.get("error") for k, v in state["steps"].items() if v["status"] != "ok"}
    assert done.returncode == 0 and not failed, (failed, done.stdout[-3000:], done.stderr)
    shape_pid = state["servers"]["shape"]["pid"]
    assert not pid_alive(shape_pid) and not session_pids(shape_pid)

    result = state["steps"]["treeswitch"]["result"]
    assert result["startup"] == "3x4x16" and result["captured"] == ["3x1x4"]
    assert set(result["shape_server"]["shapes"]["captured"]) == {"3x4x16", "3x1x4"}
    out = run_dir / "treeswitch"
    logs = (run_dir / "logs" / "treeswitch_3x4x16_plugin.log").read_text()
    assert "--shapes 3x4x16,3x1x4" in logs
    # each shape held, its bench beside the server's answer (what `sim fit --shapes` reads)
    for shape, accept in (("3x4x16", 3.5), ("3x1x4", 2.5)):
        doc = json.loads((out / "held" / shape / "prompts.json").read_text())
        assert [lv["concurrency"] for lv in doc["levels"]] == [1, 4]
        # the tree's accept length from its own series, the chain's from its depth's
        assert all(lv["accept_length"] > accept for lv in doc["levels"]), (shape, doc["levels"])
        assert (out / "held" / shape / "server_info.json").is_file()
    # the held benches' table, pushed and benched against the best held shape where the bench
    # scored every level (a client-bound level on a busy machine decides nothing)
    table = result["held_tables"]["prompts"]
    if table is not None:
        rows = result["table_vs_best"]["prompts"]
        assert [r["streams"] for r in rows] == [1, 4]
        assert all(r["ratio"] is None or r["ratio"] > 0.5 for r in rows), rows
    # switches at batch 1 until the switches asked, every pass identical to plain
    assert result["greedy_switches"] >= 100
    assert all(row["flips"] == 0 for row in result["greedy"].values()), result["greedy"]
    assert {"held 3x4x16", "held 3x1x4", "switching 1"} <= set(result["greedy"])
    stress = result["stress"]
    assert stress["switches"] > 0 and stress["errors"] == 0 and stress["healthy_after"]
    assert result["stock"]["3x1x4"]["greedy"]["flips"] == 0
    assert result["after_release"]["live"] in {"3x4x16", "3x1x4"}
    assert "| treeswitch | ok |" in (run_dir / "summary.md").read_text()

    # The greedy passes alone against this run's plain outputs: no plain server started, no
    # bench, stress or stock server (what a GPU session short of time runs)
    reference = tmp_path / "reference.json"
    reference.write_text((out / "reference.json").read_text())
    again = ["treeswitch", "--run-dir", str(run_dir), "--switch-greedy-only",
             "--switch-reference", str(reference), "--switch-greedy-switches", "50"]
    assert harness.main(again) == 0, json.loads((run_dir / "state.json").read_text())
    only = json.loads((run_dir / "state.json").read_text())["steps"]["treeswitch"]["result"]
    assert only["reference"] == str(reference) and "plain_start_s" not in only
    assert "held_bench" not in only and "stress" not in only and "stock" not in only
    assert only["greedy_switches"] >= 50
    assert all(row["flips"] == 0 for row in only["greedy"].values()), only["greedy"]
    reference.write_text("[[1, 2]]")
    assert harness.main(again) == 1
    error = json.loads((run_dir / "state.json").read_text())["steps"]["treeswitch"]["error"]
    assert "--switch-reference" in error and "not 8 lists of token ids" in error, error
    assert "shape_server" not in (json.loads((run_dir / "state.json").read_text())["steps"]
                                  ["treeswitch"].get("result") or {})  # nothing started

    # The closed loop on a shape server (`--spec-shapes`): each shape held, and the held
    # benches' table, over the same trace of loads
    table_file = out / "held" / "table_prompts.json"
    if not table_file.is_file():
        pytest.skip("no held table: a held level was flagged on this busy machine")
    second = [
        "setup", "trace", "stop", "--run-dir", str(run_dir), "--setup-servers",
        "--spec-shapes", "3x4x16,3x1x4", "--start-order", "spec",
        "--trace-bench", str(table_file), "--trace-datasets", f"a={family}",
        "--trace-policies", "static:3x4x16 static:3 bench-table", "--trace-phases", "2:1:a,2:4:a",
        "--trace-repeats", "1",
    ]  # fmt: skip
    try:
        code = harness.main(second)
    finally:
        harness.main(["stop", "--run-dir", str(run_dir)])
    state = json.loads((run_dir / "state.json").read_text())
    assert code == 0, state["steps"]["trace"]
    spec_log = (run_dir / "logs" / "spec.log").read_text()
    assert "--shapes 3x4x16,3x1x4" in spec_log
    closed = json.loads((run_dir / "trace" / "closed_loop.json").read_text())
    assert set(closed["policies"]) == {"static:3x4x16", "static:3", "bench-table"}
    assert all(runs[0] > 0 for runs in closed["policies"].values()), closed["policies"]
    # the table is run unless it is one of the statics (the chain winning at both loads)
    ran = [r["policy"] for r in closed["runs"]]
    same = closed.get("same_runs") or {}
    assert ran == ["static:3x4x16", "static:3"] + ([] if "bench-table" in same
                                                    else ["bench-table"]), (ran, same)

    # The closed loop on the treeswitch step's own shape server, kept up for the trace
    # (--switch-keep-server): no second start of the server whose held benches made the table
    third = [
        "treeswitch", "trace", "stop", "--run-dir", str(run_dir), "--switch-greedy-only",
        "--switch-reference", str(out / "reference.json"), "--switch-greedy-switches", "20",
        "--switch-bench-shapes", "", "--switch-keep-server", "--trace-phases", "2:1:a",
    ]  # fmt: skip
    try:
        code = harness.main(third)
    finally:
        harness.main(["stop", "--run-dir", str(run_dir)])
    state = json.loads((run_dir / "state.json").read_text())
    assert code == 0, (state["steps"]["treeswitch"], state["steps"]["trace"])
    kept = state["steps"]["treeswitch"]["result"]
    assert kept["kept_as"] == "spec" and "shape_server_stopped" not in kept
    server = state["servers"]["spec"]
    assert "--shapes 3x4x16,3x1x4" in " ".join(server["argv"]) and "shape" not in state["servers"]
    assert not pid_alive(server["pid"]) and "stopped" in server
    closed = json.loads((run_dir / "trace" / "closed_loop.json").read_text())
    assert set(closed["policies"]) == {"static:3x4x16", "static:3", "bench-table"}, closed
    for r in closed["runs"]:  # every run of this trace against the kept server
        doc = json.loads((run_dir / "trace" / f"{r['name']}.json").read_text())
        assert doc["url"] == server["url"] and r["tok_per_s"] > 0, (r, doc["url"])
    # the kept server refuses to be the GPU's only server where another must start after it
    assert harness.main(["treeswitch", "--run-dir", str(run_dir),
                         "--switch-bench-shapes", "3x1x4"]) == 2


def crossover_profile(path: Path) -> Path:
    """Run 30's profile serving family b's acceptance (its requests' phase is the shapes' first)
    with the target's compute per token x16: b's crossover to plain moves from 88 streams down
    to 7 (`specctl sim shapes --phase b`, 16-token outputs: 3x4x16 1.2 times the chain at 1
    stream, plain 1.4 times the chain at 16). Slow steps keep plain's token stream, one
    token a step, within what a busy two-core machine's client and server deliver."""
    doc = yaml.safe_load(PROFILE.read_text())
    doc["target"]["compute_us_per_token"] *= 16
    for cost in doc["shapes"].values():
        if cost.get("accept_length"):
            cost["accept_length"] = {"b": cost["accept_length"].pop("b"), **cost["accept_length"]}
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.mark.slow
def test_plain_on_the_shape_server_is_held_tabled_and_traced_on_the_kept_server(
    tmp_path: Path,
) -> None:
    """`--switch-shapes 3x4x16,3x1x4,plain`: off captured beside the tree, held as an off tier,
    benched and greedy-checked like the other shapes and probed while switching; the held
    table gets an off tier where plain is best; the kept server runs the trace's bench-table
    (that table) and static:0 (off held)."""
    family = tmp_path / "family_b.jsonl"
    write_family(family, family_rows(make_plan(SEEDED_TINY, 0), "b", 64, 12, 16, seed=0))
    run_dir = tmp_path / "run"
    spec_port, plain_port = free_ports(2)
    shapes = "3x4x16,3x1x4,plain"
    common = [
        "--run-dir", str(run_dir), "--tiny", "--backend", "sim", "--sim-speedup", "0.35",
        "--sim-profile", str(crossover_profile(tmp_path / "profile.yaml")),
        "--no-setup-servers", "--spec-port", str(spec_port), "--plain-port", str(plain_port),
        "--dataset", str(family), "--switch-shapes", shapes, "--spec-shapes", shapes,
        "--switch-greedy-prompts", "4", "--greedy-tokens", "32", "--switch-bench-shapes", "",
    ]  # fmt: skip
    # the plain server's greedy outputs first, as an earlier run's reference.json
    try:
        assert harness.main(["setup", "treeswitch", *common, "--switch-greedy-only",
                             "--switch-greedy-switches", "10"]) == 0
        out = run_dir / "treeswitch"
        reference = tmp_path / "reference.json"
        reference.write_text((out / "reference.json").read_text())
        code = harness.main([
            "treeswitch", "trace", "stop", "--run-dir", str(run_dir), "--no-switch-greedy-only",
            "--switch-reference", str(reference), "--switch-keep-server",
            "--level-seconds", "4", "--warmup-seconds", "0.5", "--client-processes", "1",
            "--switch-streams", "1,16", "--switch-greedy-switches", "10",
            "--switch-stress-streams", "4", "--switch-stress-seconds", "1",
            "--trace-policies", "static:0 bench-table",
            "--trace-bench", str(out / "held" / "table_prompts.json"),
            "--trace-datasets", f"b={family}", "--trace-phases", "2:1:b,2:16:b",
        ])  # fmt: skip
    finally:
        harness.main(["stop", "--run-dir", str(run_dir)])
    state = json.loads((run_dir / "state.json").read_text())
    result = state["steps"]["treeswitch"]["result"]
    assert code == 0, (result, state["steps"]["trace"])
    assert result["startup"] == "3x4x16" and result["captured"] == ["3x1x4", "plain"]
    assert set(result["shape_server"]["shapes"]["captured"]) == {"3x4x16", "3x1x4", "plain"}
    assert f"--shapes {shapes}" in " ".join(state["servers"]["spec"]["argv"])
    # plain held: an off tier benched, greedy-identical, in the held report
    doc = json.loads((out / "held" / "plain" / "prompts.json").read_text())
    assert [lv["concurrency"] for lv in doc["levels"]] == [1, 16]
    assert all(lv["accept_length"] == 1.0 for lv in doc["levels"]), doc["levels"]
    assert result["greedy"]["held plain"]["flips"] == 0
    assert all(row["flips"] == 0 for row in result["greedy"].values()), result["greedy"]
    assert result["stress"]["switches"] > 0 and result["stress"]["errors"] == 0
    # the tree at one stream, plain at 16: the table ends off
    line = result["held_tables"]["prompts"]
    flagged = [lv["concurrency"] for lv in doc["levels"] if level_flags(lv)]
    if line is None or flagged:  # a flagged level is left out of the table, as on the GPU
        pytest.skip(f"plain's levels at {flagged} streams were flagged on this busy machine")
    best = json.loads((out / "held" / "shapes.json").read_text())["analysis"]["families"]
    assert [lv["best"] for lv in best["prompts"]["levels"]] == ["3x4x16", "plain"], line
    assert line.startswith("1-") and line.endswith("+: off"), line
    tiers = json.loads((out / "held" / "table_prompts.json").read_text())["table"]["tiers"]
    assert tiers[-1]["depth"] == 0 and "topk" not in tiers[-1], tiers
    # the trace on the kept server: off held (static:0) and the table with its off tier
    closed = json.loads((run_dir / "trace" / "closed_loop.json").read_text())
    assert set(closed["policies"]) == {"static:0", "bench-table"}, closed
    assert all(runs[0] > 0 for runs in closed["policies"].values()), closed["policies"]
    server = state["servers"]["spec"]
    for r in closed["runs"]:
        run = json.loads((run_dir / "trace" / f"{r['name']}.json").read_text())
        assert run["url"] == server["url"], (r, run["url"])
    table_run = json.loads((run_dir / "trace" / "bench-table.json").read_text())
    assert table_run["table"] == line, table_run["table"]
