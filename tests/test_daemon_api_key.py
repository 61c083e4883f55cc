"""The daemon against a server started with SGLang's `--api-key` (and an admin key).

A simulated server over loopback HTTP that checks both keys as SGLang 0.5.23 does, behind an
ASGI wrapper noting the Authorization header of every request; a real SQLite store. The API key
comes from $SPECCTL_API_KEY (no `api_key` in the config): every read carries it, the push
carries the admin key.
"""

from __future__ import annotations

from typing import Any

import pytest
from test_daemon_http import Loopback, controller_for

from controller.daemon.config import parse_config
from sims.http import create_app
from sims.profile import load_profile
from sims.server import SimulatedServer
from sims.workload import Workload

API_KEY_ENV = "SPECCTL_API_KEY"  # the variable `specctl smoke` and the other commands read


class RecordAuth:
    """ASGI wrapper noting (method, path, Authorization header) of every HTTP request."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.seen: list[tuple[str, str, str | None]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") == "http":
            headers = dict(scope.get("headers") or [])
            auth = headers.get(b"authorization")
            self.seen.append((scope["method"], scope["path"], auth and auth.decode()))
        await self.app(scope, receive, send)


def test_the_api_key_from_the_environment_goes_on_every_read_and_the_admin_key_on_pushes(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(API_KEY_ENV, "api-k")
    sim = SimulatedServer(
        load_profile("kimi-k25-8x-rtxpro6000-pcie"),
        Workload.closed(16),
        api_key="api-k",
        admin_key="adm-k",
    )
    front = RecordAuth(create_app(sim))
    lb = Loopback(front).start()  # type: ignore[arg-type]
    try:
        ctl, store = controller_for(
            tmp_path,
            [{"name": "a", "url": lb.url, "admin_key": "adm-k"}],
            guardrails={"min_dwell_s": 0.0},
        )
        now = 0.0
        for _ in range(6):
            sim.advance(5.0)
            now += 5.0
            ctl.scrape("a", now)
            ctl.fit("default", now)
            ctl.decide("a", now)
        ctl.close()
    finally:
        lb.stop()
    pushes = store.pushes("a")
    assert pushes and pushes[0].outcome in ("pending", "good"), pushes
    reads = {(m, p, a) for m, p, a in front.seen if m == "GET"}
    assert {p for _, p, _ in reads} == {"/metrics", "/server_info"}
    assert {a for _, _, a in reads} == {"Bearer api-k"}
    writes = {(p, a) for m, p, a in front.seen if m == "POST"}
    assert writes == {("/set_internal_state", "Bearer adm-k")}


def test_a_key_named_in_the_config_wins_over_the_environment(monkeypatch) -> None:
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    cfg = parse_config({"targets": [{"name": "a", "url": "http://127.0.0.1:1", "api_key": "x"}]})
    assert cfg.targets[0].resolved_api_key() == "x"
    monkeypatch.setenv("OTHER_KEY", "y")
    cfg = parse_config(
        {"targets": [{"name": "a", "url": "http://127.0.0.1:1", "api_key_env": "OTHER_KEY"}]}
    )
    assert cfg.targets[0].resolved_api_key() == "y"
    # Without an admin key, pushes carry the API key (SGLang's rule for admin routes).
    cfg = parse_config({"targets": [{"name": "a", "url": "http://127.0.0.1:1"}]})
    assert cfg.targets[0].resolved_admin_key() == "from-env"
