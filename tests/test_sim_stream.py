"""The simulated server hands each request's events to its HTTP handler when they are due,
on both event loops a served simulation runs on: asyncio's and uvloop's (what uvicorn picks
where uvloop is installed, as in an SGLang environment). uvloop rounds a timer's delay to whole
milliseconds, so it runs some timers early; the last event of a request must still arrive."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

from sims.http import _Stream
from sims.profile import load_profile
from sims.server import SimulatedServer
from sims.workload import Workload


def _server_on_the_wall_clock() -> SimulatedServer:
    server = SimulatedServer(load_profile("h200-llama8b-eagle3"), Workload.closed(0.0), seed=0)
    server.wall_time_of = lambda sim_time: sim_time  # simulated time is monotonic wall time
    return server


async def _last_events_arrive(runs: int) -> list[float]:
    """Per run, one request's only event (its finish) pushed from another thread, due a
    fraction of a millisecond ahead; returns how late each arrived (seconds)."""
    loop = asyncio.get_running_loop()
    server = _server_on_the_wall_clock()
    late = []
    for i in range(runs):
        stream = _Stream(loop, server)
        due = time.monotonic() + 0.0002 + 0.0001 * (i % 8)
        pusher = threading.Thread(target=stream.on_done, args=(due, "length"))
        pusher.start()
        kind, _, sim_time = await asyncio.wait_for(stream.queue.get(), timeout=1.0)
        pusher.join()
        assert (kind, sim_time) == ("done:length", due)
        late.append(time.monotonic() - due)
    return late


Runner = Callable[[Coroutine[Any, Any, list[float]]], list[float]]


@pytest.mark.parametrize("run", [asyncio.run, uvloop.run], ids=["asyncio", "uvloop"])
def test_a_requests_last_event_arrives_when_due(run: Runner) -> None:
    late = run(_last_events_arrive(40))
    # All 40 arrived, none held back for another push that never comes (each wait ends at 1 s:
    # an event that only a later push would release fails there, whatever the machine's load).
    assert len(late) == 40
    assert min(late) >= 0.0  # and never before its time


def test_events_keep_their_order_and_times() -> None:
    async def scenario() -> list[tuple[str, int, float]]:
        loop = asyncio.get_running_loop()
        stream = _Stream(loop, _server_on_the_wall_clock())
        start = time.monotonic()
        times = [start + 0.001 * k for k in (1, 3, 3, 6)]

        def push() -> None:
            for count, t in enumerate(times[:-1], start=1):
                stream.on_tokens(count, t)
            stream.on_done(times[-1], "stop")

        threading.Thread(target=push).start()
        got = [await asyncio.wait_for(stream.queue.get(), timeout=1.0) for _ in times]
        assert time.monotonic() >= times[-1]
        return got

    got = uvloop.run(scenario())
    assert [kind for kind, _, _ in got] == ["tokens", "tokens", "tokens", "done:stop"]
    assert [count for _, count, _ in got[:3]] == [1, 2, 3]
    assert [t for _, _, t in got] == sorted(t for _, _, t in got)
