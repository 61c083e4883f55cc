"""A shape server's draft trees in the daemon: read by shape from the plugin's own exporter's
text, stored with their label (a store written before trees were stored is migrated), kept out
of the depth learner, and shown by `specctl curves` beside the depths.

The exporter text comes from the plugin's real `PrometheusExporter` and `DepthCounters`,
rendered by prometheus_client; the scheduler runtime they are read from is a stand-in object
(`SimpleNamespace`) holding those two real counter sets, as SGLang's scheduler is not on CPU.
The daemon test runs against the simulated shape server (real loopback HTTP, the contract)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import yaml
from prometheus_client import CollectorRegistry, generate_latest
from typer.testing import CliRunner

from controller.bench.server_client import ServerClient
from controller.cli import load_commands
from controller.daemon.handback import without_probes
from controller.daemon.scrape import build_samples, parse_counters, series_key
from controller.daemon.store import MIGRATIONS, SCHEMA_VERSION, Store
from models.learner import Learner
from models.samples import Sample
from sglang_hooks.contract import METRIC_ITERATIONS, METRIC_TOKENS, parse_table
from sglang_hooks.counters import DepthCounters
from sglang_hooks.draft_shape import DraftShape
from sglang_hooks.exporter import PrometheusExporter

LABELS = {"model_name": "m", "engine_type": "unified", "tp_rank": "0", "pp_rank": "0",
          "moe_ep_rank": "0"}  # fmt: skip
PROFILE = str(Path(__file__).resolve().parents[1] / "benchmarks" / "results"
              / "shape_sim_run30.yaml")  # fmt: skip


def exporter_text() -> str:
    """Depth 3 at batch 8 (100 iterations, 20 tokens each) and the tree 3x4x16 at batch 8
    (50 iterations, 28 tokens) and batch 1 (10 iterations, 4 tokens), as the plugin exports."""
    runtime = SimpleNamespace(counters=DepthCounters(), tree_counters=DepthCounters(),
                              table=None, captured_depths=frozenset({0, 3}))  # fmt: skip
    exporter = PrometheusExporter(LABELS, registry=CollectorRegistry())
    for _ in range(100):
        runtime.counters.record(3, 8, 20, 0.01, False)
    for _ in range(50):
        runtime.tree_counters.record("3x4x16", 8, 28, 0.02, False)
    for _ in range(10):
        runtime.tree_counters.record("3x4x16", 1, 4, 0.008, False)
    exporter.export(runtime)  # type: ignore[arg-type]
    return generate_latest(exporter.registry).decode()


def test_trees_are_read_by_shape_only_when_asked_and_become_samples_with_their_label() -> None:
    text = exporter_text()
    chains = parse_counters(text)
    assert not any("3x4x16" in key for key in chains.values) and chains.dropped_series == 0
    snap = parse_counters(text, trees=True)
    assert snap.values[series_key(METRIC_ITERATIONS, "3x4x16", 8, "")] == 50
    assert snap.values[series_key(METRIC_TOKENS, 3, 8, "")] == 2000
    # a series first seen is its own delta
    built = build_samples(snap.values, group="g", target="t", t_end=10.0, interval_s=5.0)
    assert built.inconsistent == 0
    got = {(s.tree, s.depth, s.bs_bucket): (s.iterations, s.tokens) for s in built.samples}
    assert got == {("", 3, 8): (100, 2000), ("3x4x16", 3, 8): (50, 1400),
                   ("3x4x16", 3, 1): (10, 40)}  # fmt: skip
    assert [s.tree for s in built.samples] == ["", "3x4x16", "3x4x16"]  # chains first


def test_unreadable_tree_series_are_dropped_and_counted_the_rest_kept() -> None:
    text = exporter_text()
    bad = [
        'specctl_tree_decode_iterations_total{shape="banana",bs_bucket="8"} 5',
        'specctl_tree_decode_iterations_total{shape="3x1x4",bs_bucket="8"} 5',  # a chain
        'specctl_tree_decode_iterations_total{shape="16x2x8",bs_bucket="8"} 5',  # past depth 15
        'specctl_tree_decode_iterations_total{shape="2x4x8",bs_bucket="9"} 5',  # no bucket edge
    ]
    # appended to the family's own block so the page stays valid Prometheus text
    head = "# TYPE specctl_tree_decode_iterations_total counter\n"
    assert head in text
    snap = parse_counters(text.replace(head, head + "\n".join(bad) + "\n"), trees=True)
    assert snap.dropped_series == 4
    assert snap.values[series_key(METRIC_ITERATIONS, "3x4x16", 1, "")] == 10


def test_tree_samples_round_trip_and_an_older_store_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, "
               "applied_at REAL NOT NULL)")  # fmt: skip
    db.executescript(MIGRATIONS[0][2])
    db.execute("INSERT INTO schema_migrations VALUES (1, 'initial schema', 0)")
    db.execute("INSERT INTO samples (grp, target, t_end, interval_s, depth, bs_bucket, iterations,"
               " request_steps, tokens, gpu_seconds) VALUES ('g','t',1,1,3,8,10,90,200,0.1)")
    db.commit()
    db.close()
    store = Store(path)
    assert SCHEMA_VERSION == 2 and store.schema_version() == 2
    tree = Sample("g", "t", 2.0, 1.0, 3, 8, 10.0, 90.0, 300.0, 0.2, 0.0, "3x4x16")
    store.add_samples([tree])
    (_, old), (_, new) = store.samples()
    assert old.tree == "" and old.tokens == 200 and new == tree
    store.close()


def test_the_learner_takes_no_evidence_from_a_tree() -> None:
    chain = [Sample("g", "t", float(t), 1.0, 3, 8, 100.0, 900.0, 1800.0, 2.0) for t in range(5)]
    tree = [Sample("g", "t", float(t), 1.0, 3, 8, 100.0, 900.0, 3500.0, 4.0, 0.0, "3x4x16")
            for t in range(5)]  # fmt: skip
    alone, mixed = Learner([0, 3]), Learner([0, 3])
    alone.fit(chain, 5.0)
    mixed.fit(chain + tree, 5.0)
    assert alone.evidence(3) == mixed.evidence(3) > 0
    assert alone.acceptance.mean_length(3) == mixed.acceptance.mean_length(3)


def test_the_daemon_stores_a_shape_server_s_trees_and_curves_show_them(
    sim_server_factory: Any, tmp_path: Path
) -> None:
    """The server runs its table (the tree, probing depth 3 in a third of its iterations): the
    daemon learns each shape where it runs, keeps the table it found (the tree is best at
    four streams), stores both shapes; `specctl curves` shows the tree's measured tok/s beside
    the depths, in its JSON and its figure."""
    handle = sim_server_factory(profile=PROFILE, shapes=["3x1x4", "3x4x16"], admin_key="k",
                                concurrency=4.0, speedup=20.0)  # fmt: skip
    table = parse_table({"version": 3, "tiers": [
        {"min_batch": 1, "depth": 3, "topk": 4, "draft_tokens": 16, "explore_share": 0.3,
         "explore_depths": [3]}]})  # fmt: skip
    with ServerClient(handle.base_url, "k") as client:
        client.push(table)
    store = tmp_path / "d.sqlite"
    config = tmp_path / "daemon.yaml"
    config.write_text(yaml.safe_dump({
        "targets": [{"name": "shapes", "url": handle.base_url, "admin_key": "k"}],
        "schedule": {"clock": "wall", "duration_s": 4, "scrape_interval_s": 0.5,
                     "fit_interval_s": 1, "decide_interval_s": 1},
        "metrics": {"enabled": False}, "store": {"path": str(store)}}))  # fmt: skip
    runner = CliRunner()
    res = runner.invoke(load_commands(), ["daemon", "-c", str(config)])
    assert res.exit_code == 0, res.output
    assert "learns each shape's tok/s per batch bucket" in " ".join(res.output.split())
    with ServerClient(handle.base_url, "k") as client:
        left = client.state().table  # as found, without probes (the hand-back at exit)
    assert left is not None and [(t.shape, t.explore_share) for t in left.tiers] == [
        (DraftShape(3, 4, 16), 0.0)], left  # fmt: skip
    opened = Store(store)
    stored = [s for _, s in opened.samples()]
    opened.close()
    assert {s.tree for s in stored if s.tree} == {"3x4x16"}, stored
    assert any(s.depth == 3 and not s.tree for s in stored), stored
    res = runner.invoke(load_commands(), ["curves", "--store", str(store), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert set(doc["curves"]) <= {"0", "3"}  # learned: chains and off only
    measured_trees = [m for m in doc["measured"] if m["tree"]]
    assert measured_trees and all(m["tree"] == "3x4x16" for m in measured_trees)
    assert all(m["accept_length"] > 2.5 for m in measured_trees), measured_trees
    plot = tmp_path / "curves.png"
    res = runner.invoke(load_commands(), ["curves", "--store", str(store), "--plot", str(plot)])
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "draft trees, measured and not learned" in text and "3x4x16" in text
    assert plot.stat().st_size > 10_000


def test_curves_of_a_store_where_only_trees_ran_say_so_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "trees.sqlite"
    store = Store(path)
    store.add_samples([Sample("g", "t", 2.0, 1.0, 3, 8, 10.0, 90.0, 300.0, 0.2, 0.0, "3x4x16")])
    store.close()
    res = CliRunner().invoke(load_commands(), ["curves", "--store", str(path)])
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert "only draft trees ran (3x4x16)" in lines[0] and "specctl bench --shapes" in lines[0]


def test_a_tree_table_handed_back_without_probes_keeps_its_trees() -> None:
    table = parse_table({"version": 5, "tiers": [
        {"min_batch": 1, "depth": 3, "topk": 4, "draft_tokens": 16, "explore_share": 0.05,
         "explore_depths": [3]},
        {"min_batch": 8, "depth": 3, "topk": 4, "draft_tokens": 16},
        {"min_batch": 32, "depth": 3, "explore_share": 0.05, "explore_depths": [0]}]})  # fmt: skip
    plain = without_probes(table, version=6)
    assert [(t.min_batch, t.shape, t.explore_share) for t in plain.tiers] == [
        (1, DraftShape(3, 4, 16), 0.0), (32, DraftShape(3, 1, 4), 0.0)]  # fmt: skip


def test_prometheus_source_reads_the_trees_as_the_page_does() -> None:
    """Through Prometheus' query API (the loopback stand-in of test_daemon_prometheus, over
    the exporter's text): the same counters, trees included, as parsing the page."""
    from test_daemon_http import Loopback
    from test_daemon_prometheus import PromStandIn

    from controller.daemon.sources import PrometheusSource

    text = exporter_text()
    prom = PromStandIn(SimpleNamespace(metrics_text=lambda: text), "sim:1")  # type: ignore[arg-type]
    server = Loopback(prom.app).start()
    try:
        source = PrometheusSource(server.url, 'instance="sim:1"', timeout_s=5.0)
        via = source.read_counters()
        source.close()
    finally:
        server.stop()
    assert via.values == parse_counters(text, trees=True).values and via.dropped_series == 0
    assert any("shape" in q for q in prom.queries)
