"""Shared fixtures: a real simulated SGLang server on a free loopback port.

`sim_server` starts what `specctl sim serve` starts (a `SimulatedServer` wrapped by
`sims.http.create_app`, uvicorn on 127.0.0.1, the simulated clock advanced by a background
thread) and yields a `SimHandle`:

    handle.base_url   "http://127.0.0.1:<port>"  (real HTTP, use httpx)
    handle.server     the SimulatedServer behind it (read stats(), set_concurrency(), ...)

Defaults: the Kimi-K2.5 profile, no keys, speedup 50 (50 simulated seconds per wall second),
no background load, seed 0. Change them with indirect parametrisation:

    @pytest.mark.parametrize("sim_server", [{"admin_key": "k", "speedup": 100}], indirect=True)
    def test_x(sim_server): ...

Recognised keys: profile (name or path), admin_key, api_key, speedup, concurrency (closed-loop
background clients), seed, speculative, device_timer, record (note every POST's path and JSON
body, in arrival order, in `handle.posts`, and its headers in `handle.post_headers`), shapes
(a shape server capturing these profile shapes, as `specctl sim serve --shapes`). For
several servers in one test, or options chosen inside the test, use the `sim_server_factory`
fixture:
`factory(**same_keys) -> SimHandle`.
Every server is stopped at teardown.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from asgi_record import RecordPosts

from sims.http import ServedSimulation
from sims.profile import load_profile
from sims.server import SimulatedServer
from sims.workload import Workload

DEFAULT_PROFILE = "kimi-k25-8x-rtxpro6000-pcie"


@dataclass
class SimHandle:
    base_url: str
    server: SimulatedServer
    served: ServedSimulation
    posts: list[tuple[str, Any]] = field(default_factory=list)
    post_headers: list[tuple[str, dict[str, str]]] = field(default_factory=list)


def _start(
    profile: str = DEFAULT_PROFILE,
    admin_key: str | None = None,
    api_key: str | None = None,
    speedup: float = 50.0,
    concurrency: float = 0.0,
    seed: int = 0,
    speculative: bool = True,
    device_timer: bool = False,
    record: bool = False,
    shapes: list[str] | None = None,
) -> SimHandle:
    server = SimulatedServer(
        load_profile(profile),
        Workload.closed(concurrency),
        seed=seed,
        admin_key=admin_key,
        api_key=api_key,
        speculative=speculative,
        device_timer=device_timer,
        shapes=shapes,
    )
    served = ServedSimulation(server, speedup=speedup)
    posts: list[tuple[str, Any]] = []
    headers: list[tuple[str, dict[str, str]]] = []
    if record:
        served.uvicorn.config.app = RecordPosts(served.uvicorn.config.app, posts, headers)
    return SimHandle(served.start(), server, served, posts, headers)


@pytest.fixture
def sim_server_factory() -> Iterator[Callable[..., SimHandle]]:
    started: list[SimHandle] = []

    def factory(**options: Any) -> SimHandle:
        handle = _start(**options)
        started.append(handle)
        return handle

    yield factory
    for handle in started:
        handle.served.stop()


@pytest.fixture
def sim_server(request: pytest.FixtureRequest) -> Iterator[SimHandle]:
    options = getattr(request, "param", None) or {}
    handle = _start(**options)
    try:
        yield handle
    finally:
        handle.served.stop()
