"""`specctl curves` and `specctl freeze` find the store the README's first commands fill:
`specctl demo`, and `specctl daemon` with its embedded default, without `--store`.

HOME points at a temporary folder in every test, so the default stores
(~/.local/state/specctl/...) are real SQLite files written there, never the user's.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from controller.cli import load_commands
from controller.cli.stores import DEMO_STORE, StoreNotFound, default_stores, find_store
from controller.daemon.config import load_config
from controller.daemon.policy_file import load
from controller.daemon.store import Store
from controller.evaluation.synthetic import sweep_samples
from sims.profile import load_profile

app = load_commands()
TARGETS = "targets: [{name: a, url: 'http://127.0.0.1:9'}]\n"


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def fill(path: Path, group: str) -> None:
    """A store holding a short synthetic sweep of one group (the daemon's sample rows)."""
    samples = sweep_samples(load_profile("kimi-k25-8x-rtxpro6000-pcie"), [1, 4, 16], 10.0, [0, 1])
    samples = [dataclasses.replace(s, group=group) for s in samples]
    store = Store(path)
    store.record_scrape(samples[0].target, samples[-1].t_end, samples, {})
    store.close()


def test_curves_and_freeze_work_right_after_the_demo(home: Path) -> None:
    demo = CliRunner().invoke(app, ["demo"])
    assert demo.exit_code == 0, demo.output
    store = DEMO_STORE.expanduser()
    assert store.is_file() and str(home) in str(store)
    assert f"samples stored in {store}" in flat(demo.output)
    assert not [p for p in store.parent.iterdir() if p.name.endswith(".partial")]
    curves = CliRunner().invoke(app, ["curves"])
    assert curves.exit_code == 0, curves.output
    assert f"store {store} (written by `specctl demo`" in flat(curves.output)
    assert "group kimi-k25-8x-rtxpro6000-pcie" in curves.output
    freeze = CliRunner().invoke(app, ["freeze"])
    assert freeze.exit_code == 0, freeze.output
    policy = load(home / "policy.yaml", captured_depths=[0, 1, 2, 3, 4])
    assert policy.provenance.store == str(store) and policy.provenance.samples


def test_the_daemons_embedded_default_writes_the_store_curves_reads(home: Path) -> None:
    """The embedded default run, shortened to 3 simulated minutes at full speed."""
    from controller.cli.daemon_run import run_daemon

    cfg = load_config(None)
    cfg = cfg.model_copy(
        update={"schedule": cfg.schedule.model_copy(update={"duration_s": 180.0, "speedup": None})}
    )
    run_daemon(cfg)
    written = cfg.store.resolved_path()
    assert written.is_file() and str(home) in str(written)
    assert find_store()[0] == written
    curves = CliRunner().invoke(app, ["curves"])
    assert curves.exit_code == 0, curves.output
    assert "written by `specctl daemon` (the embedded default config)" in flat(curves.output)
    freeze = CliRunner().invoke(app, ["freeze", "--out", str(home / "p.yaml")])
    assert freeze.exit_code == 0, freeze.output


def test_the_production_store_comes_first_then_the_newest_simulated_one(home: Path) -> None:
    production, simulated, demo = (s.path for s in default_stores())
    with pytest.raises(StoreNotFound, match="run `specctl demo` or `specctl daemon`"):
        find_store()
    fill(simulated, "daemon-default")
    time.sleep(0.01)
    fill(demo, "demo")
    assert find_store()[0] == demo
    os.utime(simulated)  # the daemon wrote last
    assert find_store()[0] == simulated
    fill(production, "prod")
    path, why = find_store()
    assert path == production and why is not None and "default store.path" in why
    given = home / "other.sqlite"
    fill(given, "given")
    assert find_store(given) == (given, None)


def test_config_points_curves_at_its_store_path(home: Path) -> None:
    store = home / "mine.sqlite"
    fill(store, "mine")
    cfg = home / "controller.yaml"
    cfg.write_text(f"{TARGETS}store: {{path: '{store}'}}\n")
    result = CliRunner().invoke(app, ["curves", "--config", str(cfg)])
    assert result.exit_code == 0, result.output
    assert "group mine" in result.output and f"store.path of {cfg}" in flat(result.output)
    empty = home / "empty.yaml"
    empty.write_text(f"{TARGETS}store: {{path: '{home}/n.db'}}\n")
    missing = CliRunner().invoke(app, ["curves", "--config", str(empty)])
    assert missing.exit_code == 2 and "does not exist yet" in flat(missing.output)
