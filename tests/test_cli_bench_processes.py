"""A level split across worker processes, over loopback against the served simulator: it
counts every request the server served and sends the arrivals one process would."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from controller.bench.load_processes import LoadProcesses, merge, peak_in_flight, split_shape
from controller.bench.loadgen import (
    ClosedLoop,
    LevelLoad,
    OpenLoop,
    RequestResult,
    ShareLoad,
    StopRule,
    make_client,
    run_level,
)
from controller.bench.metrics import parse_scrape
from controller.bench.prompts import synthetic_prompts

OUTPUT_TOKENS = 64


def busy(url: str) -> float:
    gauges = parse_scrape(httpx.get(f"{url}/metrics", timeout=5).text).gauges
    return gauges["sglang:num_running_reqs"] + gauges.get("sglang:num_queue_reqs", 0.0)


def wait_idle(url: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while busy(url) != 0:
        assert time.monotonic() < deadline, f"{url} still busy after {timeout_s} s"
        time.sleep(0.05)


def result(start: float, end: float, complete: bool = True) -> RequestResult:
    return RequestResult(start, end, 0.01, end, 4, complete)


# ----------------------------------------------------------------------------- the parts


def test_streams_caps_and_arrivals_are_dealt_evenly() -> None:
    assert [s.concurrency for s in split_shape(ClosedLoop(64), 3)] == [22, 21, 21]  # type: ignore[union-attr]
    capped = split_shape(OpenLoop(8.0, 0.5, max_concurrency=5), 2)
    assert [(s.rate, s.burstiness, s.max_concurrency) for s in capped] == [  # type: ignore[union-attr]
        (8.0, 0.5, 3), (8.0, 0.5, 2),
    ]  # fmt: skip
    assert [s.max_concurrency for s in split_shape(OpenLoop(8.0), 4)] == [None] * 4  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="2 streams for 3 processes"):
        split_shape(ClosedLoop(2), 3)


def test_shares_are_merged_on_one_clock() -> None:
    """Two shares whose windows opened 0.3 s apart on their own clocks: after the merge each
    request sits where it was relative to its share's window, and every count adds up."""
    # (Their own peaks are ignored: the merge counts open streams from the requests.)
    a = ShareLoad(window_start_s=1.0, elapsed_s=2.0, tokens=40, cpu_s=0.5, peak_in_flight=9,
                  started=3, requests=(result(0.2, 0.9), result(1.1, 2.5), result(2.6, 3.2, False)))
    b = ShareLoad(window_start_s=1.3, elapsed_s=2.0, tokens=60, cpu_s=0.7, peak_in_flight=9,
                  started=2, requests=(result(1.4, 2.0), result(1.9, 3.5, False)))  # fmt: skip
    load = merge(OpenLoop(4.0), [a, b], window_start_s=1.0, elapsed_s=2.0)
    assert isinstance(load, LevelLoad)
    assert load.tokens == 100 and load.client_cpu_s == pytest.approx(1.2)
    assert load.process_cpu_s == (0.5, 0.7)
    assert len(load.requests) == 5
    # b's requests moved 0.3 s earlier: (1.1, 1.7) and (1.6, 3.2), the second cut.
    assert sorted((round(r.start_s, 3), round(r.end_s, 3)) for r in load.completed) == [
        (1.1, 1.7), (1.1, 2.5),
    ]  # fmt: skip
    assert load.concurrency == 3  # at 1.6: a's (1.1, 2.5) and both of b's
    assert load.output_tok_per_s == pytest.approx(50.0)


def test_peak_in_flight_counts_overlaps_inside_the_window_only() -> None:
    requests = [result(0.0, 1.5), result(0.5, 0.8), result(1.2, 2.0), result(2.5, 3.0)]
    assert peak_in_flight(requests, 1.0, 2.2) == 2  # open at 1.0: the first; then the third
    assert peak_in_flight(requests, 0.0, 3.0) == 2
    assert peak_in_flight(requests, 2.1, 2.4) == 0
    # An end and a start at the same instant are not both open.
    assert peak_in_flight([result(0.0, 1.0), result(1.0, 2.0)], 0.5, 1.5) == 1


# ----------------------------------------------------------------------------- over loopback


def _one_process(url: str, shape: ClosedLoop | OpenLoop, stop: StopRule, seed: int) -> LevelLoad:
    prompts = synthetic_prompts(512, 32, OUTPUT_TOKENS)

    async def go() -> LevelLoad:
        async with make_client(url, 16) as http:
            return await run_level(http, prompts, shape, stop, seed=seed)

    return asyncio.run(go())


@pytest.mark.parametrize("sim_server", [{"speedup": 5}], indirect=True)
def test_two_processes_count_every_request_the_server_served(sim_server) -> None:
    url, server = sim_server.base_url, sim_server.server
    prompts = synthetic_prompts(512, 32, OUTPUT_TOKENS)
    shape, stop = ClosedLoop(4), StopRule(duration_s=2.0, warmup_s=0.5)
    with LoadProcesses(2, prompts) as processes:
        before = server.stats()
        load, next_offset = asyncio.run(processes.run_level(url, shape, stop, prompt_offset=7))
        wait_idle(url)
        after = server.stats()
        # The next level on the same processes: the window's count ends it this time.
        counted, _ = asyncio.run(
            processes.run_level(url, shape, StopRule(requests=6, warmup_s=0.2))
        )
    served = after.completed_requests - before.completed_requests
    reached = after.submitted_requests - before.submitted_requests
    complete = [r for r in load.requests if r.complete]
    cut = [r for r in load.requests if not r.complete and r.error is None]
    assert not [r for r in load.requests if r.error is not None]
    assert len(load.process_cpu_s) == 2 and all(cpu > 0 for cpu in load.process_cpu_s)
    # Each of the 4 streams had at most one request open at the cut; every request the server
    # finished was read to its end, except those it finished as the client cut them.
    assert len(cut) <= 4
    assert len(complete) <= served <= len(complete) + len(cut)
    assert len(load.requests) - len(cut) <= reached <= len(load.requests)
    assert all(r.output_tokens == OUTPUT_TOKENS for r in complete)
    assert len(load.completed) >= 8 and load.concurrency == 4
    assert all(r.start_s >= load.warmup_s for r in load.completed)
    assert load.warmup_s == pytest.approx(0.5, abs=0.1)
    assert 2.0 <= load.elapsed_s <= 2.3
    # Prompts: past every one either process sent (they take every other one).
    assert next_offset >= 7 + len(load.requests) and next_offset % 2 == 1
    assert 6 <= len(counted.completed) <= 6 + 3  # the other streams' last chunk may race it


@pytest.mark.parametrize("sim_server", [{"speedup": 5}], indirect=True)
def test_split_arrivals_are_the_arrivals_of_one_process(sim_server) -> None:
    """The same seed gives the same arrival schedule: two processes dealing it send as many
    requests in the same window as one process does (each sending all would double it)."""
    url = sim_server.base_url
    shape, stop = OpenLoop(rate=12.0, burstiness=0.5), StopRule(duration_s=2.0, warmup_s=0.3)
    one = _one_process(url, shape, stop, seed=11)
    wait_idle(url)
    with LoadProcesses(2, synthetic_prompts(512, 32, OUTPUT_TOKENS)) as processes:
        two, _ = asyncio.run(processes.run_level(url, shape, stop, seed=11))
    sent_one = [r for r in one.requests if r.start_s < one.warmup_s + one.elapsed_s]
    sent_two = [r for r in two.requests if r.start_s < two.warmup_s + two.elapsed_s]
    assert len(sent_one) >= 10
    assert abs(len(sent_two) - len(sent_one)) <= 2  # an arrival at either edge of the window
