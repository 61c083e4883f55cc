"""SIGKILL the daemon process mid-run, restart it: no stored sample is lost or counted twice.

A real `specctl daemon` subprocess scrapes a simulated server over loopback HTTP every 0.1 s
and writes a real SQLite file. The simulator's clock is advanced only by this test, so the
counter values at the daemon's first scrape and at the end are known exactly: the stored
deltas must add up to the difference, to the token, across the kill.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from test_daemon_http import Loopback, new_sim, sim_total

from controller.daemon.scrape import split_key
from sglang_hooks.contract import METRIC_TOKENS
from sims.http import create_app

ROOT = Path(__file__).resolve().parents[1]


def _snapshot_tokens(db: Path) -> float | None:
    try:
        con = sqlite3.connect(db, timeout=5)
        row = con.execute("SELECT values_json FROM counter_snapshots WHERE target='a'").fetchone()
        con.close()
    except sqlite3.OperationalError:
        return None  # the daemon has not created its schema yet
    if row is None:
        return None
    import json

    values = json.loads(row[0])
    return sum(v for k, v in values.items() if split_key(k)[0] == METRIC_TOKENS)


def _stored(db: Path) -> tuple[float, float, int]:
    con = sqlite3.connect(db, timeout=5)
    row = con.execute("SELECT SUM(tokens), SUM(iterations), COUNT(*) FROM samples").fetchone()
    con.close()
    return float(row[0] or 0), float(row[1] or 0), int(row[2])


def _wait(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _start_daemon(config: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "controller.cli", "daemon", "--config", str(config)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


def test_sigkill_and_restart_loses_no_sample(tmp_path):
    sim = new_sim(concurrency=16)
    sim.advance(20)
    lb = Loopback(create_app(sim)).start()
    db = tmp_path / "store.sqlite"
    config = tmp_path / "controller.yaml"
    config.write_text(
        f"targets:\n  - {{name: a, url: '{lb.url}', timeout_s: 2.0}}\n"
        "schedule: {scrape_interval_s: 0.1, fit_interval_s: 1000, decide_interval_s: 1000}\n"
        f"store: {{path: '{db}'}}\nmetrics: {{enabled: false}}\n"
    )
    base_tokens, base_iters = sim_total(sim, 2), sim_total(sim, 0)
    daemon = _start_daemon(config)
    try:
        _wait(lambda: _snapshot_tokens(db) is not None, 30, "the first scrape")
        assert _snapshot_tokens(db) == base_tokens  # the baseline, taken while frozen
        for _ in range(20):  # ~1 s of scrapes while the server decodes
            sim.advance(3.0)
            time.sleep(0.05)
        os.kill(daemon.pid, signal.SIGKILL)
        daemon.wait(timeout=10)
        assert daemon.returncode == -signal.SIGKILL
        _tokens_at_kill, _iters, rows_at_kill = _stored(db)
        assert rows_at_kill > 0
        sim.advance(30.0)  # the server keeps running while the daemon is down
        daemon = _start_daemon(config)
        for _ in range(10):
            sim.advance(3.0)
            time.sleep(0.05)
        final_tokens = sim_total(sim, 2)
        _wait(lambda: _snapshot_tokens(db) == final_tokens, 30, "the restarted daemon to catch up")
        daemon.send_signal(signal.SIGTERM)
        out, _ = daemon.communicate(timeout=20)
        assert daemon.returncode == 0, out.decode()[-2000:]
    finally:
        if daemon.poll() is None:
            daemon.kill()
        lb.stop()
    tokens, iters, rows = _stored(db)
    assert rows > rows_at_kill  # it resumed
    assert tokens == final_tokens - base_tokens
    assert iters == sim_total(sim, 0) - base_iters
