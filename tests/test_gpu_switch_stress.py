"""The switch stress's load threads: how long stopping them may wait, and a request that
never answers counted as stuck. Real HTTP over loopback: a socket server that accepts and
never replies stands for a server that lost a request."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from benchmarks.gpu.greedy import GreedyPrompt
from benchmarks.gpu.switch_stress import (
    GREEDY_RESERVE_S,
    MIN_JOIN_S,
    REQUEST_TIMEOUT_S,
    LoadThreads,
    join_wait,
)


def test_joining_keeps_the_greedy_checks_share_of_the_budget() -> None:
    assert join_wait(None, 0.0) == REQUEST_TIMEOUT_S
    assert join_wait(1000.0, 0.0) == REQUEST_TIMEOUT_S
    assert join_wait(100.0, 50.0) == pytest.approx(50.0 - GREEDY_RESERVE_S)
    assert join_wait(100.0, 95.0) == MIN_JOIN_S  # past the reserve: a short wait still


@pytest.fixture
def silent_server() -> Iterator[tuple[str, list[socket.socket]]]:
    """Accepts connections and reads, never answers; the URL and the connections it holds."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    held: list[socket.socket] = []
    done = threading.Event()

    def accept() -> None:
        sock.settimeout(0.2)
        while not done.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                continue
            held.append(conn)

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{sock.getsockname()[1]}", held
    done.set()
    t.join(timeout=2)
    for conn in held:
        conn.close()
    sock.close()


def test_a_request_that_never_answers_is_a_stuck_thread(
    silent_server: tuple[str, list[socket.socket]],
) -> None:
    url, held = silent_server
    prompt = GreedyPrompt(name="p", input_ids=(1, 2, 3))
    load = LoadThreads(url, [prompt], concurrency=2, max_new_tokens=4).start()
    # both requests in flight (a fixed sleep left one thread unstarted on a busy machine)
    deadline = time.monotonic() + 10.0
    while len(held) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.1)  # the request written after the connection
    t0 = time.monotonic()
    assert load.stop(timeout_s=0.5) == 2
    assert time.monotonic() - t0 < 2.0
    assert load.completed == 0
