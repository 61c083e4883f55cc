"""A table the daemon finds on a server is kept until the model predicts a gain over it.

The daemon (`Controller`, its real scrape -> store -> fit -> decide path) against a simulated
server over loopback HTTP, with a real SQLite store; the test advances the simulator's clock and
calls the daemon's steps itself, so every run is the same, tick for tick.
"""

from __future__ import annotations

from typing import Any

from test_daemon_http import Loopback, controller_for, new_sim

from controller.daemon.loop import Controller
from sglang_hooks.contract import PolicyTable, Tier, push_body
from sims.http import create_app
from sims.server import SimulatedServer

FAST = {
    "schedule": {"scrape_interval_s": 5.0},
    "guardrails": {"min_dwell_s": 0.0, "rollback_window_s": 20.0},
}


def _run(ctl: Controller, sim: SimulatedServer, ticks: int, start: float = 0.0) -> float:
    """`ticks` scrape intervals of 5 simulated seconds: scrape, fit and decide each time."""
    now = start
    for _ in range(ticks):
        sim.advance(5.0)
        now += 5.0
        ctl.scrape("a", now)
        ctl.fit("default", now)
        ctl.decide("a", now)
    return now


def _serve(sim: SimulatedServer, found: PolicyTable | None) -> Loopback:
    if found is not None:
        assert sim.set_internal_state(push_body(found), None)[0] == 200
    return Loopback(create_app(sim)).start()


def _gauge(ctl: Controller, name: str, **labels: str) -> float | None:
    value: float | None = ctl.metrics.registry.get_sample_value(name, labels)
    return value


def test_an_empty_store_keeps_a_found_table_it_has_no_evidence_against(tmp_path):
    """d4 runs 16 streams about 16% slower than d1 here, but nothing measures d1."""
    sim = new_sim(concurrency=16)
    found = PolicyTable.build([Tier(1, 4), Tier(24, 2, hysteresis=3)], version=7)
    lb = _serve(sim, found)
    try:
        ctl, store = controller_for(tmp_path, [{"name": "a", "url": lb.url}], **FAST)
        now = _run(ctl, sim, 60)  # 5 simulated minutes, 60 decisions with a fitted model
        assert ctl.groups["default"].fitted_at is not None
        fitted = _gauge(ctl, "specctl_daemon_last_fit_timestamp_seconds", group="default")
        assert fitted == now
        stored = _gauge(ctl, "specctl_daemon_store_samples", target="a")
        assert stored == store.count_samples("a") > 0
        assert _gauge(ctl, "specctl_daemon_probe_share", target="a") == 0.0  # none to run
        assert store.pushes("a") == []
        assert sim.specctl_state()["table"] == found.to_json()
        assert _gauge(ctl, "specctl_daemon_kept_found_table", target="a") == 1.0
        assert _gauge(ctl, "specctl_daemon_live_table_version", target="a") == 7.0
        assert _gauge(ctl, "specctl_daemon_live_tiers", target="a") == 2.0
        assert _gauge(ctl, "specctl_daemon_live_probe_tiers", target="a") == 0.0
        ctl.close()
    finally:
        lb.stop()


def test_a_found_table_is_replaced_once_the_model_predicts_a_gain_over_it(tmp_path):
    """Its own probes give the model evidence for depth 1, which beats drafting off by ~9% at
    16 streams on this profile (`specctl sim sweep`)."""
    sim = new_sim(concurrency=16)
    found = PolicyTable.build([Tier(1, 0, explore_share=0.3, explore_depths=(1,))], version=5)
    lb = _serve(sim, found)
    try:
        ctl, store = controller_for(tmp_path, [{"name": "a", "url": lb.url}], **FAST)
        _run(ctl, sim, 3)  # the first samples: measured under the found table
        probing = _gauge(ctl, "specctl_daemon_probe_share", target="a")
        assert probing is not None and 0.15 < probing < 0.5  # the found table's 30%
        _run(ctl, sim, 57, start=15.0)
        pushes = store.pushes("a")
        assert pushes, "the daemon never replaced the found table"
        first = pushes[0]
        assert first.kind == "learned" and "push: predicted +" in first.reason, first.reason
        assert _gauge(ctl, "specctl_daemon_push_reasons_total", target="a", reason="gain") >= 1
        evidence = _gauge(ctl, "specctl_daemon_push_reasons_total", target="a", reason="evidence")
        assert evidence is None
        ctl.close()
    finally:
        lb.stop()


def test_a_released_server_is_taken_over_as_before(tmp_path):
    sim = new_sim(concurrency=16)
    lb = _serve(sim, None)
    try:
        ctl, store = controller_for(tmp_path, [{"name": "a", "url": lb.url}], **FAST)
        _run(ctl, sim, 6)
        pushes = store.pushes("a")
        assert pushes and pushes[0].kind == "learned"
        assert _gauge(ctl, "specctl_daemon_push_reasons_total", target="a", reason="takeover") == 1
        assert _gauge(ctl, "specctl_daemon_kept_found_table", target="a") == 0.0
        ctl.close()
    finally:
        lb.stop()


def test_a_restarted_daemon_knows_its_own_table_from_its_store(tmp_path):
    """Its own table (with probes) is not a found table: it goes on learning as before."""
    sim = new_sim(concurrency=16)
    lb = _serve(sim, None)
    try:
        ctl, store = controller_for(tmp_path, [{"name": "a", "url": lb.url}], **FAST)
        now = _run(ctl, sim, 6)
        live: dict[str, Any] = sim.specctl_state()["table"]
        assert live is not None and store.pushes("a")
        ctl.close()  # killed: no hand-back, its table stays
        again, _ = controller_for(tmp_path, [{"name": "a", "url": lb.url}], **FAST)
        again.start(now)
        assert _gauge(again, "specctl_daemon_kept_found_table", target="a") == 0.0
        found = again.targets["a"].found
        assert found is not None and found.table is not None
        assert found.table.to_json() == live
        again.close()
    finally:
        lb.stop()
