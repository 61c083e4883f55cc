"""The sweep: force each depth through the admin RPC, run every level, restore.

The server's table is read before anything is pushed and pushed back in a `finally`, so an
error, Ctrl-C (the event loop cancels the sweep) or SIGTERM (handled the same way by
`run_sweep`) leaves the server as it was. Between levels the table is read back: if another
controller (a running daemon) pushed meanwhile, the sweep stops instead of measuring the
wrong depth.

Levels do not overlap: each one ends by closing its streams (SGLang aborts their requests),
and the next starts once the server's running-request gauge reads 0 again (`drain`), with a
bounded wait and a warning if it does not.

The load runs in this process (`loadgen.run_level`), or split across `client_processes` worker
processes (`load_processes.LoadProcesses`, started once for the whole sweep); a level of fewer
streams than processes runs in this process.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
import statistics
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, TypeVar

import httpx

from controller.bench.latency import (
    DEFAULT_PERCENTILES,
    Slo,
    goodput,
    latencies,
    latency_summary,
)
from controller.bench.load_processes import LoadProcesses, level_streams
from controller.bench.loadgen import (
    ClosedLoop,
    LevelLoad,
    LiveCounters,
    LoadShape,
    OpenLoop,
    RequestStyle,
    StopRule,
    WindowHooks,
    make_client,
    run_level,
    warm_up,
)
from controller.bench.metrics import (
    ITL_HISTOGRAM,
    TTFT_HISTOGRAM,
    Scrape,
    evictions_between,
    forward_busy_between,
    mean_between,
    passes_between,
    sglang_accept_length_between,
    total,
    tree_work_between,
    work_between,
)
from controller.bench.prompts import Prompt
from controller.bench.repeats import merge
from controller.bench.server_client import ServerClient, ServerError, ServerState, bearer
from controller.bench.server_facts import server_facts
from sglang_hooks.contract import PolicyError, single_depth_table, validate_tiers

T = TypeVar("T")
NO_SPEC = "no-spec"
RUNNING_GAUGE = "sglang:num_running_reqs"
QUEUED_GAUGE = "sglang:num_queue_reqs"
# How long the server may take to empty after a level's streams are closed before the sweep
# warns and goes on: SGLang aborts closed streams within a scheduler iteration or two.
DRAIN_TIMEOUT_S = 10.0
# A level whose busiest load-generator process used this much of a core during the window is
# bound by the client. Each process is one asyncio event loop: a chunk that arrives while the
# loop is busy waits its turn, and as with any single server the wait grows like u / (1 - u) at
# utilisation u (2.3 chunk-handling times at 0.7, 9 at 0.9), so measured ITL and TTFT stretch
# and the loop's reading rate caps tok/s well before a full core (CPU time also counts httpx,
# the JSON decoding, the garbage collector and this process's progress display). On an H200
# every level at 0.79-0.95 of a core varied 10-49% between repeats; this leaves a margin below.
CLIENT_BOUND_SHARE = 0.7
# A level whose window completed fewer requests than this at some series cannot tell depths
# apart: a handful of requests that started together and ran side by side is one sample of
# the level, not a distribution (it is flagged and left out, like a level with none).
MIN_LEVEL_REQUESTS = 5
# An open-loop level at which a series delivered at least this share of the tokens its window's
# arrivals asked for kept up with them: the arrival rate, not the server, set its tok/s. A server
# past its capacity falls further behind the longer the window, while one that keeps up
# delivers the arrivals' tokens give or take the window's edges (a few arrivals' worth in a
# short window): the margin leaves room for those.
KEPT_UP_SHARE = 0.8


def series_name(depth: int | None) -> str:
    return NO_SPEC if depth is None else f"d{depth}"


@dataclass(frozen=True)
class SweepPlan:
    url: str
    depths: tuple[int, ...]
    concurrencies: tuple[int, ...]
    stop: StopRule
    prompts: Sequence[Prompt]
    prompt_source: str
    admin_key: str | None = None
    no_spec_url: str | None = None
    model: str | None = None
    temperature: float = 0.0
    # Open loop: requests arrive at these rates (requests/s) instead of a fixed concurrency.
    request_rates: tuple[float, ...] = ()
    burstiness: float = 1.0
    max_concurrency: int | None = None
    slo: Slo | None = None
    drain_timeout_s: float | None = None  # None: DRAIN_TIMEOUT_S
    seed: int = 0
    # Worker processes each level's load is split across (1: this process runs it).
    client_processes: int = 1
    client_bound_share: float = CLIENT_BOUND_SHARE
    # Ask each server to freeze its garbage collector (SGLang's /freeze_gc) before the levels.
    freeze_gc: bool = False
    # Empty each server's prefix cache (SGLang's /flush_cache) before each of its levels: a
    # level then starts from the same cache whatever ran before it, and with prompts no cache
    # holds, allocates from free slots instead of evicting what earlier levels left.
    flush_cache: bool = False
    # Run every series of a load back to back (each depth, then the plain server) on the same
    # requests in the same order, instead of one series after the other on fresh prompts: a
    # comparison then meets neither drift between series nor a different draw of prompts.
    paired: bool = False
    # Paired runs only: the plain server first at every load, then each depth. A bench that
    # alternates the order from run to run separates an order effect from the servers' gap.
    plain_first: bool = False
    # The servers' --api-key, sent with every request but the admin ones (which carry
    # admin_key), and extra headers for every request (a gateway's routing or auth).
    api_key: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    # The endpoint and extra body fields of the load's requests.
    style: RequestStyle = field(default_factory=RequestStyle)
    # Latency percentiles each level reports (besides mean and standard deviation).
    percentiles: tuple[float, ...] = DEFAULT_PERCENTILES
    # Each level measured this many times (each with its warm-up and drain); its figures are
    # the repeats' means, with a 95% confidence interval across them (`repeats.merge`).
    repeats: int = 1
    # The prompt size asked for (tokens, mean over the prompts; None: a dataset file's own),
    # and whether the prompts were cut to it in the model's tokens (else a word per token).
    asked_prompt_tokens: float | None = None
    exact_prompt_size: bool = False

    def __post_init__(self) -> None:
        if bool(self.concurrencies) == bool(self.request_rates):
            raise ValueError("give concurrency levels or request rates, not both")
        if self.client_processes < 1:
            raise ValueError("client processes must be >= 1")
        if not self.client_bound_share > 0:
            raise ValueError("the client-bound share must be > 0")
        if self.paired and not self.no_spec_url:
            raise ValueError("paired levels need a server without speculation to pair with")
        if self.plain_first and not self.paired:
            raise ValueError("the plain server goes first only in paired levels")
        if self.repeats < 1:
            raise ValueError("repeats must be >= 1")

    def in_process(self, shape: LoadShape) -> bool:
        """Whether this process runs `shape` itself: with one client process, or for a level of
        fewer streams than processes (every process needs a stream, and so few streams never
        load a client)."""
        streams = level_streams(shape)
        return self.client_processes == 1 or (
            streams is not None and streams < self.client_processes
        )

    @property
    def mode(self) -> str:
        """ "closed" (fixed concurrency) or "rate" (open-loop arrivals)."""
        return "rate" if self.request_rates else "closed"

    def shapes(self) -> list[LoadShape]:
        if self.request_rates:
            return [OpenLoop(r, self.burstiness, self.max_concurrency) for r in self.request_rates]
        return [ClosedLoop(c) for c in self.concurrencies]

    @property
    def drain_timeout(self) -> float:
        return DRAIN_TIMEOUT_S if self.drain_timeout_s is None else self.drain_timeout_s

    def max_streams(self) -> int | None:
        """The client's connection pool: the most streams a level can hold open."""
        if self.request_rates:
            return self.max_concurrency
        return max(self.concurrencies)

    def client_headers(self) -> dict[str, str]:
        """The headers of every load request: the extra ones, the API key over them."""
        return {**self.headers, **bearer(self.api_key)}

    def server(self, url: str) -> ServerClient:
        """A client for the admin and read routes of `url`, with this plan's keys."""
        return ServerClient(url, self.admin_key, api_key=self.api_key, headers=self.headers)

    def paired_order(self) -> tuple[int | None, ...]:
        """The series of one load in a paired run, None for the plain server."""
        return (None, *self.depths) if self.plain_first else (*self.depths, None)

    def levels(self) -> list[tuple[int | None, LoadShape]]:
        """(depth or None for the no-spec server, load) in the order they run."""
        if self.paired:
            return [(d, shape) for shape in self.shapes() for d in self.paired_order()]
        out: list[tuple[int | None, LoadShape]] = [
            (d, shape) for d in self.depths for shape in self.shapes()
        ]
        if self.no_spec_url:
            out += [(None, shape) for shape in self.shapes()]
        return out


@dataclass(frozen=True)
class LevelResult:
    series: str  # "d3", or "no-spec" for the second server
    depth: int | None
    # Streams in flight: the level's concurrency, or the most an open loop had at once.
    concurrency: int
    requests: int  # completed requests that started in the measured window
    errors: int
    elapsed_s: float  # the measured window (after the warm-up)
    output_tok_per_s: float
    ttft_p50_ms: float | None
    ttft_p90_ms: float | None
    tpot_p50_ms: float | None
    tpot_p90_ms: float | None
    mean_batch: float | None  # from the server's own counters, when it exports them
    accept_length: float | None
    client_cpu_share: float  # client CPU seconds per wall second (1.0 = one core busy)
    # The server ran clearly bigger batches than this level sent: someone else's traffic (or
    # streams left over from the level before) was decoding too, so the numbers are not this
    # level's alone.
    foreign_traffic: bool = False
    request_rate: float | None = None  # open loop: the arrival rate (requests/s)
    burstiness: float | None = None
    warmup_s: float = 0.0
    request_per_s: float = 0.0  # completed requests per second of the window
    ttft_p99_ms: float | None = None
    tpot_p99_ms: float | None = None
    itl_p50_ms: float | None = None  # inter-token latency: gaps between streamed chunks
    itl_p90_ms: float | None = None
    itl_p99_ms: float | None = None
    e2e_p50_ms: float | None = None
    e2e_p99_ms: float | None = None
    goodput_req_per_s: float | None = None  # requests that met the SLO, per second
    slo_attainment: float | None = None  # their share of the window's finished requests
    # No request that started in the window finished in it: the level is too short for its
    # load, its tok/s is a partial picture and it is left out of every recommendation.
    too_short: bool = False
    drain_s: float | None = None  # from closing the level's streams to an idle server
    drain_timed_out: bool = False
    # What `specctl sim fit` replays: the decode step from the server's counters, and the
    # request shape as the server counted it (mean prompt tokens, mean output tokens).
    step_ms: float | None = None
    prompt_tokens: float | None = None
    output_tokens: float | None = None
    # The same level as the server itself timed it (SGLang's latency histograms, means):
    # no client or network time in them.
    server_ttft_ms: float | None = None
    server_itl_ms: float | None = None
    # The load generator: its processes, and the busiest one's CPU seconds per wall second
    # (`client_cpu_share` adds them all up). At CLIENT_BOUND_SHARE or more the level is bound
    # by the client, not the server, and left out of every recommendation.
    client_processes: int = 1
    client_process_cpu_share: float | None = None
    client_bound: bool = False
    # GPU seconds per second of the window in prefill forwards and in the rest (decode, verify,
    # drafting), from SGLang's device timer (SGLANG_ENABLE_METRICS_DEVICE_TIMER=1 on the server).
    gpu_prefill_busy: float | None = None
    gpu_decode_busy: float | None = None
    # Forward passes in the window by SGLang's own count: prefill batches and decode
    # iterations. At high load the prefills of arriving requests run between the iterations,
    # each costing about one, and their number moves a level's TPOT.
    prefill_passes: int | None = None
    decode_passes: int | None = None
    # SGLang's running and queued request gauges, read every GAUGE_POLL_S through the window
    # (means of the readings): the batch of a server without the plugin's counters too.
    running_mean: float | None = None
    queued_mean: float | None = None
    # The shortest and longest output of the window's completed requests: a spread of lengths
    # (requests that do not end together) is part of the protocol a replay must follow.
    output_tokens_min: int | None = None
    output_tokens_max: int | None = None
    # Where in the prompt list the level's first request came from: paired levels share it.
    prompt_offset: int | None = None
    # Wall-clock (Unix) times the measured window opened and closed, to line the level up with
    # logs kept beside the bench (GPU clocks, server logs).
    window_start_unix: float | None = None
    window_end_unix: float | None = None
    # SGLang's prefix-cache evictions in the window (its eviction histogram, TP rank 0): how
    # many times the scheduler evicted to make room, and the milliseconds that took on its host
    # loop. None: the server does not export the histogram.
    evictions: int | None = None
    evict_ms: float | None = None
    # With --flush-cache: whether the server emptied its prefix cache before the level.
    cache_flushed: bool | None = None
    # Prompt tokens of the requests sent in the window (the server's count from its usage,
    # the mean of the others' for a request cut before its first chunk) per second, and
    # prompt plus output tokens per second (`sglang.bench_serving`'s input and total token
    # throughput).
    input_tok_per_s: float = 0.0
    total_tok_per_s: float = 0.0
    # Open loop: the output tokens the window's arrivals asked for, per second of the window,
    # and the cap on streams in flight (--max-concurrency; None: none).
    offered_tok_per_s: float | None = None
    max_concurrency: int | None = None
    # {"ttft"|"tpot"|"itl"|"e2e": {"mean", "std", "p50", ...}} in ms (latency.latency_summary).
    latency_ms: dict[str, dict[str, float | None]] = field(default_factory=dict)
    # With --repeats N: how many windows the level's figures are the means of, the 95%
    # confidence interval's half-width of each figure across them, and each window's tok/s.
    repeats: int = 1
    ci95: dict[str, float] = field(default_factory=dict)
    repeat_tok_per_s: tuple[float, ...] = ()

    @property
    def level(self) -> int | float:
        """What the sweep varies: the concurrency, or the request rate in open-loop mode."""
        return self.concurrency if self.request_rate is None else self.request_rate

    @property
    def label(self) -> str:
        return f"c={self.concurrency}" if self.request_rate is None else f"{self.request_rate:g}/s"

    @property
    def too_few(self) -> bool:
        """Some requests finished in the window, too few to tell depths apart."""
        return 0 < self.requests < MIN_LEVEL_REQUESTS * self.repeats

    @property
    def kept_up(self) -> bool:
        """An open-loop level whose series delivered what its arrivals asked for: below the
        server's capacity, the arrival rate set its tok/s. Not where the streams reached the
        --max-concurrency cap: arrivals then waited for a stream, as in a closed loop, and
        the server's pace set the tok/s."""
        offered = self.offered_tok_per_s
        if not offered:
            return False
        capped = self.max_concurrency is not None and self.concurrency >= self.max_concurrency
        return not capped and self.output_tok_per_s >= KEPT_UP_SHARE * offered

    @property
    def flags(self) -> list[str]:
        """Why this level is left out of the recommendation (empty: it is not)."""
        out = []
        if self.too_short:
            out.append("too short")
        if self.too_few:
            out.append("too few requests")
        if self.foreign_traffic:
            out.append("other traffic")
        if self.client_bound:
            out.append("client-bound")
        return out

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SweepOutcome:
    plan: SweepPlan
    before: ServerState
    results: list[LevelResult] = field(default_factory=list)
    # What each server said about itself in /server_info (`server_facts`): "spec", "no_spec".
    servers: dict[str, dict[str, Any]] = field(default_factory=dict)
    pushed: bool = False  # whether the sweep changed the server's table at all
    restored: str | None = None  # the table pushed back at the end, described
    interrupted: str | None = None  # why the sweep stopped early, if it did
    # With plan.freeze_gc, per server ("spec", "no_spec"): True, or why it could not be frozen.
    gc_frozen: dict[str, bool | str] = field(default_factory=dict)


# A level's mean batch may exceed its concurrency by this much before it counts as foreign
# traffic (one stream finishing while the next starts can briefly overlap in a batch).
FOREIGN_BATCH_MARGIN = 0.5
FOREIGN_BATCH_SHARE = 0.1


def has_foreign_traffic(concurrency: int, mean_batch: float | None) -> bool:
    if mean_batch is None:
        return False
    return mean_batch > concurrency + max(FOREIGN_BATCH_MARGIN, FOREIGN_BATCH_SHARE * concurrency)


@dataclass(frozen=True)
class Drain:
    """How a level's load left the server."""

    seconds: float
    idle: bool  # the server reported nothing running or queued before the timeout
    busy: float | None = None  # running + queued requests last read (None: no gauges)


def summarize(
    depth: int | None,
    load: LevelLoad,
    before: Scrape | None,
    after: Scrape | None,
    slo: Slo | None = None,
    drain: Drain | None = None,
    client_bound_share: float = CLIENT_BOUND_SHARE,
    gauges: tuple[Sequence[float], Sequence[float]] = ((), ()),
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
) -> LevelResult:
    done = load.completed
    lat = latencies(done)
    mean_batch = accept = step = ttft_s = itl_s = busy = passes = evicted = None
    window = load.elapsed_s
    if before is not None and after is not None:
        busy = forward_busy_between(before, after, window)
        passes = passes_between(before, after)
        evicted = evictions_between(before, after)
        ttft_s = mean_between(before, after, TTFT_HISTOGRAM)
        itl_s = mean_between(before, after, ITL_HISTOGRAM)
        work = work_between(before, after)
        # Only the forced depth should have run; exploration off, so take every depth's work
        # (and on a shape server run as it is, every tree's too).
        trees = tree_work_between(before, after).values()
        w = work.get(depth) if depth is not None else total([*work.values(), *trees])
        if w is not None and w.iterations > 0:
            mean_batch, accept, step = w.mean_batch, w.accept_length, w.step_ms
        if accept is None:  # no plugin counters: SGLang's own, where it speculates
            accept = sglang_accept_length_between(before, after)
    prompts = [r.prompt_tokens for r in load.requests if r.prompt_tokens is not None]
    sent = load.sent_in_window
    mean_prompt = statistics.fmean(prompts) if prompts else 0.0
    input_tokens = sum(mean_prompt if r.prompt_tokens is None else r.prompt_tokens for r in sent)
    input_rate = input_tokens / window if window > 0 else 0.0
    asked = [r.max_tokens for r in sent if r.max_tokens is not None]
    good = goodput(slo, load.measured, load.elapsed_s) if slo is not None else None
    open_loop = load.shape if isinstance(load.shape, OpenLoop) else None
    busiest = max(load.process_cpu_s or (load.client_cpu_s,)) / window if window > 0 else math.nan
    return LevelResult(
        series=series_name(depth),
        depth=depth,
        concurrency=load.concurrency,
        requests=len(done),
        errors=len(load.errors),
        elapsed_s=round(window, 3),
        output_tok_per_s=load.output_tok_per_s,
        ttft_p50_ms=lat.ttft[0],
        ttft_p90_ms=lat.ttft[1],
        tpot_p50_ms=lat.tpot[0],
        tpot_p90_ms=lat.tpot[1],
        mean_batch=mean_batch,
        accept_length=accept,
        client_cpu_share=load.client_cpu_s / window if window > 0 else math.nan,
        foreign_traffic=has_foreign_traffic(load.concurrency, mean_batch),
        request_rate=None if open_loop is None else open_loop.rate,
        burstiness=None if open_loop is None else open_loop.burstiness,
        warmup_s=round(load.warmup_s, 3),
        request_per_s=len(done) / window if window > 0 else 0.0,
        ttft_p99_ms=lat.ttft[2],
        tpot_p99_ms=lat.tpot[2],
        itl_p50_ms=lat.itl[0],
        itl_p90_ms=lat.itl[1],
        itl_p99_ms=lat.itl[2],
        e2e_p50_ms=lat.e2e[0],
        e2e_p99_ms=lat.e2e[2],
        goodput_req_per_s=None if good is None else good.req_per_s,
        slo_attainment=None if good is None else good.attainment,
        too_short=not done,
        drain_s=None if drain is None else round(drain.seconds, 3),
        drain_timed_out=drain is not None and not drain.idle,
        step_ms=step,
        prompt_tokens=statistics.fmean(prompts) if prompts else None,
        output_tokens=statistics.fmean(r.output_tokens for r in done) if done else None,
        output_tokens_min=min(r.output_tokens for r in done) if done else None,
        output_tokens_max=max(r.output_tokens for r in done) if done else None,
        server_ttft_ms=None if ttft_s is None else 1000.0 * ttft_s,
        server_itl_ms=None if itl_s is None else 1000.0 * itl_s,
        client_processes=len(load.process_cpu_s) or 1,
        client_process_cpu_share=busiest,
        client_bound=busiest >= client_bound_share,
        gpu_prefill_busy=None if busy is None else busy.prefill,
        gpu_decode_busy=None if busy is None else busy.decode,
        prefill_passes=None if passes is None else passes.prefill,
        decode_passes=None if passes is None else passes.decode,
        running_mean=statistics.fmean(gauges[0]) if gauges[0] else None,
        queued_mean=statistics.fmean(gauges[1]) if gauges[1] else None,
        evictions=None if evicted is None else evicted.calls,
        evict_ms=None if evicted is None else round(1000.0 * evicted.seconds, 3),
        input_tok_per_s=input_rate,
        total_tok_per_s=input_rate + load.output_tok_per_s,
        offered_tok_per_s=(
            sum(asked) / window if open_loop is not None and asked and window > 0 else None
        ),
        max_concurrency=None if open_loop is None else open_loop.max_concurrency,
        latency_ms=latency_summary(done, percentiles),
    )


class LevelObserver:
    """Hooks a progress display into the sweep (no-op by default)."""

    def sweep_started(self, outcome: SweepOutcome) -> None:
        """`outcome` fills in as levels finish; keep it to report a sweep cut short."""

    def level_started(self, series: str, shape: LoadShape, live: LiveCounters) -> None:
        """A level starts (a fixed concurrency or a request rate); `live` counts its requests
        and tokens as they arrive, warm-up included."""

    def window_finished(self, result: LevelResult) -> None:
        """One measured window of a level ended (with --repeats N, each of its N)."""

    def level_finished(self, result: LevelResult) -> None: ...

    def message(self, text: str) -> None: ...

    def warning(self, text: str) -> None:
        self.message(f"warning: {text}")


def check_depths(depths: Sequence[int], state: ServerState) -> None:
    """Fail before any load if a depth cannot be forced (the server would answer 400)."""
    for depth in depths:
        try:
            validate_tiers(single_depth_table(depth).tiers, state.captured_depths)
        except PolicyError as err:
            raise ServerError(f"--depths {depth}: {err.field}: {err.message}") from None


def _busy(scrape: Scrape | None) -> float | None:
    """Running + queued requests from SGLang's gauges (None: the server does not export them).

    SGLang refreshes these gauges every `decode_log_interval` iterations while busy, and at
    once when the scheduler goes idle (0.5.17 and later), so 0 is read as soon as it is true."""
    if scrape is None or RUNNING_GAUGE not in scrape.gauges:
        return None
    return scrape.gauges[RUNNING_GAUGE] + scrape.gauges.get(QUEUED_GAUGE, 0.0)


# A /metrics scrape that has not answered by then is given up: a level's window waits on its
# scrapes. One H200 bench (run 10) stayed minutes in a level whose streams ran on while its
# server logged no scrape; no scrape may hold a level open that long again.
SCRAPE_DEADLINE_S = 15.0


async def scrape_by(server: ServerClient, deadline_s: float = SCRAPE_DEADLINE_S) -> Scrape | None:
    """One scrape off the event loop, given up after `deadline_s` (TimeoutError): the thread
    finishes on its own and its answer is dropped."""
    return await asyncio.wait_for(asyncio.to_thread(server.scrape_or_none), deadline_s)


async def drain(server: ServerClient, timeout_s: float, poll_s: float = 0.05) -> Drain:
    """Wait until the server runs and queues nothing, at most `timeout_s` seconds."""
    start = time.monotonic()
    while True:
        try:
            scrape = await scrape_by(server, max(timeout_s - (time.monotonic() - start), poll_s))
        except TimeoutError:  # no answer before the drain's own deadline: not known idle
            return Drain(time.monotonic() - start, False)
        busy = _busy(scrape)
        elapsed = time.monotonic() - start
        if busy is None:
            # No gauges: fall back on the decode counters standing still.
            idle = await wait_idle(server, max(timeout_s - elapsed, 0.0))
            return Drain(time.monotonic() - start, idle)
        if busy <= 0:
            return Drain(elapsed, True, 0.0)
        if elapsed >= timeout_s:
            return Drain(elapsed, False, busy)
        await asyncio.sleep(poll_s)  # an await, so Ctrl-C / SIGTERM cancel here at once


async def wait_idle(server: ServerClient, timeout_s: float, quiet_s: float = 0.3) -> bool:
    """For a server without SGLang's gauges: wait until its decode counters stand still for
    `quiet_s`. False if they still moved after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    last = _iterations(server)
    while last is not None:
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(quiet_s)
        now = _iterations(server)
        if now is None or now == last:
            return True
        last = now
    return True


def _iterations(server: ServerClient) -> float | None:
    scrape = server.scrape_or_none()
    if scrape is None or not scrape.has_contract_counters():
        return None
    return sum(w.iterations for w in scrape.counters.values())


# How often the request gauges are read inside a window. SGLang refreshes them at every prefill
# and every 40 decode iterations, so reading more often sees the same values again.
GAUGE_POLL_S = 0.5


class _WindowScrapes(WindowHooks):
    """Scrapes the server as a level's window opens and closes, and reads its running and
    queued request gauges every `poll_s` between (all off the event loop, so the streams keep
    being read meanwhile; one scrape at a time)."""

    def __init__(
        self, server: ServerClient, poll_s: float = GAUGE_POLL_S,
        deadline_s: float = SCRAPE_DEADLINE_S,
    ) -> None:  # fmt: skip
        self.server = server
        self.poll_s = poll_s
        self.deadline_s = deadline_s
        self.late = 0  # scrapes given up at the deadline
        self.before: Scrape | None = None
        self.after: Scrape | None = None
        self.running: list[float] = []
        self.queued: list[float] = []
        self._stop = asyncio.Event()
        self._poller: asyncio.Task[None] | None = None
        self.opened_unix: float | None = None
        self.closed_unix: float | None = None

    def _keep(self, scrape: Scrape | None) -> None:
        if scrape is not None and RUNNING_GAUGE in scrape.gauges:
            self.running.append(scrape.gauges[RUNNING_GAUGE])
            self.queued.append(scrape.gauges.get(QUEUED_GAUGE, 0.0))

    async def _scrape(self) -> Scrape | None:
        try:
            return await scrape_by(self.server, self.deadline_s)
        except TimeoutError:
            self.late += 1
            return None

    async def _poll(self) -> None:
        while True:
            try:
                await asyncio.wait_for(self._stop.wait(), timeout=self.poll_s)
                return
            except TimeoutError:
                self._keep(await self._scrape())

    async def window_started(self) -> None:
        self.opened_unix = time.time()
        self.before = await self._scrape()
        self._keep(self.before)
        self._poller = asyncio.create_task(self._poll())

    async def window_ended(self) -> None:
        if self._poller is not None:
            self._stop.set()
            await self._poller  # a scrape under way finishes first: never two at once
        self.closed_unix = time.time()
        self.after = await self._scrape()
        self._keep(self.after)


class _Levels:
    """Runs one server's levels: load, scrape, drain, summarize."""

    def __init__(
        self,
        plan: SweepPlan,
        server: ServerClient,
        observer: LevelObserver,
        offset: int,
        processes: LoadProcesses | None = None,
    ) -> None:
        self.plan = plan
        self.server = server
        self.observer = observer
        self.offset = offset  # prompts already sent: every level gets fresh ones
        self.processes = processes  # None: the load runs in this process
        self.model = plan.model or server.model_id() or "default"
        self.warmed = False

    async def warm_up(self, http: httpx.AsyncClient) -> None:
        """One unmeasured request before this server's first level."""
        if not self.warmed:
            self.warmed = True
            await warm_up(
                http, self.plan.prompts[-1], self.model, self.plan.temperature, self.plan.style
            )

    async def settle(self) -> None:
        """Before the first level: the server should be idle, or someone else is using it."""
        drained = await drain(self.server, self.plan.drain_timeout)
        if not drained.idle:
            self.observer.warning(
                f"{self.server.url} was running {_requests(drained.busy)} before the sweep "
                f"and still was after {self.plan.drain_timeout:g} s; another client is using "
                "it, so the levels measure its traffic too"
            )

    async def measure(
        self, http: httpx.AsyncClient, depth: int | None, shape: LoadShape
    ) -> LevelResult:
        """The level, once or `plan.repeats` times back to back (merged: `repeats.merge`)."""
        windows = []
        for _ in range(self.plan.repeats):
            windows.append(await self._measure_once(http, depth, shape))
            self.observer.window_finished(windows[-1])
        return merge(windows)

    async def _measure_once(
        self, http: httpx.AsyncClient, depth: int | None, shape: LoadShape
    ) -> LevelResult:
        plan = self.plan
        live = LiveCounters()
        series = series_name(depth)
        self.observer.level_started(series, shape, live)
        flushed = await self._flush(series, shape) if plan.flush_cache else None
        scrapes = _WindowScrapes(self.server)
        first_prompt = self.offset
        if self.processes is None or plan.in_process(shape):
            load = await run_level(
                http, plan.prompts, shape, plan.stop, model=self.model,
                temperature=plan.temperature, prompt_offset=self.offset, live=live,
                hooks=scrapes, seed=plan.seed, style=plan.style,
            )  # fmt: skip
            self.offset += live.started
        else:
            load, self.offset = await self.processes.run_level(
                self.server.url, shape, plan.stop, model=self.model,
                temperature=plan.temperature, prompt_offset=self.offset, live=live,
                hooks=scrapes, seed=plan.seed, style=plan.style, headers=plan.client_headers(),
            )  # fmt: skip
        if scrapes.late:
            self.observer.warning(
                f"{self.server.url}/metrics did not answer within {scrapes.deadline_s:g} s "
                f"{scrapes.late} time(s) in level {series} {shape.describe()}; the level kept "
                "its length, and the server's own figures (step time, batch, accept length) "
                "are missing where those scrapes were due"
            )
        drained = await drain(self.server, plan.drain_timeout)
        if not drained.idle:
            self.observer.warning(
                f"{self.server.url} still ran {_requests(drained.busy)} "
                f"{plan.drain_timeout:g} s after level {series} {shape.describe()} closed its "
                "streams; another client is using it (or it does not abort closed streams), "
                "so the next level measures that traffic too"
            )
        result = summarize(
            depth, load, scrapes.before, scrapes.after, plan.slo, drained, plan.client_bound_share,
            gauges=(scrapes.running, scrapes.queued), percentiles=plan.percentiles,
        )  # fmt: skip
        return replace(
            result, prompt_offset=first_prompt,
            window_start_unix=scrapes.opened_unix, window_end_unix=scrapes.closed_unix,
            cache_flushed=flushed,
        )  # fmt: skip

    async def _flush(self, series: str, shape: LoadShape) -> bool:
        """Empty the server's prefix cache before a level; a refusal is named, not fatal (the
        level runs on the cache as it is, and its `cache_flushed` says so)."""
        flushed = await asyncio.to_thread(self.server.flush_cache)
        if not flushed:
            self.observer.warning(
                f"{self.server.url}/flush_cache did not empty the prefix cache before level "
                f"{series} {shape.describe()} (no such route, a wrong --admin-key, or requests "
                "still running); the level starts on the cache earlier levels left"
            )
        return flushed


def _requests(n: float | None) -> str:
    if n is None:
        return "decode iterations"
    return f"{n:.0f} request" + ("" if round(n) == 1 else "s")


def _pool_size(plan: SweepPlan) -> int | None:
    """This process's connection pool: every stream, or, when worker processes carry the load,
    the warm-up request and the levels too small to split."""
    if plan.client_processes == 1:
        return plan.max_streams()
    own = [level_streams(s) or 1 for s in plan.shapes() if plan.in_process(s)]
    return max([1, *own])


async def _run_levels(
    outcome: SweepOutcome,
    server: ServerClient,
    observer: LevelObserver,
    processes: LoadProcesses | None,
) -> None:
    plan = outcome.plan
    if plan.paired:
        await _run_paired(outcome, server, observer, processes)
        return
    levels = _Levels(plan, server, observer, offset=0, processes=processes)
    await levels.settle()
    for i, depth in enumerate(plan.depths):
        version = outcome.before.version + 1 + i
        _force(outcome, server, observer, depth, version)
        async with make_client(plan.url, _pool_size(plan), plan.client_headers()) as http:
            await levels.warm_up(http)
            for shape in plan.shapes():
                result = await levels.measure(http, depth, shape)
                _check_still_forced(plan, server, version)
                outcome.results.append(result)
                observer.level_finished(result)
    if plan.no_spec_url:
        await _run_no_spec(outcome, observer, levels.offset, processes)


def _force(
    outcome: SweepOutcome, server: ServerClient, observer: LevelObserver, depth: int, version: int
) -> None:
    outcome.pushed = True  # set first: a push that times out may still have landed
    server.push(single_depth_table(depth, version=version))
    observer.message(f"forced {series_name(depth)} on {outcome.plan.url} (version {version})")


def _check_still_forced(plan: SweepPlan, server: ServerClient, version: int) -> None:
    now = server.state()
    if now.version != version:
        raise ServerError(
            f"the table on {plan.url} changed during the sweep (now version {now.version}, "
            f"source {now.source!r}: {now.describe()}); stop other controllers (e.g. the specctl "
            "daemon) before benchmarking"
        )


def _introduce_plain(outcome: SweepOutcome, other: ServerClient) -> None:
    """The plain server must answer before its levels; what it says of itself is kept."""
    if not other.health():
        raise ServerError(f"{outcome.plan.no_spec_url}/health is not OK (--no-spec-url)")
    outcome.servers["no_spec"] = server_facts(other.server_info())


async def _run_paired(
    outcome: SweepOutcome,
    server: ServerClient,
    observer: LevelObserver,
    processes: LoadProcesses | None,
) -> None:
    """Per load: each depth, then the plain server (or it first, `plain_first`), every one
    from the same first prompt. The next load starts past the furthest prompt any of them
    reached, so loads stay fresh."""
    plan = outcome.plan
    assert plan.no_spec_url is not None
    version = outcome.before.version
    live_depth: int | None = None  # pushed once per change, not per level
    with plan.server(plan.no_spec_url) as other:
        _introduce_plain(outcome, other)
        spec = _Levels(plan, server, observer, offset=0, processes=processes)
        plain = _Levels(plan, other, observer, offset=0, processes=processes)
        await spec.settle()
        await plain.settle()
        async with (
            make_client(plan.url, _pool_size(plan), plan.client_headers()) as spec_http,
            make_client(plan.no_spec_url, _pool_size(plan), plan.client_headers()) as plain_http,
        ):
            await spec.warm_up(spec_http)
            await plain.warm_up(plain_http)
            start = 0
            for shape in plan.shapes():
                reached = start
                for depth in plan.paired_order():
                    levels, http = (plain, plain_http) if depth is None else (spec, spec_http)
                    if depth is not None and depth != live_depth:
                        version, live_depth = version + 1, depth
                        _force(outcome, server, observer, depth, version)
                    levels.offset = start
                    result = await levels.measure(http, depth, shape)
                    if depth is not None:
                        _check_still_forced(plan, server, version)
                    reached = max(reached, levels.offset)
                    outcome.results.append(result)
                    observer.level_finished(result)
                start = reached


async def _run_no_spec(
    outcome: SweepOutcome, observer: LevelObserver, offset: int, processes: LoadProcesses | None
) -> None:
    plan = outcome.plan
    assert plan.no_spec_url is not None
    with plan.server(plan.no_spec_url) as other:
        _introduce_plain(outcome, other)
        await _levels_as_is(plan, other, observer, offset, processes, outcome.results)


async def _levels_as_is(
    plan: SweepPlan, server: ServerClient, observer: LevelObserver, offset: int,
    processes: LoadProcesses | None, results: list[LevelResult], series: str = NO_SPEC,
) -> None:  # fmt: skip
    """Every load of the plan on `server` as it runs, nothing forced."""
    levels = _Levels(plan, server, observer, offset, processes)
    await levels.settle()
    async with make_client(server.url, _pool_size(plan), plan.client_headers()) as http:
        await levels.warm_up(http)
        for shape in plan.shapes():
            result = replace(await levels.measure(http, None, shape), series=series)
            results.append(result)
            observer.level_finished(result)


async def sweep_as_is(
    plan: SweepPlan, series: str, observer: LevelObserver | None = None
) -> list[LevelResult]:
    """Every load of the plan on `plan.url` as the server runs, no table forced or restored and
    no plugin needed: SGLang's own static speculation (a draft tree too), or none. Each level
    is named `series`; its accept length comes from SGLang's own counters."""
    observer = observer or LevelObserver()
    results: list[LevelResult] = []
    processes = (
        LoadProcesses(plan.client_processes, plan.prompts) if plan.client_processes > 1 else None
    )
    try:
        with plan.server(plan.url) as server:
            if plan.freeze_gc:
                try:
                    server.freeze_gc()
                except ServerError as err:
                    observer.warning(f"garbage collector not frozen: {err}")
            await _levels_as_is(plan, server, observer, 0, processes, results, series)
    finally:
        if processes is not None:
            processes.close()
    return results


async def sweep(plan: SweepPlan, observer: LevelObserver | None = None) -> SweepOutcome:
    """Run the whole plan; the server's previous table is restored however this ends."""
    observer = observer or LevelObserver()
    with plan.server(plan.url) as server:
        before = server.state()
        check_depths(plan.depths, before)
        outcome = SweepOutcome(plan=plan, before=before)
        outcome.servers["spec"] = server_facts(server.server_info())
        if plan.freeze_gc:
            _freeze_gc(outcome, server, observer)
        observer.sweep_started(outcome)
        processes = (
            LoadProcesses(plan.client_processes, plan.prompts)
            if plan.client_processes > 1
            else None
        )
        try:
            await _run_levels(outcome, server, observer, processes)
        except asyncio.CancelledError:
            outcome.interrupted = "interrupted"
            raise
        except Exception as err:
            outcome.interrupted = str(err)
            raise
        finally:
            if processes is not None:
                processes.close()  # every level cut its streams already: this only ends them
            _restore(server, before, outcome, observer)
    return outcome


def _freeze_gc(outcome: SweepOutcome, server: ServerClient, observer: LevelObserver) -> None:
    """Freeze each server's collector; one that cannot be frozen is named, not fatal."""
    plan = outcome.plan
    with contextlib.ExitStack() as stack:
        clients = {"spec": server}
        if plan.no_spec_url is not None:
            clients["no_spec"] = stack.enter_context(plan.server(plan.no_spec_url))
        for role, client in clients.items():
            try:
                client.freeze_gc()
            except ServerError as err:
                outcome.gc_frozen[role] = str(err)
                observer.warning(f"garbage collector not frozen: {err}")
                continue
            outcome.gc_frozen[role] = True
            observer.message(f"froze the garbage collector of {client.url}")


def _restore(
    server: ServerClient, before: ServerState, outcome: SweepOutcome, observer: LevelObserver
) -> None:
    try:
        now = server.state()
        if now.version == before.version and now.table == before.table:
            outcome.pushed = False  # the push was refused (e.g. a bad key): nothing to undo
            outcome.restored = before.describe()
            return
        server.push(before.table)
    except ServerError as err:
        observer.message(f"could not restore the previous table: {err}")
        return
    outcome.restored = before.describe()
    observer.message(f"restored the previous table on {server.url}: {before.describe()}")


def run_cancellable(work: Callable[[], Awaitable[T]]) -> T:
    """`work()` in a fresh event loop; SIGTERM cancels it like Ctrl-C does."""

    async def main() -> T:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        if task is not None:
            # Not available off the main thread; Ctrl-C still works there.
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(signal.SIGTERM, task.cancel)
        try:
            return await work()
        finally:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(signal.SIGTERM)

    return asyncio.run(main())


def run_sweep(plan: SweepPlan, observer: LevelObserver | None = None) -> SweepOutcome:
    """Run `sweep` in a fresh event loop; SIGTERM cancels it like Ctrl-C does."""
    return run_cancellable(lambda: sweep(plan, observer))
