"""The harness's steps in parts, without servers: the parity step's order by series, its draws
of prompts, its verdict pooled over recorded series, the trace's policies, and that a step is
one function plus one entry in the registry (real files, the real `specctl sim serve` where a
server answers)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks.gpu import harness, steps
from benchmarks.gpu.context import Run, StepError
from benchmarks.gpu.options import Options
from benchmarks.gpu.state import RunState
from benchmarks.gpu.steps import bench, parity, trace

SPEC_URL, PLAIN_URL = "http://127.0.0.1:1", "http://127.0.0.1:2"  # nothing is sent there


def _run(tmp_path: Path, **options: object) -> Run:
    state = RunState(tmp_path / "run")
    state.servers.update(spec={"url": SPEC_URL, "pid": 1}, plain={"url": PLAIN_URL, "pid": 2})
    state.data["admin_key"] = "k"
    return Run(Options(backend="sim", **options), state)  # type: ignore[arg-type]


@pytest.mark.parametrize(("order", "plain_first_in"), [
    ("alternate", [2, 4]), ("spec-first", []), ("plain-first", [1, 2, 3, 4]),
])  # fmt: skip
def test_which_server_goes_first_follows_the_series_number(tmp_path, order, plain_first_in):
    run = _run(tmp_path, parity_order=order, parity_streams="1,64")
    dataset = tmp_path / "prompts.jsonl"
    for number in (1, 2, 3, 4):
        args = parity.series_args(run, number, dataset)
        assert ("--plain-first" in args) == (number in plain_first_in), (order, number)
        assert args[:5] == ["--depths", "0", "--no-spec-url", PLAIN_URL, "--paired"]
        assert args[args.index("--concurrency") + 1] == "1,64"
        # spread outputs: each request's own length, not --output-tokens
        assert "--output-tokens" not in args and args[-2:] == ["--dataset", str(dataset)]
    fixed = parity.series_args(_run(tmp_path, output_spread=""), 1, dataset)
    assert fixed[-2:] == ["--output-tokens", "128"]


def test_series_are_numbered_on_from_the_folder(tmp_path):
    out = tmp_path / "parity"
    assert parity.series_numbers(out) == []
    for name in ("series_1", "series_2", "series_10", "warm", "series_x"):
        (out / name).mkdir(parents=True)
    (out / "series_3.txt").write_text("a bench's output, not a series")
    assert parity.series_numbers(out) == [1, 2, 10]
    run = _run(tmp_path, parity_tag="swapped")
    assert parity.folder(run) == run.dir / "parity_swapped"
    assert parity.folder(_run(tmp_path)) == run.dir / "parity"


def test_a_later_bench_of_the_run_gets_a_folder_of_its_own(tmp_path):
    assert bench.fresh_folder(tmp_path / "bench") == tmp_path / "bench"
    (tmp_path / "bench").mkdir()
    assert bench.fresh_folder(tmp_path / "bench") == tmp_path / "bench_2"
    (tmp_path / "bench_2").mkdir()
    assert bench.fresh_folder(tmp_path / "bench") == tmp_path / "bench_3"


def test_each_draw_has_its_own_seed_fresh_prompts_and_spread_outputs(tmp_path):
    run = _run(tmp_path, fresh_prompts=50, output_spread="8:24")
    rows = [{"prompt": f"alpha beta gamma {i}", "output_tokens": 16} for i in range(10)]
    first, seed1 = parity.draw(run, rows, 1)
    again, seed2 = parity.draw(run, rows, 1)  # seed 1 is taken: the next free one
    warm, seed3 = parity.draw(run, rows, 1000)
    assert (seed1, seed2, seed3) == (1, 2, 1000)
    drawn = [[json.loads(x) for x in p.read_text().splitlines()] for p in (first, again, warm)]
    assert all(len(d) == 50 for d in drawn)
    assert all(8 <= r["output_tokens"] <= 24 for d in drawn for r in d)
    assert len({r["output_tokens"] for r in drawn[0]}) > 5
    assert {r["prompt"] for r in drawn[0]}.isdisjoint({r["prompt"] for r in drawn[1]})
    words = {w for r in rows for w in str(r["prompt"]).split()}
    assert all(set(r["prompt"].split()) <= words for r in drawn[0])


def _series(folder: Path, d0_tok_s: float, order: str, plain_tok_s: float = 100.0) -> None:
    """One paired series in `specctl bench`'s format (the fields parity reads), 10 s levels at
    1 and 4 streams."""
    def row(series: str, c: int, tok_s: float) -> dict[str, object]:
        return {"series": series, "depth": 0 if series == "d0" else None, "concurrency": c,
                "output_tok_per_s": tok_s, "elapsed_s": 10.0, "tpot_p50_ms": 5.0,
                "ttft_p50_ms": 20.0, "ttft_p99_ms": 30.0, "request_rate": None}

    folder.mkdir(parents=True)
    rows = [row(s, c, t) for c in (1, 4) for s, t in (("d0", d0_tok_s), ("no-spec", plain_tok_s))]
    (folder / "bench.json").write_text(json.dumps(
        {"format": 1, "paired": True, "paired_order": order, "results": rows}))


def test_the_verdict_pools_every_series_of_the_folder_and_weighs_both_orders(tmp_path):
    """Series 1-3 recorded by hand: depth 0 at 100, 90 and 95 tok/s against the plain server's
    100, the plain server first in series 2. Pooled: 285 / 300; with the orders weighed
    equally: the geometric mean of 195/200 (depth 0 first) and 90/100 (plain first)."""
    run = _run(tmp_path)
    out = run.dir / "parity"
    for number, tok_s in ((1, 100.0), (2, 90.0), (3, 95.0)):
        _series(out / f"series_{number}", tok_s,
                "plain-first" if parity.plain_first("alternate", number) else "spec-first")
    _series(out / "warm", 10.0, "spec-first")  # the warm pass is not judged
    got = parity.verdict(run, out)
    assert got["series_judged"] == 3
    assert [v["concurrency"] for v in got["levels"]] == [1, 4]
    for level in got["levels"]:
        assert level["pooled_ratio"] == pytest.approx(0.95)
        assert level["runs"] == 3
        low, high = level["interval"]
        assert 0.9 <= low < 0.95 < high <= 1.0
        assert level["orders_equal_ratio"] == pytest.approx(math.sqrt(0.975 * 0.9), abs=1e-4)
    text = (out / "parity.txt").read_text()
    assert text.startswith("d0 against the plain server over 3 bench runs")
    assert json.loads((out / "parity.json").read_text())["runs"] == [
        str(out / f"series_{n}") for n in (1, 2, 3)]


def test_a_verdict_without_series_or_over_broken_ones_names_the_problem(tmp_path):
    run = _run(tmp_path)
    out = run.dir / "parity"
    with pytest.raises(StepError, match=r"no series in .*parity to judge"):
        parity.verdict(run, out)
    (out / "series_1").mkdir(parents=True)
    (out / "series_1" / "bench.json").write_text("{not json")
    with pytest.raises(StepError, match=r"the verdict failed: error: .*series_1.*not a bench"):
        parity.verdict(run, out)


def test_trace_policies_map_to_runs_and_the_warm_daemon_needs_the_cold_ones_store(tmp_path):
    run = _run(tmp_path)
    out = run.dir / "trace"
    assert trace.policy_run("static:3", run, out) == ("static:3", SPEC_URL, "static-3", [])
    assert trace.policy_run("sglang", run, out) == ("sglang", SPEC_URL, "sglang", [])
    assert trace.policy_run("plain", run, out) == ("plain", PLAIN_URL, "plain", [])
    assert trace.policy_run("daemon", run, out) == ("daemon", SPEC_URL, "daemon-cold", [])
    with pytest.raises(StepError, match="put daemon before it in --trace-policies"):
        trace.policy_run("daemon-warm", run, out)
    out.mkdir(parents=True)
    (out / "daemon-cold.sqlite").write_bytes(b"")
    assert trace.policy_run("daemon-warm", run, out) == (
        "daemon", SPEC_URL, "daemon-warm", ["--daemon-store", str(out / "daemon-cold.sqlite")])


def test_a_daemon_trace_starts_on_the_bench_s_cores_and_the_daemon_s():
    """The trace run pins its daemon to --trace-daemon-cpus: a process can pin a child only
    to cores it may use itself, so the run starts on both sets (it keeps its load processes
    off the daemon's cores itself)."""
    assert trace.trace_cpus("12-15", "11") == "12-15,11"
    assert trace.trace_cpus("12-15", "") == "12-15"
    assert trace.trace_cpus("", "11") == ""  # unpinned: every core, the daemon's included


def test_a_run_s_label_names_its_policy_and_repeat():
    assert trace.policy_of("static-1-r2") == ("static:1", 2)
    assert trace.policy_of("daemon-from-bench") == ("daemon-from-bench", 1)
    assert trace.policy_of("daemon-cold-r3") == ("daemon", 3)
    assert trace.policy_of("sglang-r1") == ("sglang", 1)
    assert trace.policy_of("daemon-warm") == ("daemon-warm", 1)


def test_closed_loop_json_reports_every_run_of_the_trace_split_over_commands(tmp_path):
    """A trace step cut short and resumed by a second command: closed_loop.json lists the runs
    of both (in the order they ran), keeps the first command's shared runs, and leaves out runs
    of another trace in the same folder. The run documents are written here in the format
    `trace run` writes (benchmarks/gpu/seeded/trace.py); the real ones come from a GPU run."""
    run = _run(tmp_path, trace_phases="1:2:a,1:4:b")
    out = run.dir / "trace"
    out.mkdir(parents=True)
    phases = [{"name": "p1-2-a", "seconds": 1.0, "concurrency": 2, "dataset": "a"},
              {"name": "p2-4-b", "seconds": 1.0, "concurrency": 4, "dataset": "b"}]

    def write(label: str, started: float, tok_per_s: float, trace_phases: object = phases,
              daemon: bool = False) -> None:
        total = {"tok_per_s": tok_per_s, "tpot_p50_ms": 5.0, "tpot_p90_ms": 6.0,
                 "tpot_p99_ms": 7.0, "ttft_p99_ms": 9.0}
        doc = {"policy": "daemon" if daemon else label.rsplit("-r", 1)[0].replace("-", ":"),
               "name": label, "trace": trace_phases, "trace_started_unix": started,
               "phases": [], "total": total, "final_table": "1+: d1",
               **({"daemon": {"push_count": 4}} if daemon else {})}
        (out / f"{label}.json").write_text(json.dumps(doc))

    write("static-1-r1", 10.0, 100.0)
    write("static-1-r2", 40.0, 104.0)
    write("daemon-from-bench-r1", 20.0, 103.0, daemon=True)
    write("daemon-from-bench-r2", 30.0, 105.0, daemon=True)
    write("static-3-r1", 5.0, 90.0, trace_phases=phases[:1])  # another trace's run
    (out / "closed_loop.json").write_text(json.dumps({"phases": "1:2:a,1:4:b",
                                                      "same_runs": {"bench-table": "static:1"}}))
    doc = trace.closed_loop(run, {"prompts_from": "--trace-datasets"}, out)
    assert doc["policies"] == {"static:1": [100.0, 104.0], "daemon-from-bench": [103.0, 105.0],
                               "bench-table": [100.0, 104.0]}
    assert doc["order"] == ["static:1 (repeat 1)", "daemon-from-bench (repeat 1)",
                            "daemon-from-bench (repeat 2)", "static:1 (repeat 2)"]
    assert [r.get("pushes") for r in doc["runs"]] == [None, 4, 4, None]
    assert doc["same_runs"] == {"bench-table": "static:1"} and doc["repeats"] == 2
    assert {c["against"] for c in doc["criterion"]} == {"static:1 (best static)", "bench-table"}
    # an earlier trace of other phases in the folder: its shared runs are not this one's
    (out / "closed_loop.json").write_text(json.dumps({"phases": "9:2:a",
                                                      "same_runs": {"bench-table": "static:1"}}))
    assert "bench-table" not in trace.closed_loop(run, {"prompts_from": "x"}, out)["policies"]


def test_without_families_the_trace_runs_the_runs_prompts_under_every_name(tmp_path):
    run = _run(tmp_path, prompt_tokens=16)
    files, where = trace.datasets(run, {"a", "b"})
    assert files["a"] == files["b"] == run.dir / "prompts" / "synthetic_16.jsonl"
    assert len(files["a"].read_text().splitlines()) == 512 and "every name" in where
    given = _run(tmp_path, trace_datasets="a=fa.jsonl,b=fb.jsonl")
    assert trace.datasets(given, {"a", "b"}) == (
        {"a": Path("fa.jsonl"), "b": Path("fb.jsonl")}, "--trace-datasets")


def test_a_step_is_one_function_and_one_registry_entry(tmp_path, monkeypatch, capsys):
    """A step added to the registry runs in its place in the order, whatever order the
    command names it, and its result lands in state.json and the summary; one that fails
    records its error and the next step still runs."""
    seen: list[str] = []

    def compare(run: Run) -> dict[str, object]:
        seen.append("versus")
        return {"ratio": 1.0, "servers": sorted(run.state.servers)}

    def broken(run: Run) -> dict[str, object]:
        seen.append("broken")
        raise StepError("nothing to compare: run `bench` first", {"partial": True})

    added = (steps.Step("versus", compare, "a step added by one entry"),
             steps.Step("broken", broken, "fails", uses_servers=False))
    monkeypatch.setattr(steps, "STEPS", (*steps.STEPS[:4], *added, *steps.STEPS[4:]))
    run_dir = tmp_path / "run"
    assert harness.main(["summary", "broken", "versus", "--run-dir", str(run_dir),
                         "--backend", "sim"]) == 1
    assert seen == ["versus", "broken"]
    state = json.loads((run_dir / "state.json").read_text())
    assert list(state["steps"]) == ["versus", "broken", "summary"]
    assert state["steps"]["versus"]["result"] == {"ratio": 1.0, "servers": []}
    assert state["steps"]["broken"] | {"elapsed_s": 0, "finished_at": ""} == {
        "status": "failed", "elapsed_s": 0, "error": "nothing to compare: run `bench` first",
        "finished_at": "", "result": {"partial": True}, "runs": 1}
    summary = json.loads((run_dir / "summary.json").read_text())
    assert list(summary["steps"]) == ["versus", "broken", "summary"]
    assert "| versus | ok |" in (run_dir / "summary.md").read_text()
    assert "== step broken: FAILED after" in capsys.readouterr().out


@pytest.mark.parametrize(("tiers", "same"), [
    ("[{min_batch: 1, depth: 3}]", "static:3"),
    ("[{min_batch: 1, depth: 3, topk: 4, draft_tokens: 16}]", "static:3x4x16"),
    # a tree and the chain of its steps share a depth, not a shape: the table is its own run
    ("[{min_batch: 1, depth: 3, topk: 4, draft_tokens: 16}, {min_batch: 7, depth: 3}]", None),
])  # fmt: skip
def test_bench_table_reuses_a_static_run_only_for_the_very_same_shape(
    tmp_path: Path, tiers: str, same: str | None
) -> None:
    table = tmp_path / "table.yaml"
    table.write_text(f"table:\n  version: 1\n  tiers: {tiers}\n")
    run = _run(tmp_path, trace_bench=str(table))
    assert trace.same_as_static(run, ["static:3", "static:3x4x16", trace.BENCH_TABLE]) == same
