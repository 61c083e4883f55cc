"""`specctl daemon`: config errors name the field; a simulated run prints its pushes."""

from __future__ import annotations

import importlib

from typer.testing import CliRunner

from controller.cli import COMMAND_MODULES, app

for _module in COMMAND_MODULES:  # register every command, as the console script does
    importlib.import_module(_module)


def test_config_typo_exits_2_naming_the_field(tmp_path):
    bad = tmp_path / "controller.yaml"
    bad.write_text("targets:\n  - name: a\n    urll: http://127.0.0.1:30000\n")
    result = CliRunner().invoke(app, ["daemon", "--config", str(bad)])
    assert result.exit_code == 2
    assert "targets[0].urll: unknown field" in result.output
    assert "Traceback" not in result.output


def test_bad_learner_override_names_the_field(tmp_path):
    cfg = tmp_path / "controller.yaml"
    cfg.write_text(
        "targets: [{name: s, simulated: {}}]\nschedule: {clock: simulated}\n"
        f"store: {{path: '{tmp_path / 's.sqlite'}'}}\nmetrics: {{enabled: false}}\n"
        "learner: {exploration_cap: 2.0}\n"
    )
    result = CliRunner().invoke(app, ["daemon", "--config", str(cfg)])
    assert result.exit_code == 2
    assert "learner.exploration_cap" in result.output
    cfg.write_text(cfg.read_text().replace("exploration_cap: 2.0", "exploraton_cap: 0.1"))
    typo = CliRunner().invoke(app, ["daemon", "--config", str(cfg)])
    assert typo.exit_code == 2
    assert "learner.exploraton_cap: unknown field (check the spelling" in typo.output


def test_a_missing_key_variable_is_named_before_the_store_is_made(tmp_path):
    cfg = tmp_path / "controller.yaml"
    db = tmp_path / "s.sqlite"
    cfg.write_text(
        "targets: [{name: a, url: 'http://127.0.0.1:9', admin_key_env: SPECCTL_TEST_NO_SUCH}]\n"
        f"store: {{path: '{db}'}}\nmetrics: {{enabled: false}}\n"
    )
    result = CliRunner().invoke(app, ["daemon", "--config", str(cfg)],
                                env={"SPECCTL_TEST_NO_SUCH": None})  # fmt: skip
    assert result.exit_code == 2
    assert "admin_key_env: environment variable SPECCTL_TEST_NO_SUCH is not set" in result.output
    assert not db.exists()


def _simulated_config(tmp_path):  # type: ignore[no-untyped-def]
    """A 12-minute simulated Kimi run storing into tmp_path; returns (config, store) paths."""
    cfg = tmp_path / "controller.yaml"
    db = tmp_path / "s.sqlite"
    cfg.write_text(
        "targets: [{name: sim, simulated: {profile: kimi-k25-8x-rtxpro6000-pcie}}]\n"
        "schedule: {clock: simulated, speedup: 1000000, duration_s: 720}\n"
        f"store: {{path: '{db}'}}\nmetrics: {{enabled: false}}\n"
    )
    return cfg, db


def test_simulated_daemon_run_logs_pushes_and_stores_samples(tmp_path):
    cfg, db = _simulated_config(tmp_path)
    result = CliRunner().invoke(app, ["daemon", "--config", str(cfg)])
    assert result.exit_code == 0, result.output
    pushes = [ln for ln in result.output.splitlines() if "] push sim [learned]" in ln]
    assert pushes, result.output
    assert "progress:" in result.output
    assert "stopped:" in result.output
    from controller.daemon.store import Store

    store = Store(db)
    assert store.count_samples("sim") > 50
    assert len(store.pushes("sim")) == len(pushes)


def test_second_simulated_run_on_the_same_store_resumes_and_learns(tmp_path):
    """A fresh simulated server starts at t=0; the store's earlier records must stay past."""
    cfg, db = _simulated_config(tmp_path)
    from controller.daemon.store import Store

    first = CliRunner().invoke(app, ["daemon", "--config", str(cfg)])
    assert first.exit_code == 0, first.output
    first_end = Store(db).last_sample_time(target="sim")
    first_pushes = len(Store(db).pushes("sim"))
    second = CliRunner().invoke(app, ["daemon", "--config", str(cfg)])
    assert second.exit_code == 0, second.output
    assert "simulated clock resumes" in second.output
    store = Store(db)
    assert first_end is not None and store.last_sample_time(target="sim") > first_end + 600
    assert len(store.pushes("sim")) > first_pushes
