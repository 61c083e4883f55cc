"""One bench level against the served simulator over loopback: warm-up, the cut at the end of the
window, the drain before the next level, open-loop arrivals and inter-token latency."""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Iterator

import httpx
import pytest
from loopback_http import QuietHandler, serving

from controller.bench.loadgen import ClosedLoop, OpenLoop, StopRule, make_client, run_level
from controller.bench.metrics import parse_scrape
from controller.bench.prompts import Prompt, synthetic_prompts
from controller.bench.sweep import (
    LevelObserver,
    LevelResult,
    SweepPlan,
    run_sweep,
)
from sglang_hooks.contract import parse_table, push_body

KEY = "levels-key"


class Recorder(LevelObserver):
    def __init__(self) -> None:
        self.warnings: list[str] = []
        self.finished: list[LevelResult] = []

    def warning(self, text: str) -> None:
        self.warnings.append(text)

    def level_finished(self, result: LevelResult) -> None:
        self.finished.append(result)


def running_gauge(url: str) -> float:
    return parse_scrape(httpx.get(f"{url}/metrics", timeout=5).text).gauges[
        "sglang:num_running_reqs"
    ]


def level(url: str, shape, stop: StopRule, output_tokens: int = 24, **kw):  # type: ignore[no-untyped-def]
    prompts = synthetic_prompts(512, 32, output_tokens)

    async def go():  # type: ignore[no-untyped-def]
        async with make_client(url, 64) as http:
            return await run_level(http, prompts, shape, stop, **kw)

    return asyncio.run(go())


@pytest.mark.parametrize("sim_server", [{"speedup": 5}], indirect=True)
def test_a_closed_stream_is_aborted_and_the_idle_server_reads_zero_running(sim_server) -> None:
    """The simulator does what SGLang does with a closed stream, and publishes its idle gauges
    at once (the bench's drain relies on both)."""
    url = sim_server.base_url
    load = level(url, ClosedLoop(8), StopRule(duration_s=0.6, warmup_s=0), output_tokens=4000)
    cut = [r for r in load.requests if not r.complete]
    assert len(cut) == 8 and all(r.output_tokens > 0 for r in cut)  # cut mid-stream
    deadline = time.monotonic() + 5
    while running_gauge(url) != 0:
        assert time.monotonic() < deadline, "the running gauge never went back to 0"
        time.sleep(0.02)
    stats = sim_server.server.stats()
    assert stats.aborted_requests == 8 and sim_server.server.engine.n == 0


@pytest.mark.parametrize("sim_server", [{"speedup": 50}], indirect=True)
def test_a_closed_loop_once_sends_each_prompt_once(sim_server) -> None:
    """Cycling streams send replacements until the last request completes; `once` sends the
    prompts and no more (an off spell's arm must not start requests after its push)."""
    prompts = synthetic_prompts(5, 8, 6)
    # uneven lengths: the streams free up one by one, and a cycling loop would refill them
    prompts = [Prompt(p.text, 6 + 40 * i) for i, p in enumerate(prompts)]

    async def go(shape: ClosedLoop):  # type: ignore[no-untyped-def]
        async with make_client(sim_server.base_url, 8) as http:
            return await run_level(http, prompts, shape, StopRule(requests=5, warmup_s=0))

    once = asyncio.run(go(ClosedLoop(3, once=True)))
    assert len(once.requests) == 5 and all(r.complete for r in once.requests)
    assert sorted(r.output_tokens for r in once.requests) == [6, 46, 86, 126, 166]
    cycling = asyncio.run(go(ClosedLoop(3)))
    assert len(cycling.requests) > 5  # the contrast: replacements, cut at the end


@pytest.mark.parametrize("sim_server", [{"speedup": 50}], indirect=True)
def test_the_warm_up_is_left_out_of_the_window(sim_server) -> None:
    load = level(sim_server.base_url, ClosedLoop(4), StopRule(duration_s=0.8, warmup_s=0.4))
    # The boundaries are read off the event loop's clock, late by however long the loop was
    # busy: on a 2-core machine running another CPU-bound job beside the tests that reached
    # 0.19 s. What matters here is which requests fall on which side of the boundary,
    # asserted below.
    assert 0.4 - 0.15 <= load.warmup_s < 0.4 + 0.35
    assert 0.8 - 0.2 <= load.elapsed_s < 0.8 + 0.35
    early = [r for r in load.requests if r.start_s < load.warmup_s and r.complete]
    assert early, "requests ran during the warm-up"
    assert load.completed and all(r.start_s >= load.warmup_s for r in load.completed)
    # Only tokens that arrived in the window count: fewer than the level streamed in all.
    assert 0 < load.tokens < sum(r.output_tokens for r in load.requests)


@pytest.mark.parametrize("sim_server", [{"speedup": 50}], indirect=True)
def test_a_request_count_counts_requests_of_the_window_and_cuts_the_rest(sim_server) -> None:
    load = level(sim_server.base_url, ClosedLoop(4), StopRule(requests=10, warmup_s=0.2))
    assert len(load.completed) >= 10
    # The level ended at the 10th: at most the other streams' last chunk raced it.
    assert len(load.completed) <= 10 + 3


@pytest.mark.parametrize("sim_server", [{"speedup": 20}], indirect=True)
def test_inter_token_latency_is_the_gap_between_streamed_chunks(sim_server) -> None:
    load = level(sim_server.base_url, ClosedLoop(2), StopRule(duration_s=1.0, warmup_s=0.1))
    assert load.completed
    for r in load.completed:
        assert r.chunk_gaps_s and all(g >= 0 for g in r.chunk_gaps_s)
        assert r.ttft_s is not None and r.last_token_s is not None
        first_token = r.start_s + r.ttft_s
        assert sum(r.chunk_gaps_s) == pytest.approx(r.last_token_s - first_token, abs=1e-6)


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_open_loop_gaps_have_the_rate_and_the_burstiness_asked(burstiness: float) -> None:
    """Gamma gaps of shape k: mean 1/rate whatever k, coefficient of variation 1/sqrt(k)."""
    shape = OpenLoop(rate=8.0, burstiness=burstiness)
    rng = random.Random(1)
    gaps = [shape.gap_s(rng) for _ in range(40_000)]
    mean = statistics.fmean(gaps)
    assert mean == pytest.approx(1 / 8.0, rel=0.03)
    assert statistics.pstdev(gaps) / mean == pytest.approx(burstiness**-0.5, rel=0.05)


@pytest.mark.parametrize("sim_server", [{"speedup": 100}], indirect=True)
def test_open_loop_sends_at_the_rate_and_keeps_under_the_cap(sim_server) -> None:
    url = sim_server.base_url
    free = level(url, OpenLoop(rate=40.0), StopRule(duration_s=2.0, warmup_s=0.2), seed=3)
    started = len([r for r in free.requests if r.start_s >= free.warmup_s])
    # Poisson: 80 arrivals expected in the window, sd ~9.
    assert 50 <= started <= 110
    capped = level(
        url, OpenLoop(rate=400.0, max_concurrency=2), StopRule(duration_s=0.6, warmup_s=0.1)
    )
    assert 1 <= capped.concurrency <= 2
    assert capped.completed


def plan(url: str, **kw) -> SweepPlan:  # type: ignore[no-untyped-def]
    base = dict(
        url=url, depths=(1,), concurrencies=(1,), stop=StopRule(duration_s=1.0, warmup_s=0.2),
        prompts=synthetic_prompts(1024, 32, 2000), prompt_source="test", admin_key=KEY,
    )  # fmt: skip
    base.update(kw)
    return SweepPlan(**base)  # type: ignore[arg-type]


def test_a_busy_level_does_not_leak_into_the_next(sim_server_factory) -> None:
    """c=32 with replies far longer than its window, then c=1: the c=32 streams are cut,
    aborted and drained, so the c=1 level runs alone (batch 1, no other-traffic flag)."""
    sim = sim_server_factory(admin_key=KEY, speedup=5)
    observer = Recorder()
    outcome = run_sweep(plan(sim.base_url, concurrencies=(32, 1)), observer)
    busy, alone = outcome.results
    assert busy.concurrency == 32 and busy.too_short  # nothing of 2000 tokens finished in 1 s
    assert sim.server.stats().aborted_requests >= 32  # its streams were cut, not left running
    assert busy.drain_s is not None and busy.drain_s < 2.0 and not busy.drain_timed_out
    assert alone.concurrency == 1 and alone.mean_batch == pytest.approx(1.0, abs=0.05)
    assert not alone.foreign_traffic and not observer.warnings


def test_a_server_that_stays_busy_is_waited_for_a_bounded_time_then_warned_about(
    sim_server_factory,
) -> None:
    sim = sim_server_factory(admin_key=KEY, speedup=20, concurrency=6)  # someone else's load
    observer = Recorder()
    run = plan(sim.base_url, drain_timeout_s=0.5, prompts=synthetic_prompts(64, 32, 16))
    outcome = run_sweep(run, observer)
    assert any("was running" in w and "another client is using it" in w for w in observer.warnings)
    assert any("still ran" in w for w in observer.warnings)
    (result,) = outcome.results
    assert result.drain_timed_out and result.drain_s == pytest.approx(0.5, abs=0.4)
    assert result.foreign_traffic and result.flags == ["other traffic"]


def test_the_server_table_is_restored_after_a_rate_sweep(sim_server_factory) -> None:
    sim = sim_server_factory(admin_key=KEY, speedup=100)
    before = parse_table({"version": 4, "tiers": [{"min_batch": 1, "depth": 2}]})
    httpx.post(
        f"{sim.base_url}/set_internal_state", json=push_body(before),
        headers={"Authorization": f"Bearer {KEY}"}, timeout=5,
    )  # fmt: skip
    run = plan(
        sim.base_url, concurrencies=(), request_rates=(5.0, 20.0), depths=(0, 3),
        prompts=synthetic_prompts(256, 32, 16), stop=StopRule(duration_s=0.8, warmup_s=0.1),
    )  # fmt: skip
    outcome = run_sweep(run, Recorder())
    assert [(r.series, r.request_rate) for r in outcome.results] == [
        ("d0", 5.0), ("d0", 20.0), ("d3", 5.0), ("d3", 20.0),
    ]  # fmt: skip
    assert all(r.request_per_s > 0 and r.itl_p50_ms is not None for r in outcome.results)
    assert outcome.restored == before.describe()


@pytest.mark.parametrize(
    "sim_server", [{"speedup": 5, "concurrency": 24, "profile": "h200-llama8b-eagle3"}],
    indirect=True,
)  # fmt: skip
def test_request_gauges_are_read_through_the_window(sim_server) -> None:
    """The simulator's own closed loop keeps 24 requests running: the window's readings of
    SGLang's running-request gauge, every poll, see them (and nothing queued)."""
    from controller.bench.server_client import ServerClient
    from controller.bench.sweep import _WindowScrapes

    async def window() -> _WindowScrapes:
        scrapes = _WindowScrapes(ServerClient(sim_server.base_url), poll_s=0.05)
        await scrapes.window_started()
        await asyncio.sleep(0.6)
        await scrapes.window_ended()
        return scrapes

    sim_server.server.advance(5)  # the background load is warm
    scrapes = asyncio.run(window())
    assert scrapes.before is not None and scrapes.after is not None
    assert len(scrapes.running) >= 6  # before, after and the polls between
    assert 20 <= statistics.fmean(scrapes.running) <= 24
    assert statistics.fmean(scrapes.queued) == 0


class _SlowMetrics(QuietHandler):
    """A real loopback server whose /metrics answers after `server.delay_s` seconds."""

    def do_GET(self) -> None:
        time.sleep(self.server.delay_s)  # type: ignore[attr-defined]
        self.reply(b"# HELP sglang:num_running_reqs x\n# TYPE sglang:num_running_reqs gauge\n")


@pytest.fixture
def slow_metrics_url() -> Iterator[str]:
    with serving(_SlowMetrics, delay_s=3.0) as url:
        yield url


def test_a_scrape_that_does_not_answer_does_not_hold_the_window_open(slow_metrics_url) -> None:
    from controller.bench.server_client import ServerClient
    from controller.bench.sweep import _WindowScrapes

    async def window() -> tuple[_WindowScrapes, float]:
        scrapes = _WindowScrapes(ServerClient(slow_metrics_url), poll_s=10, deadline_s=0.3)
        start = time.monotonic()
        await scrapes.window_started()
        await scrapes.window_ended()
        return scrapes, time.monotonic() - start

    scrapes, took = asyncio.run(window())
    assert took < 2.0  # two scrapes given up at 0.3 s each, not two 3 s answers
    assert scrapes.late == 2 and scrapes.before is None and scrapes.after is None


def test_a_drain_whose_scrape_does_not_answer_ends_at_its_timeout(slow_metrics_url) -> None:
    from controller.bench.server_client import ServerClient
    from controller.bench.sweep import drain

    async def timed() -> tuple[bool, float]:
        start = time.monotonic()
        result = await drain(ServerClient(slow_metrics_url), timeout_s=0.5)
        return result.idle, time.monotonic() - start

    idle, took = asyncio.run(timed())  # the run's end still waits for the dropped scrape
    assert took < 2.0 and not idle
