"""`python -m benchmarks.gpu.seeded.trace` (run under each policy, then compare) against served
simulators: a speculative one with the plugin contract and a plain one (real HTTP over
loopback, the real `specctl daemon` as a subprocess, the real SQLite store)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from benchmarks.gpu.seeded import trace
from controller.bench.server_client import ServerClient
from sglang_hooks.contract import PolicyTable, Tier
from sglang_hooks.draft_shape import DraftShape

PHASES = "2:2:a,2.5:24:a,2:4:b"


def _dataset(path, words: str):
    path.write_text("".join(json.dumps({"prompt": f"{words} {i}", "output_tokens": 32}) + "\n"
                            for i in range(32)))  # fmt: skip
    return f"{path.stem}={path}"


def test_default_trace_shape_and_phase_parsing():
    phases = trace.default_trace(48)
    assert sum(p.seconds for p in phases) == pytest.approx(48, abs=0.05)
    assert max(p.concurrency for p in phases) == 256
    # a flash crowd on family b, the longest phase, then back to family a
    longest = max(phases, key=lambda p: p.seconds)
    assert (longest.concurrency, longest.dataset) == (256, "b")
    assert phases[0].dataset == phases[-1].dataset == "a"
    back = trace.parse_phases(trace.phases_text(phases))  # as the harness's --trace-phases
    assert [(p.seconds, p.concurrency, p.dataset) for p in back] == \
        [(p.seconds, p.concurrency, p.dataset) for p in phases]
    parsed = trace.parse_phases("6:2:a, 10:128:a,8:4:b")
    assert [(p.seconds, p.concurrency, p.dataset) for p in parsed] == \
        [(6, 2, "a"), (10, 128, "a"), (8, 4, "b")]
    for bad in ("6:2", "x:2:a", "0:2:a", "5:0:a", ""):
        with pytest.raises(trace.TraceError, match="--phases"):
            trace.parse_phases(bad)
    assert trace.parse_policy("static:3") == ("static", 3)
    assert trace.parse_policy("static:3x4x16") == ("static", DraftShape(3, 4, 16))
    # a chain is held by its depth, plain by depth 0: one spelling for each
    for bad in ("static:x", "static:-1", "eagle", "static:3x1x4", "static:plain",
                "static:3x4"):
        with pytest.raises(trace.TraceError, match="--policy"):
            trace.parse_policy(bad)


def test_every_policy_then_compare(sim_server_factory, tmp_path, capsys):
    spec = sim_server_factory(admin_key="k", speedup=1.0)
    plain = sim_server_factory(speculative=False, speedup=1.0)
    live = PolicyTable.build([Tier(1, 2), Tier(32, 0)], version=3)
    with ServerClient(spec.base_url, "k") as client:
        client.push(live)
    data = [_dataset(tmp_path / "a.jsonl", "the model"), _dataset(tmp_path / "b.jsonl", "a batch")]
    results = tmp_path / "results"
    for policy, url in (("static:3", spec.base_url), ("static:3+scrape", spec.base_url),
                        ("sglang", spec.base_url), ("daemon", spec.base_url),
                        ("plain", plain.base_url)):
        args = ["run", "--policy", policy, "--url", url, "--phases", PHASES, "--out", str(results),
                "--admin-key", "k"]  # fmt: skip
        for d in data:
            args += ["--dataset", d]
        assert trace.main(args) == 0, policy
    static = json.loads((results / "static-3.json").read_text())
    assert [p["name"] for p in static["phases"]] == ["p1-2-a", "p2-24-a", "p3-4-b"]
    # phases of at least --client-processes (default 4) streams are split across processes
    assert [p["client_processes"] for p in static["phases"]] == [1, 4, 4]
    assert all(p["table_after"] == "1+: d3" for p in static["phases"])
    for key in ("tok_per_s", "tpot_p50_ms", "tpot_p90_ms"):
        assert static["total"][key] > 0
        assert all(p[key] > 0 for p in static["phases"])
    assert static["phases"][1]["tpot_p50_ms"] > static["phases"][0]["tpot_p50_ms"]  # load costs
    assert "metrics_reads" not in static
    # static:3 again, /metrics read once a second as the trace's daemon does: each read's time
    # and size (the real stand-in server's page)
    scraped = json.loads((results / "static-3+scrape.json").read_text())
    reads = scraped["metrics_reads"]
    assert scraped["final_table"] == "1+: d3" and reads["interval_s"] == 1.0
    assert reads["reads"] >= 2 and reads["errors"] == 0
    assert 0 < reads["ms_p50"] <= reads["ms_p99"] <= reads["ms_max"]
    assert reads["bytes_mean"] > 1000
    released = json.loads((results / "sglang.json").read_text())
    assert released["final_table"] == "released (SGLang's own choice)"
    daemon = json.loads((results / "daemon.json").read_text())
    assert daemon["daemon"]["exit_status"] == 0
    assert daemon["daemon"]["warm_start_store"] is None
    assert daemon["daemon"]["push_count"] == len(daemon["daemon"]["pushes"])
    assert (results / "daemon.log").is_file() and (results / "daemon.sqlite").is_file()
    assert "table_after" not in json.loads((results / "plain.json").read_text())["phases"][0]
    with ServerClient(spec.base_url, "k") as client:  # every run pushed back what was live
        assert client.state().table.tiers == live.tiers

    assert trace.main(["compare", str(results)]) == 0
    table = (results / "compare.md").read_text()
    assert table.count("\n") == 2 + 5  # header, rule, one row per policy
    summary = json.loads((results / "compare.json").read_text())
    assert set(summary["policies"]) == {"static:3", "static:3+scrape", "sglang", "daemon",
                                        "plain"}
    assert (results / "compare.png").stat().st_size > 10_000
    capsys.readouterr()

    # the daemon runs on the trace's cores unless given its own
    assert daemon["daemon_cpus"] == sorted(os.sched_getaffinity(0))
    # a warm start copies the store given, and leaves the original alone
    before = (results / "daemon.sqlite").read_bytes()
    own = min(os.sched_getaffinity(0))
    before_cpus = os.sched_getaffinity(0)
    args = ["run", "--policy", "daemon", "--url", spec.base_url, "--phases", "2:2:a",
            "--out", str(tmp_path / "warm"), "--admin-key", "k", "--daemon-store",
            str(results / "daemon.sqlite"), "--dataset", data[0],
            "--daemon-cpus", str(own)]  # fmt: skip
    assert trace.main(args) == 0
    warm = json.loads((tmp_path / "warm" / "daemon.json").read_text())
    assert warm["daemon"]["warm_start_store"] == str(results / "daemon.sqlite")
    assert warm["daemon_cpus"] == [own]
    # the load processes ran on the trace's other cores; the trace's own set is back after
    others = sorted(before_cpus - {own})
    assert warm.get("load_cpus") == (others or None)
    assert os.sched_getaffinity(0) == before_cpus
    assert (results / "daemon.sqlite").read_bytes() == before


def test_errors_name_the_option(sim_server_factory, tmp_path, capsys):
    spec = sim_server_factory(admin_key="k")
    data = _dataset(tmp_path / "a.jsonl", "x")
    base = ["run", "--url", spec.base_url, "--out", str(tmp_path / "r"), "--admin-key", "k"]
    assert trace.main([*base, "--policy", "static:9", "--phases", "1:1:a", "--dataset", data]) == 2
    assert "depth 9 was not captured" in capsys.readouterr().err
    assert trace.main([*base, "--policy", "sglang+scrape", "--phases", "1:1:a", "--dataset",
                       data]) == 2  # fmt: skip
    assert "+scrape goes with a static depth" in capsys.readouterr().err
    assert trace.main([*base, "--policy", "static:1", "--phases", "1:1:b", "--dataset", data]) == 2
    assert "--dataset NAME=FILE" in capsys.readouterr().err
    assert trace.main([*base, "--policy", "plain", "--phases", "1:1:a",
                       "--dataset", "a.jsonl"]) == 2  # fmt: skip
    assert "write NAME=FILE" in capsys.readouterr().err
    assert trace.main([*base, "--policy", "daemon", "--phases", "1:1:a", "--dataset",
                       data, "--daemon-cpus", "99999"]) == 2  # fmt: skip
    assert "--daemon-cpus" in capsys.readouterr().err
    assert trace.main(["compare", str(tmp_path / "empty")]) == 2
    assert "no trace results" in capsys.readouterr().err


def test_a_warm_start_copy_keeps_samples_still_in_the_write_ahead_log(tmp_path):
    """A daemon's store in WAL mode, its writer still open (nothing checkpointed): the copy
    has every row; a plain copy of the main file would have none."""
    import shutil
    import sqlite3

    source = tmp_path / "daemon.sqlite"
    writer = sqlite3.connect(source)
    writer.execute("PRAGMA journal_mode=WAL")
    writer.execute("PRAGMA wal_autocheckpoint=0")
    writer.execute("CREATE TABLE samples (t REAL)")
    writer.executemany("INSERT INTO samples VALUES (?)", [(float(i),) for i in range(50)])
    writer.commit()
    shutil.copyfile(source, tmp_path / "plain-copy.sqlite")
    trace._copy_store(source, tmp_path / "copy.sqlite")
    writer.close()
    with sqlite3.connect(tmp_path / "copy.sqlite") as copy:
        assert copy.execute("SELECT count(*) FROM samples").fetchone() == (50,)
    with sqlite3.connect(tmp_path / "plain-copy.sqlite") as plain:
        assert plain.execute("SELECT count(*) FROM sqlite_master").fetchone() == (0,)


BENCH = (Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "gpu"
         / "h200-sglang-0.5.17-seeded-8b-run8" / "bench_family")  # fmt: skip


def test_a_bench_s_table_kept_and_a_daemon_started_from_the_bench(sim_server_factory, tmp_path,
                                                                   capsys):  # fmt: skip
    """The bench is a real `specctl bench` of the seeded pair on an H200 (recommended 1+: d3)."""
    spec = sim_server_factory(admin_key="k", speedup=1.0)
    data = _dataset(tmp_path / "a.jsonl", "the model")
    results = tmp_path / "results"
    base = ["run", "--url", spec.base_url, "--phases", "2:2:a,2:8:a", "--out", str(results),
            "--admin-key", "k", "--dataset", data]  # fmt: skip
    assert trace.main([*base, "--policy", "table", "--table-from", str(BENCH),
                       "--name", "bench-table"]) == 0  # fmt: skip
    kept = json.loads((results / "bench-table.json").read_text())
    assert kept["table"] == "1+: d3"
    assert all(p["table_after"] == "1+: d3" for p in kept["phases"])
    for key in ("tpot_p99_ms", "ttft_p99_ms"):
        assert kept["total"][key] >= kept["total"]["tpot_p50_ms"] > 0
    assert trace.main([*base, "--policy", "daemon", "--seed-bench", str(BENCH),
                       "--name", "daemon-from-bench"]) == 0  # fmt: skip
    seeded = json.loads((results / "daemon-from-bench.json").read_text())
    assert seeded["daemon"]["seed_bench"] == str(BENCH)
    from controller.daemon.store import Store

    store = Store(results / "daemon-from-bench.sqlite")
    first = [s for _, s in store.samples(target="spec")][:15]
    bench = json.loads((BENCH / "bench.json").read_text())
    assert [s.interval_s for s in first] == [r["elapsed_s"] for r in bench["results"]
                                             if r["depth"] is not None]
    store.close()
    capsys.readouterr()
    # a bench without a recommendation, and a table policy without its source: one line each
    none = tmp_path / "none"
    none.mkdir()
    (none / "bench.json").write_text(json.dumps({"results": [], "recommended_table": None}))
    assert trace.main([*base, "--policy", "table", "--table-from", str(none)]) == 2
    assert "the bench recommended no table" in capsys.readouterr().err
    assert trace.main([*base, "--policy", "table"]) == 2
    assert "--policy table needs --table-from" in capsys.readouterr().err
    assert trace.main([*base, "--policy", "daemon", "--seed-bench", str(none / "x")]) == 2
    assert "--seed-bench: seed_bench" in capsys.readouterr().err


def test_a_tree_the_server_did_not_capture_is_refused_before_any_load(
    sim_server_factory, tmp_path, capsys
):
    """`static:TREE` and a table naming a tree need a server that captured it: the simulator
    captures none, so both stop at once, naming the fix, and the live table is untouched."""
    spec = sim_server_factory(admin_key="k", speedup=1.0)
    live = PolicyTable.build([Tier(1, 2)], version=4)
    with ServerClient(spec.base_url, "k") as client:
        client.push(live)
    policy = tmp_path / "shapes.yaml"
    policy.write_text("table:\n  version: 1\n  tiers: [{min_batch: 1, depth: 3, topk: 4, "
                      "draft_tokens: 16}, {min_batch: 16, depth: 3}]\n")
    data = _dataset(tmp_path / "a.jsonl", "the model")
    for extra in (["--policy", "static:3x4x16"], ["--policy", "table", "--table-from",
                                                  str(policy)]):
        args = ["run", *extra, "--url", spec.base_url, "--phases", "2:2:a",
                "--out", str(tmp_path / "results"), "--admin-key", "k", "--dataset", data]
        assert trace.main(args) == 2
        err = capsys.readouterr().err
        assert "tree 3x4x16 was not captured (captured trees: none" in err, err
    with ServerClient(spec.base_url, "k") as client:
        assert client.state().table == live
