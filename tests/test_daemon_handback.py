"""The daemon hands every server back when it stops (`on_exit`): no probes are left behind.

A real `specctl daemon` subprocess against simulated SGLang servers over loopback HTTP (the
`sim_server_factory` servers run their own clock; the `Loopback` ones are advanced by the test),
with a real SQLite store, stopped by SIGINT, SIGTERM or `schedule.duration_s`. The test waits
for the daemon's push to show on the server (a count of pushes, not a time), then stops it and
reads what the server runs.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from test_daemon_http import Loopback, controller_for, new_sim

from controller.daemon.runner import run_wall
from controller.daemon.store import Store
from sglang_hooks.contract import PolicyTable, Tier, push_body
from sims.http import create_app

ROOT = Path(__file__).resolve().parents[1]
FAST = "scrape_interval_s: 0.2, fit_interval_s: 0.4, decide_interval_s: 0.4"


def _config(
    tmp_path: Path, url: str, extra: str = "", target: str = "", schedule: str = ""
) -> Path:
    config = tmp_path / "controller.yaml"
    config.write_text(
        f"targets:\n  - {{name: a, url: '{url}', timeout_s: 2.0{target}}}\n"
        f"schedule: {{{FAST}{schedule}}}\nguardrails: {{min_dwell_s: 0.0}}\n"
        f"store: {{path: '{tmp_path / 'store.sqlite'}'}}\nmetrics: {{enabled: false}}\n" + extra
    )
    return config


def _start_daemon(config: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "controller.cli", "daemon", "--config", str(config)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _wait(
    predicate: Callable[[], bool],
    what: str,
    daemon: subprocess.Popen[str] | None = None,
    timeout_s: float = 60.0,
) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if daemon is not None and daemon.poll() is not None:
            out = daemon.stdout.read() if daemon.stdout is not None else ""
            raise AssertionError(f"the daemon exited while waiting for {what}:\n{out[-3000:]}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _table(server: Any) -> dict[str, Any] | None:
    table: dict[str, Any] | None = server.specctl_state()["table"]
    return table


def _probes(table: dict[str, Any] | None) -> bool:
    return table is not None and any(t["explore_share"] > 0 for t in table["tiers"])


def _stop(daemon: subprocess.Popen[str], sig: signal.Signals) -> str:
    daemon.send_signal(sig)
    out, _ = daemon.communicate(timeout=60)
    assert daemon.returncode == 0, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    return out


def _handback_lines(out: str) -> list[str]:
    return [ln for ln in out.splitlines() if "hand-back a:" in ln]


def test_sigint_releases_a_server_found_released_and_leaves_no_probes(tmp_path, sim_server_factory):
    sim = sim_server_factory(concurrency=16, speedup=50)
    daemon = _start_daemon(_config(tmp_path, sim.base_url))
    try:
        _wait(lambda: _probes(_table(sim.server)), "the daemon's table with probes", daemon)
        out = _stop(daemon, signal.SIGINT)
    finally:
        if daemon.poll() is None:
            daemon.kill()
    assert _table(sim.server) is None  # SGLang's own choice again, as found
    lines = _handback_lines(out)
    assert len(lines) == 1 and "left released (SGLang's own choice), as found" in lines[0], out
    last = Store(tmp_path / "store.sqlite").pushes("a")[-1]
    assert (last.kind, last.outcome, last.table) == ("handback", "applied", None)


def test_sigterm_restores_the_table_found_at_start_up(tmp_path, sim_server_factory):
    """A frozen policy replaces the found table at once; on SIGTERM the found table returns."""
    sim = sim_server_factory(concurrency=8, speedup=50, admin_key="adm")
    found = PolicyTable.build([Tier(1, 4), Tier(16, 2, hysteresis=2)], version=7)
    assert sim.server.set_internal_state(push_body(found), "Bearer adm")[0] == 200
    policy = tmp_path / "policy.yaml"
    policy.write_text("table:\n  version: 40\n  tiers:\n    - {min_batch: 1, depth: 1}\n")
    config = _config(tmp_path, sim.base_url, f"frozen_policy: '{policy}'\n", ", admin_key: adm")
    daemon = _start_daemon(config)
    try:
        _wait(lambda: (_table(sim.server) or {}).get("version") == 40, "the frozen table", daemon)
        out = _stop(daemon, signal.SIGTERM)
    finally:
        if daemon.poll() is None:
            daemon.kill()
    assert _table(sim.server) == found.to_json()  # the same tiers, the same version
    lines = _handback_lines(out)
    assert len(lines) == 1 and f"left {found.label()}" in lines[0], out
    assert "as found at start-up (on_exit restore)" in lines[0]


def test_duration_reached_with_keep_table_leaves_the_daemons_table_without_probes(
    tmp_path, sim_server_factory
):
    sim = sim_server_factory(concurrency=16, speedup=50)
    config = _config(tmp_path, sim.base_url, "on_exit: keep-table\n", schedule=", duration_s: 8")
    daemon = _start_daemon(config)
    try:
        _wait(lambda: _probes(_table(sim.server)), "the daemon's table with probes", daemon)
        out, _ = daemon.communicate(timeout=60)  # it stops by itself after duration_s
    finally:
        if daemon.poll() is None:
            daemon.kill()
    assert daemon.returncode == 0, out[-3000:]
    left = _table(sim.server)
    assert left is not None and not _probes(left), out
    pushes = Store(tmp_path / "store.sqlite").pushes("a")
    learned = [p for p in pushes if p.kind == "learned" and p.outcome != "refused"]
    assert pushes[-1].kind == "handback" and learned
    # The daemon's last table, probes dropped: the same depth at every batch size.
    last = PolicyTable.build([Tier(**t) for t in learned[-1].table["tiers"]])  # type: ignore[index]
    live = PolicyTable.build([Tier(**t) for t in left["tiers"]])
    assert all(last.depth_for(b) == live.depth_for(b) for b in range(1, 600))
    assert "the daemon's own table without probes" in _handback_lines(out)[0]


def test_an_unreachable_server_at_exit_is_one_line_and_the_exit_status_stays_0(tmp_path):
    sim = new_sim(concurrency=16)
    lb = Loopback(create_app(sim)).start()
    daemon = _start_daemon(_config(tmp_path, lb.url))
    try:
        for _ in range(600):  # the test drives the simulated clock
            sim.advance(2.0)
            if _probes(sim.specctl_state()["table"]):
                break
            time.sleep(0.05)
        assert _probes(sim.specctl_state()["table"])
        lb.stop()  # the server goes away before the daemon stops
        out = _stop(daemon, signal.SIGTERM)
    finally:
        if daemon.poll() is None:
            daemon.kill()
    lines = _handback_lines(out)
    assert len(lines) == 1 and "not reached" in lines[0] and "on_exit restore" in lines[0], out


class _FailingStop(threading.Event):
    """A stop event whose wait raises once the server runs a table with probes: a fatal error
    in the wall-clock driver after start (nothing real fails on cue, hence this fault)."""

    def __init__(self, server: Any) -> None:
        super().__init__()
        self.server = server

    def wait(self, timeout: float | None = None) -> bool:
        if _probes(self.server.specctl_state()["table"]):
            raise RuntimeError("fatal error after start")
        self.server.advance(2.0)
        return super().wait(timeout)


def test_a_fatal_error_after_start_still_hands_back(tmp_path):
    sim = new_sim(concurrency=16)
    lb = Loopback(create_app(sim)).start()
    try:
        ctl, store = controller_for(
            tmp_path,
            [{"name": "a", "url": lb.url}],
            schedule={"scrape_interval_s": 0.2, "fit_interval_s": 0.4, "decide_interval_s": 0.4},
            guardrails={"min_dwell_s": 0.0},
        )
        try:
            run_wall(ctl, stop=_FailingStop(sim))
        except RuntimeError as err:
            assert str(err) == "fatal error after start"
        else:
            raise AssertionError("the fault did not fire")
        assert sim.specctl_state()["table"] is None
        last = store.pushes("a")[-1]
        assert last.kind == "handback"
        gauge = "specctl_daemon_handback_timestamp_seconds"
        labels = {"target": "a", "left": "release"}
        assert ctl.metrics.registry.get_sample_value(gauge, labels) == last.t
        ctl.close()
        # A restarted daemon shows the previous run's hand-back from its store.
        again, _ = controller_for(tmp_path, [{"name": "a", "url": lb.url}])
        assert again.metrics.registry.get_sample_value(gauge, labels) == last.t
        again.close()
    finally:
        lb.stop()
