"""The daemon over real loopback HTTP against simulated servers, with faults injected.

`FaultyFront` is a small FastAPI app in front of a real `SimulatedServer`: /metrics,
/server_info and /set_internal_state are the simulator's own answers, except when a test
switches /metrics to a fault (garbage text, NaN values, HTTP 500, a hang past the timeout).
The simulator's clock is advanced by the test itself (no clock thread), so every counter value
is known exactly and "no sample lost" is checked to the token.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from controller.daemon.config import parse_config
from controller.daemon.loop import Controller
from controller.daemon.own_metrics import DaemonMetrics
from controller.daemon.push import send_table
from controller.daemon.runner import build_transports, run_wall
from controller.daemon.scrape import split_key
from controller.daemon.store import Store
from controller.daemon.transport import HttpTransport
from sglang_hooks.contract import (
    METRIC_ITERATIONS,
    METRIC_TOKENS,
    PolicyTable,
    Tier,
    single_depth_table,
)
from sims.http import create_app
from sims.profile import load_profile
from sims.server import SimulatedServer
from sims.workload import Workload

PROFILE = "kimi-k25-8x-rtxpro6000-pcie"


class Loopback:
    """uvicorn serving `app` on 127.0.0.1 (a free port, or `port`) from a thread."""

    def __init__(self, app: FastAPI, port: int = 0) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.port = self.sock.getsockname()[1]
        cfg = uvicorn.Config(app, log_level="error", access_log=False, lifespan="off")
        self.server = uvicorn.Server(cfg)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Loopback:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "loopback server did not start"
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.sock.close()


def new_sim(concurrency: float = 16, seed: int = 0, admin_key: str | None = None):
    return SimulatedServer(
        load_profile(PROFILE), Workload.closed(concurrency), seed=seed, admin_key=admin_key
    )


class FaultyFront:
    """A simulated server's HTTP face with switchable /metrics faults."""

    def __init__(self, sim: SimulatedServer) -> None:
        self.sim = sim
        self.mode = "ok"  # ok | garbage | nan | http500 | hang
        app = FastAPI()

        @app.get("/metrics")
        async def metrics() -> Response:
            if self.mode == "garbage":
                return Response("<html>502 Bad Gateway</html>{{{\n", media_type="text/plain")
            if self.mode == "nan":
                text = self.sim.metrics_text()
                lines = [
                    (ln.rsplit(" ", 1)[0] + " NaN") if ln.startswith("specctl_decode_tok") else ln
                    for ln in text.splitlines()
                ]
                return Response("\n".join(lines) + "\n", media_type="text/plain")
            if self.mode == "http500":
                return Response("internal error", status_code=500)
            if self.mode == "hang":
                await asyncio.sleep(3.0)
            return Response(self.sim.metrics_text(), media_type="text/plain")

        @app.get("/server_info")
        async def server_info() -> dict[str, Any]:
            if self.mode == "hang":
                await asyncio.sleep(3.0)
            return self.sim.server_info()

        @app.post("/set_internal_state")
        async def set_internal_state(request: Request) -> JSONResponse:
            status, body = self.sim.set_internal_state(
                await request.json(), request.headers.get("authorization")
            )
            return JSONResponse(status_code=status, content=body)

        self.app = app


@pytest.fixture
def loopbacks() -> Iterator[list[Loopback]]:
    started: list[Loopback] = []
    yield started
    for lb in started:
        lb.stop()


def serve(loopbacks: list[Loopback], app: FastAPI, port: int = 0) -> Loopback:
    lb = Loopback(app, port).start()
    loopbacks.append(lb)
    return lb


def controller_for(
    tmp_path: Path, targets: list[dict[str, Any]], **sections: Any
) -> tuple[Controller, Store]:
    data: dict[str, Any] = {
        "targets": [{"timeout_s": 1.0, **t} for t in targets],
        "store": {"path": str(tmp_path / "store.sqlite")},
        "metrics": {"enabled": False},
        **sections,
    }
    cfg = parse_config(data)
    transports, _ = build_transports(cfg)
    store = Store(cfg.store.resolved_path())
    return Controller(cfg, store, transports, metrics=DaemonMetrics()), store


def family_total(values: dict[str, float], family: str) -> float:
    return sum(v for k, v in values.items() if split_key(k)[0] == family)


def stored(store: Store, target: str, family: str) -> float:
    col = {METRIC_TOKENS: "tokens", METRIC_ITERATIONS: "iterations"}[family]
    return store.totals(target)[col]


def sim_total(sim: SimulatedServer, index: int) -> float:
    return sum(v[index] for v in sim.engine.counters.values())


# ----------------------------------------------------------------------------- tests


def test_garbage_nan_500_and_timeout_store_nothing_and_lose_nothing(tmp_path, loopbacks):
    sim = new_sim()
    front = FaultyFront(sim)
    lb = serve(loopbacks, front.app)
    ctl, store = controller_for(tmp_path, [{"name": "a", "url": lb.url, "timeout_s": 0.5}])
    sim.advance(20)
    base_tokens, base_iters = sim_total(sim, 2), sim_total(sim, 0)
    now = 0.0
    ctl.scrape("a", now)  # baseline
    for mode in ("garbage", "http500", "hang"):
        sim.advance(10)
        front.mode = mode
        now += 1000  # past any back-off
        assert ctl.scrape("a", now) == []
        front.mode = "ok"
    errors = {
        s.labels["kind"]: s.value
        for m in ctl.metrics.registry.collect()
        if m.name == "specctl_daemon_scrape_errors"
        for s in m.samples
        if s.name.endswith("_total")
    }
    assert errors == {"parse": 1.0, "http_status": 1.0, "timeout": 1.0}
    assert store.count_samples() == 0
    # NaN token counters: those series and the rest of their cells are dropped; nothing moves.
    sim.advance(10)
    front.mode = "nan"
    now += 1000
    assert ctl.scrape("a", now) == []
    assert ctl.metrics.scrape_errors.labels("a", "garbage")._value.get() == 1
    front.mode = "ok"
    now += 1000
    assert ctl.scrape("a", now)  # the next good scrape covers every interval since baseline
    assert stored(store, "a", METRIC_TOKENS) == pytest.approx(sim_total(sim, 2) - base_tokens)
    assert stored(store, "a", METRIC_ITERATIONS) == pytest.approx(sim_total(sim, 0) - base_iters)
    ctl.close()


def test_server_restart_resets_counters_and_nothing_is_double_counted(tmp_path, loopbacks):
    sim_a = new_sim(seed=1)
    lb_a = serve(loopbacks, create_app(sim_a))
    port = lb_a.port
    ctl, store = controller_for(tmp_path, [{"name": "a", "url": lb_a.url}])
    sim_a.advance(20)
    ctl.scrape("a", 10.0)
    a_base = sim_total(sim_a, 2)
    sim_a.advance(30)
    ctl.scrape("a", 20.0)
    a_last = sim_total(sim_a, 2)
    lb_a.stop()
    loopbacks.remove(lb_a)
    assert ctl.scrape("a", 30.0) == []  # down: counted, backed off, no crash
    sim_b = new_sim(seed=2)  # the restarted server: counters from zero
    serve(loopbacks, create_app(sim_b), port=port)
    sim_b.advance(15)
    ctl.scrape("a", 100.0)
    resets = ctl.metrics.counter_resets.labels("a")._value.get()
    assert resets == 1
    expected = (a_last - a_base) + sim_total(sim_b, 2)
    assert stored(store, "a", METRIC_TOKENS) == pytest.approx(expected)
    ctl.close()


def test_refused_push_is_logged_with_the_reason_and_not_retried(tmp_path, loopbacks, caplog):
    sim = new_sim(admin_key="right-key")
    lb = serve(loopbacks, create_app(sim))
    ctl, store = controller_for(
        tmp_path,
        [{"name": "a", "url": lb.url, "admin_key": "wrong-key"}],
        guardrails={"refused_backoff_s": 300},
    )
    st = ctl.targets["a"]
    st.live = None
    event = ctl._push(st, 0.0, single_depth_table(1, 1), kind="learned", reason="t", predicted=None)
    assert event.outcome == "unauthorized"
    rec = store.pushes("a")[-1]
    assert rec.outcome == "unauthorized" and "401" in (rec.detail or "")
    assert st.refused_until == 300.0
    # The decide step respects the back-off: nothing is sent again before it expires.
    assert ctl.decide("a", 10.0) is None
    assert len(store.pushes("a")) == 1
    assert sim.specctl_state()["table"] is None
    ctl.close()


def test_invalid_table_is_refused_by_the_server_with_the_field(loopbacks):
    sim = new_sim()  # captures depths 0-4
    lb = serve(loopbacks, create_app(sim))
    t = HttpTransport(lb.url, 2.0)
    bad = PolicyTable.build([Tier(1, 7)])  # valid shape, depth not captured
    res = send_table(t, bad, None)
    assert res.outcome == "refused" and res.status == 400
    assert "specctl_t0_depth" in res.detail and "not captured" in res.detail
    t.close()


def test_unreachable_target_backs_off_and_never_blocks_the_others(tmp_path, loopbacks):
    sim = new_sim()
    good = serve(loopbacks, create_app(sim))
    stuck_sim = new_sim()
    stuck = FaultyFront(stuck_sim)
    stuck.mode = "hang"
    stuck_lb = serve(loopbacks, stuck.app)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]
    ctl, store = controller_for(
        tmp_path,
        [
            {"name": "good", "url": good.url},
            {"name": "stuck", "url": stuck_lb.url, "timeout_s": 0.3},
            {"name": "dead", "url": f"http://127.0.0.1:{dead_port}", "group": "other"},
        ],
        schedule={"scrape_interval_s": 0.2, "fit_interval_s": 100, "decide_interval_s": 100},
    )
    stop = threading.Event()
    runner = threading.Thread(target=run_wall, args=(ctl,), kwargs={"stop": stop})
    runner.start()
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        sim.advance(2.0)  # the good server keeps decoding
        time.sleep(0.1)
    stop.set()
    runner.join(timeout=10)
    assert not runner.is_alive()
    assert store.count_samples("good") > 5
    assert store.count_samples("stuck") == 0 and store.count_samples("dead") == 0
    kinds = {
        (s.labels["target"], s.labels["kind"])
        for m in ctl.metrics.registry.collect()
        if m.name == "specctl_daemon_scrape_errors"
        for s in m.samples
        if s.name.endswith("_total") and s.value > 0
    }
    assert ("stuck", "timeout") in kinds and ("dead", "unreachable") in kinds
    # Back-off: the dead target was tried far fewer times than the good one was scraped.
    dead_tries = ctl.metrics.scrape_errors.labels("dead", "unreachable")._value.get()
    good_scrapes = ctl.metrics.scrapes.labels("good")._value.get()
    assert dead_tries < good_scrapes / 2
    ctl.close()


def test_frozen_policy_is_pushed_and_re_pushed_after_a_server_restart(tmp_path, loopbacks):
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "table:\n  version: 5\n  tiers:\n"
        "    - {min_batch: 1, depth: 2}\n    - {min_batch: 24, depth: 0, hysteresis: 3}\n"
        "provenance: {created_by: test}\n"
    )
    sim = new_sim()
    lb = serve(loopbacks, create_app(sim))
    ctl, store = controller_for(tmp_path, [{"name": "a", "url": lb.url}], frozen_policy=str(policy))
    first = ctl.decide("a", 0.0)
    assert first is not None and first.outcome == "applied" and first.kind == "frozen"
    assert sim.specctl_state()["table"]["version"] == 5
    assert ctl.decide("a", 100.0) is None  # in place: nothing to do
    port = lb.port
    lb.stop()
    loopbacks.remove(lb)
    restarted = new_sim(seed=3)  # lost the pushed table
    serve(loopbacks, create_app(restarted), port=port)
    again = ctl.decide("a", 200.0)
    assert again is not None and again.outcome == "applied"
    assert "re-pushed" in again.reason
    assert restarted.specctl_state()["table"]["tiers"][1]["min_batch"] == 24
    assert [p.kind for p in store.pushes("a")] == ["frozen", "frozen"]
    ctl.close()


def test_daemon_metrics_endpoint_reports_per_target(tmp_path, loopbacks):
    sim = new_sim()
    lb = serve(loopbacks, create_app(sim))
    ctl, _store = controller_for(tmp_path, [{"name": "a", "url": lb.url}])
    port = ctl.metrics.serve("127.0.0.1", 0)
    sim.advance(20)
    ctl.scrape("a", 0.0)
    sim.advance(20)
    ctl.scrape("a", 5.0)
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    assert 'specctl_daemon_samples_stored_total{target="a"}' in text
    assert 'specctl_daemon_scrapes_total{target="a"} 2.0' in text
    ctl.close()
