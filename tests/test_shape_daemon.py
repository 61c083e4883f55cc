"""The daemon steering a simulated shape server (`specctl sim shapes --closed-loop S --daemon`):
the real daemon (scraper, store, learner, push gate, guardrails) on the simulated clock, its
pushes through the simulator's admin path, over the closed loop the static shapes run."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from controller.cli import load_commands
from controller.daemon.store import Store
from models.samples import Sample
from models.shape_learner import ShapeLearner
from sglang_hooks.contract import parse_table, tier_label

PROFILE = str(Path(__file__).resolve().parents[1] / "benchmarks" / "results"
              / "shape_sim_run30.yaml")  # fmt: skip
ARGS = ["sim", "shapes", "--profile", PROFILE, "--shapes", "3x4x16,3x1x4,plain", "--phase", "b",
        "--streams", "1,64,256", "--duration", "20", "--warmup", "5",
        "--output-tokens", "128:384", "--closed-loop", "60"]  # fmt: skip


def test_the_daemon_learns_the_shape_per_load_and_beats_every_static_shape() -> None:
    """From an empty store over 1 -> 64 -> 256 -> 64 -> 1 streams, a minute each: the tree at
    one stream, the chain at 64, off at 256 (the profile's best shapes there), and more tokens
    over the trace than any one shape held throughout."""
    res = CliRunner().invoke(load_commands(), [*ARGS, "--daemon", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)["closed_loop_daemon"]["b"]  # stderr may hold log lines
    table = parse_table(doc["final_table"])
    assert [tier_label(table.tier_for(b)) for b in (1, 64, 256)] == ["3x4x16", "d3", "off"], (
        doc["final_table_text"])
    over = doc["over"]
    assert set(over) == {"3x4x16", "3x1x4", "plain", "table"}
    assert min(over[s] for s in ("3x4x16", "3x1x4", "plain")) > 1.0, over
    assert over["table"] < 1.0  # learning costs against the bench's table known beforehand
    assert doc["exploration_share"] <= 0.03  # the learner's cap
    assert any(p["detail"] == "probes only: no decision changed" for p in doc["pushes"])


def test_the_daemon_needs_the_closed_loop() -> None:
    args = [a for a in ARGS if a not in ("--closed-loop", "60")]
    res = CliRunner().invoke(load_commands(), [*args, "--daemon"])
    assert res.exit_code == 2
    assert "give --closed-loop SECONDS too" in " ".join(res.output.split())


def test_curves_from_a_shape_learner_s_snapshot_say_what_to_do_in_one_line(tmp_path: Path) -> None:
    learner = ShapeLearner(["3x4x16", "3x1x4", "plain"])
    samples = [Sample("g", "t", 2.0, 1.0, 3, 8, 10.0, 90.0, 300.0, 0.2, 0.0, "3x4x16"),
               Sample("g", "t", 2.0, 1.0, 3, 8, 10.0, 90.0, 200.0, 0.2)]  # fmt: skip
    learner.fit(samples, 2.0)
    path = tmp_path / "shapes.sqlite"
    store = Store(path)
    store.add_samples(samples)
    store.add_learner_snapshot(2.0, "g", learner.version, learner.to_json())
    store.close()
    res = CliRunner().invoke(load_commands(), ["curves", "--store", str(path), "--snapshot"])
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert "a shape server's learner" in lines[0] and "drop --snapshot" in lines[0]
