"""`specctl curves` and `specctl freeze` on a real SQLite store filled through the store's API.

The samples come from the profile's cost model (`controller.evaluation.synthetic.sweep_samples`),
the same counter deltas the daemon stores from a server: a known ground truth the figures must show.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from controller.cli import COMMAND_MODULES, app
from controller.daemon.policy_file import PolicyFileError, load
from controller.daemon.store import Store
from controller.evaluation.synthetic import sweep_samples
from sims.profile import load_profile

for _module in COMMAND_MODULES:
    importlib.import_module(_module)

PROFILE = "kimi-k25-8x-rtxpro6000-pcie"


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def store_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("store") / "specctl.sqlite"
    samples = sweep_samples(load_profile(PROFILE), [1, 2, 4, 8, 16, 32, 48], 10.0, [0, 1, 3])
    store = Store(path)
    store.record_scrape("synthetic-0", samples[-1].t_end, samples, {})
    store.add_push(
        t=samples[-1].t_end, target="synthetic-0", kind="learned", reason="test",
        table={"version": 3, "tiers": [{"min_batch": 1, "depth": 3}, {"min_batch": 8, "depth": 1}]},
        predicted=None, outcome="good",
    )  # fmt: skip
    store.close()
    return path


def test_curves_json_shows_predictions_evidence_and_tables(store_path: Path, tmp_path) -> None:
    png = tmp_path / "curves.png"
    result = CliRunner().invoke(
        app, ["curves", "--store", str(store_path), "--json", "--plot", str(png)]
    )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["group"] == "synthetic" and doc["samples"] > 0
    assert set(doc["curves"]) == {"0", "1", "3"}
    measured = {(m["depth"], m["bs_bucket"]): m for m in doc["measured"]}
    assert measured[1, 8]["iterations"] > 0 and measured[1, 8]["samples"] >= 1
    # The model goes through its evidence: prediction within 5% of the pooled measurement.
    pred = {p["batch"]: p for p in doc["curves"]["1"]}
    assert pred[8.0]["tok_per_s"] == pytest.approx(measured[1, 8]["tok_per_s"], rel=0.05)
    assert pred[8.0]["lo"] <= pred[8.0]["tok_per_s"] <= pred[8.0]["hi"]
    assert pred[8.0]["evidence_iterations"] > 0
    assert doc["live_table_text"] == "1-7: d3 | 8+: d1"
    assert doc["proposed_table"]["tiers"]
    assert png.stat().st_size > 20_000


def test_curves_terminal_view_and_errors(store_path: Path, tmp_path) -> None:
    result = CliRunner().invoke(app, ["curves", "--store", str(store_path)])
    assert result.exit_code == 0, result.output
    out = flat(result.output)
    assert "group synthetic" in out and "live table (synthetic-0): 1-7: d3 | 8+: d1" in out
    assert " it)" in out  # measured points say how many iterations they rest on
    missing = CliRunner().invoke(app, ["curves", "--store", str(tmp_path / "none.sqlite")])
    assert missing.exit_code == 2 and "store not found" in flat(missing.output)
    assert not (tmp_path / "none.sqlite").exists()  # reading never creates a store
    group = CliRunner().invoke(app, ["curves", "--store", str(store_path), "--group", "nope"])
    assert group.exit_code == 2 and "groups in the store: ['synthetic']" in flat(group.output)


def test_freeze_writes_a_policy_file_that_checks_and_loads(store_path: Path, tmp_path) -> None:
    out = tmp_path / "policy.yaml"
    result = CliRunner().invoke(app, ["freeze", "--store", str(store_path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    policy = load(out, captured_depths=[0, 1, 3])
    assert policy.table.version == 4  # one past the live table
    assert all(t.explore_share == 0 for t in policy.table.tiers)  # frozen: no probes
    prov = policy.provenance
    assert prov.group == "synthetic" and prov.targets == ["synthetic-0"]
    assert prov.samples and prov.samples > 0 and prov.model_version
    assert prov.predicted_gain is not None and set(prov.predicted_gain) >= {
        "full_depth", "off", "best_single_depth"
    }  # fmt: skip
    assert prov.predicted_gain["best_single_depth"] >= -0.01  # never worse than static
    # The plugin's start-up loader reads the same file.
    from sglang_hooks.policy_file import load_policy_file

    assert load_policy_file(out) == policy.table
    check = CliRunner().invoke(app, ["freeze", "--check", str(out)])
    assert check.exit_code == 0 and "ok" in check.output


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("table:\n  tiers:\n  - {min_batch: 1, depth: 3}\n  - {min_batch: 8, depth: 99}\n",
         "table.tiers[1].depth: must be an integer in [0, 15], got 99"),
        ("table:\n  tiers:\n  - {min_batch: 2, depth: 3}\n",
         "table.tiers[0].min_batch: the first tier must start at batch size 1"),
        ("table: {tiers: [{min_batch: 1, depth: 1}]}\nprovenance: {samples: many}\n",
         "provenance.samples: Input should be a valid integer"),
        ("tabel: {}\n", "tabel: unknown key; expected format, table, provenance"),
        ("table: [1\n", "line 2, column 1: not valid YAML"),
    ],
)  # fmt: skip
def test_freeze_check_names_the_bad_field(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    result = CliRunner().invoke(app, ["freeze", "--check", str(path)])
    assert result.exit_code == 2
    assert message in flat(result.output)
    with pytest.raises(PolicyFileError):
        load(path)


@pytest.mark.parametrize("sim_server", [{}], indirect=True)
def test_freeze_check_against_a_live_servers_captured_depths(sim_server, tmp_path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("table: {tiers: [{min_batch: 1, depth: 7}]}\n")
    result = CliRunner().invoke(app, ["freeze", "--check", str(path), "--url", sim_server.base_url])
    assert result.exit_code == 2
    assert "table.tiers[0].depth: depth 7 was not captured by the server" in flat(result.output)
