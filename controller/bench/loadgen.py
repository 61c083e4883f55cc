"""Streaming load on `/v1/completions` (or `/v1/chat/completions`), one level at a time, with
a warm-up and a clean cut.

Two load shapes:

- `ClosedLoop(concurrency)`: each of N workers sends a streaming completion, reads it to the
  end and sends the next, so the server sees a steady number of running requests (SGLang's
  `bench_serving --max-concurrency` with every request sent at once).
- `OpenLoop(rate, burstiness, max_concurrency)`: requests arrive at `rate` per second whatever
  the server does, with gamma-distributed gaps between arrivals (shape `burstiness`: 1 is a
  Poisson process, below 1 burstier, above 1 more regular; the mean gap stays 1/rate), each on
  its own stream; `max_concurrency` caps the streams in flight (an arrival then waits for a
  free one, and its latency counts from when it is sent).

A level first runs for its warm-up (`StopRule.warmup_s`), unmeasured: the first requests all
arrive together and the batch is still ramping. The measured window follows; its tokens,
throughput and latencies are the level's numbers (latencies from the requests that started
inside it). When the window ends every stream still open is cancelled, which closes its
connection: SGLang aborts a request whose stream is closed, so nothing of this level keeps
decoding into the next (the sweep then waits for the server's running-request gauge to read 0).

Tokens are counted from the usage SGLang attaches to every chunk when asked
(`stream_options.continuous_usage_stats`), so a chunk that carries several accepted draft tokens
counts as several; a server that sends no usage is counted one token per non-empty chunk and
corrected by the final usage chunk. `RequestStyle` says how a request is written: the endpoint
(completions with a prompt, or chat with messages), and extra body fields merged over the
defaults (`--extra-request-body`); the client's headers (API key, `--header`) come with the
client (`make_client`). Inter-token latency is the gap between chunks that carry
tokens, as `sglang.bench_serving` and `vllm bench serve` measure it.

One `httpx.AsyncClient` with a keep-alive pool drives every stream from one event loop;
benchmarks/loadgen_ceiling.py measures how far that goes. `run_level` runs a level in this
process; `run_share` runs one process's share of a level split across several
(controller/bench/load_processes.py), its phases ended by the process that coordinates them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from controller.bench.prompts import Prompt


class LoadError(RuntimeError):
    """Requests fail so often that the level's numbers would mean nothing."""


# The warm-up when none is given: this share of a level's duration, or this many seconds when
# the level ends after a number of requests (its duration is not known in advance).
AUTO_WARMUP_SHARE = 0.1
AUTO_WARMUP_REQUESTS_MODE_S = 1.0


@dataclass(frozen=True)
class StopRule:
    """When a level's measured window ends: after `requests` completed requests (of those that
    started in the window), or after `duration_s` seconds; both after `warmup_s` seconds of
    unmeasured load (None: `AUTO_WARMUP_SHARE` of the duration, or 1 s with `requests`)."""

    requests: int | None = None
    duration_s: float | None = None
    warmup_s: float | None = None

    def __post_init__(self) -> None:
        if (self.requests is None) == (self.duration_s is None):
            raise ValueError("give exactly one of requests or duration_s")
        if self.requests is not None and self.requests < 1:
            raise ValueError("requests per level must be >= 1")
        if self.duration_s is not None and self.duration_s <= 0:
            raise ValueError("duration per level must be > 0 seconds")
        if self.warmup_s is not None and self.warmup_s < 0:
            raise ValueError("warm-up per level must be >= 0 seconds")

    @property
    def warmup(self) -> float:
        if self.warmup_s is not None:
            return self.warmup_s
        if self.duration_s is not None:
            return AUTO_WARMUP_SHARE * self.duration_s
        return AUTO_WARMUP_REQUESTS_MODE_S

    def describe(self) -> str:
        what = (
            f"{self.requests} requests per level"
            if self.requests is not None
            else f"{self.duration_s:g} s per level"
        )
        return f"{what} after a {self.warmup:g} s warm-up" if self.warmup > 0 else what


@dataclass(frozen=True)
class ClosedLoop:
    """`concurrency` streams always in flight. With `once`, each prompt is sent once and a
    stream ends when none is left, instead of the streams cycling through the prompts."""

    concurrency: int
    once: bool = False

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError("concurrency must be >= 1")

    def describe(self) -> str:
        return f"c={self.concurrency}"


@dataclass(frozen=True)
class OpenLoop:
    """Arrivals at `rate` requests/s, gamma-distributed gaps of shape `burstiness`."""

    rate: float
    burstiness: float = 1.0
    max_concurrency: int | None = None

    def __post_init__(self) -> None:
        if not self.rate > 0:
            raise ValueError("request rate must be > 0 requests/s")
        if not self.burstiness > 0:
            raise ValueError("burstiness must be > 0 (1 = Poisson arrivals)")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError("max concurrency must be >= 1")

    def gap_s(self, rng: random.Random) -> float:
        """Seconds to the next arrival: gamma(shape k, scale 1/(rate k)), mean 1/rate."""
        return rng.gammavariate(self.burstiness, 1.0 / (self.rate * self.burstiness))

    def describe(self) -> str:
        return f"{self.rate:g} req/s"


LoadShape = ClosedLoop | OpenLoop


@dataclass(frozen=True)
class RequestResult:
    start_s: float  # seconds since the level started
    end_s: float
    ttft_s: float | None  # time to the first generated token
    last_token_s: float | None  # seconds since the level started
    output_tokens: int
    complete: bool  # read to the end (not cut when the level ended)
    error: str | None = None
    chunk_gaps_s: tuple[float, ...] = ()  # between chunks that carried tokens (ITL)
    prompt_tokens: int | None = None  # as the server counted them (its usage), if it said
    max_tokens: int | None = None  # the output length asked for (EOS ignored: what it owes)

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first (SGLang's definition)."""
        if self.ttft_s is None or self.last_token_s is None or self.output_tokens < 2:
            return None
        first = self.start_s + self.ttft_s
        return (self.last_token_s - first) / (self.output_tokens - 1)

    @property
    def e2e_s(self) -> float:
        return self.end_s - self.start_s


@dataclass
class LiveCounters:
    """What a progress display polls while a level runs (whole level, warm-up included)."""

    started: int = 0
    completed: int = 0
    errors: int = 0
    tokens: int = 0
    chunks: int = 0  # SSE events with tokens (several tokens per event when drafts are accepted)
    in_flight: int = 0
    window_completed: int = 0  # completed requests that started in the measured window
    t0: float = field(default_factory=time.perf_counter)
    warming_up: bool = True

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.t0


@dataclass(frozen=True)
class LevelLoad:
    shape: LoadShape
    # Streams in flight: the closed loop's concurrency, or the most an open loop had at once
    # during the window (what the server could have been running from this client).
    concurrency: int
    warmup_s: float
    elapsed_s: float  # the measured window
    tokens: int  # tokens received during the window
    requests: tuple[RequestResult, ...]  # every request of the level, warm-up included
    client_cpu_s: float  # CPU time of the load generator during the window (all its processes)
    # With the level split across processes: each one's CPU time during the window (empty: one
    # process, `client_cpu_s`).
    process_cpu_s: tuple[float, ...] = ()

    @property
    def output_tok_per_s(self) -> float:
        return self.tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def measured(self) -> list[RequestResult]:
        """Requests that started inside the window and ended (completed or failed) in it."""
        end = self.warmup_s + self.elapsed_s
        return [
            r
            for r in self.requests
            if r.start_s >= self.warmup_s and r.end_s <= end and (r.complete or r.error is not None)
        ]

    @property
    def completed(self) -> list[RequestResult]:
        return [r for r in self.measured if r.complete and r.error is None]

    @property
    def sent_in_window(self) -> list[RequestResult]:
        """Requests sent inside the window, however they ended (the window's arrivals)."""
        end = self.warmup_s + self.elapsed_s
        return [r for r in self.requests if self.warmup_s <= r.start_s < end]

    @property
    def errors(self) -> list[RequestResult]:
        return [r for r in self.requests if r.error is not None]


class WindowHooks:
    """Called as the measured window opens and closes (the sweep scrapes the server there)."""

    async def window_started(self) -> None: ...

    async def window_ended(self) -> None: ...


def make_client(
    base_url: str, max_streams: int | None, headers: dict[str, str] | None = None
) -> httpx.AsyncClient:
    """An HTTP/1.1 keep-alive pool with one connection per concurrent stream (no limit: None);
    `headers` go with every request (the API key, a gateway's own)."""
    return httpx.AsyncClient(
        base_url=base_url.rstrip("/"),
        limits=httpx.Limits(max_connections=max_streams, max_keepalive_connections=max_streams),
        # A request may queue behind hundreds of others; only connecting must be quick.
        timeout=httpx.Timeout(connect=10.0, read=600.0, write=60.0, pool=600.0),
        headers=headers,
    )


COMPLETIONS, CHAT = "completions", "chat"
ENDPOINT_PATHS = {COMPLETIONS: "/v1/completions", CHAT: "/v1/chat/completions"}


@dataclass(frozen=True)
class RequestStyle:
    """How each request is written: the OpenAI endpoint and body fields merged over the
    defaults (they win, as with `sglang.bench_serving --extra-request-body`)."""

    endpoint: str = COMPLETIONS
    extra_body: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.endpoint not in ENDPOINT_PATHS:
            raise ValueError(f"endpoint must be one of {sorted(ENDPOINT_PATHS)}")

    @property
    def path(self) -> str:
        return ENDPOINT_PATHS[self.endpoint]

    def body(self, prompt: Prompt, model: str, temperature: float) -> dict[str, object]:
        body: dict[str, object] = {"model": model}
        if self.endpoint == CHAT:
            body["messages"] = prompt.messages()
        else:
            body["prompt"] = prompt.completion_prompt()
        body.update({
            "max_tokens": prompt.output_tokens,
            "temperature": temperature,
            "ignore_eos": True,  # fixed output lengths make levels comparable
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        })  # fmt: skip
        body.update(self.extra_body)
        return body


def completion_body(
    prompt: Prompt, model: str, temperature: float, style: RequestStyle | None = None
) -> dict[str, object]:
    return (style or RequestStyle()).body(prompt, model, temperature)


def chunk_text(chunk: dict[str, Any]) -> str:
    """The text a streamed chunk carries: a completion's `text`, or a chat delta's content
    (reasoning included, which a reasoning parser splits off)."""
    choices = chunk.get("choices") or ()
    if not choices or not isinstance(choices[0], dict):
        return ""
    first = choices[0]
    if "text" in first:
        return str(first.get("text") or "")
    delta = first.get("delta") or {}
    if not isinstance(delta, dict):
        return ""
    return str(delta.get("reasoning_content") or "") + str(delta.get("content") or "")


@dataclass(frozen=True)
class Deal:
    """One process's part of a level split across `of` processes: the open loop's arrivals
    `index`, `index + of`, `index + 2 of`, ... of the schedule all of them draw, and the prompts
    `offset + index`, `offset + index + of`, ... (one process: every arrival, every prompt)."""

    index: int = 0
    of: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.of:
            raise ValueError(f"share {self.index} of {self.of} does not exist")


class _RequestFailed(Exception):
    pass


class _Level:
    """One level's shared state: results, counters, the window and the stop condition."""

    def __init__(
        self,
        http: httpx.AsyncClient,
        prompts: Sequence[Prompt],
        live: LiveCounters,
        *,
        model: str,
        temperature: float,
        prompt_offset: int,
        stop_after: int | None,
        max_errors: int | None,
        deal: Deal = Deal(),
        style: RequestStyle | None = None,
    ) -> None:
        self.http = http
        self.style = style or RequestStyle()
        self.prompts = prompts
        self.stop_after = stop_after  # completed requests of the window (None: its pace says)
        self.live = live
        self.model = model
        self.temperature = temperature
        self.next_prompt = prompt_offset + deal.index
        self.prompt_stride = deal.of
        self.max_errors = max_errors  # None: the coordinating process judges the failures
        self.t0 = live.t0
        self.results: list[RequestResult] = []
        self.window_start: float | None = None  # seconds since t0
        self.measured_done = 0
        self.peak_in_flight = 0
        self.done = asyncio.Event()  # the window's request count is reached, or a failure
        self.failure: LoadError | None = None

    def next_body(self) -> dict[str, object]:
        prompt = self.prompts[self.next_prompt % len(self.prompts)]
        self.next_prompt += self.prompt_stride
        self.live.started += 1
        return self.style.body(prompt, self.model, self.temperature)

    def record(self, result: RequestResult) -> None:
        self.results.append(result)
        live = self.live
        in_window = self.window_start is not None and result.start_s >= self.window_start
        if result.error is not None:
            live.errors += 1
            limit = self.max_errors
            if limit is not None and live.errors >= limit and live.errors > live.completed:
                first = next(r.error for r in self.results if r.error)
                self.failure = LoadError(
                    f"{live.errors} of {len(self.results)} requests to "
                    f"{str(self.http.base_url).rstrip('/')}{self.style.path} failed; first "
                    f"error: {first}"
                )
                self.done.set()
        elif result.complete:
            live.completed += 1
            if in_window:
                self.measured_done += 1
                live.window_completed += 1
                if self.stop_after is not None and self.measured_done >= self.stop_after:
                    self.done.set()

    async def request(self, body: dict[str, object]) -> None:
        """One streamed completion; its result is recorded even when the level cuts it."""
        live = self.live
        start = time.perf_counter()
        chunk_times: list[float] = []
        seen = 0
        prompt: int | None = None
        complete = False
        error: str | None = None
        live.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, live.in_flight)
        try:
            async with self.http.stream("POST", self.style.path, json=body) as resp:
                if resp.status_code != 200:
                    text = (await resp.aread()).decode(errors="replace")[:300]
                    raise _RequestFailed(f"HTTP {resp.status_code}: {text}")
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        break
                    chunk = json.loads(payload)
                    if "error" in chunk:
                        raise _RequestFailed(f"stream error: {chunk['error']}")
                    usage = chunk.get("usage")
                    if isinstance(usage, dict) and "completion_tokens" in usage:
                        new = int(usage["completion_tokens"]) - seen
                        if isinstance(usage.get("prompt_tokens"), int):
                            prompt = usage["prompt_tokens"]
                    else:
                        new = 1 if chunk_text(chunk) else 0
                    if new > 0:
                        chunk_times.append(time.perf_counter())
                        seen += new
                        live.tokens += new
                        live.chunks += 1
            complete = True
        except (_RequestFailed, httpx.HTTPError, ValueError) as err:
            error = str(err) or type(err).__name__
        finally:
            # Also on cancellation (the level ended): keep what the request produced.
            live.in_flight -= 1
            asked = body.get("max_tokens")
            self.record(self._result(start, chunk_times, seen, complete, error, prompt,
                                     asked if isinstance(asked, int) else None))  # fmt: skip

    def _result(
        self,
        start: float,
        chunk_times: list[float],
        tokens: int,
        complete: bool,
        error: str | None,
        prompt_tokens: int | None = None,
        max_tokens: int | None = None,
    ) -> RequestResult:
        t0 = self.t0
        first = chunk_times[0] if chunk_times else None
        last = chunk_times[-1] if chunk_times else None
        return RequestResult(
            start_s=start - t0,
            end_s=time.perf_counter() - t0,
            ttft_s=None if first is None else first - start,
            last_token_s=None if last is None else last - t0,
            output_tokens=tokens,
            complete=complete,
            error=error,
            chunk_gaps_s=tuple(b - a for a, b in itertools.pairwise(chunk_times)),
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
        )


async def warm_up(
    http: httpx.AsyncClient,
    prompt: Prompt,
    model: str,
    temperature: float,
    style: RequestStyle | None = None,
) -> None:
    """One short request before a server's first level, not measured: the first request a
    server sees pays one-off costs (connections, lazy initialisation) no level should carry."""
    style = style or RequestStyle()
    body = style.body(dataclasses.replace(prompt, output_tokens=2), model, temperature)
    body["max_tokens"] = 2  # over an --extra-request-body max_tokens too: it is not measured
    try:
        async with http.stream("POST", style.path, json=body) as resp:
            await resp.aread()
    except httpx.HTTPError:
        pass  # a server that fails shows it in the first level


async def _closed_loop(level: _Level, concurrency: int, once: bool = False) -> None:
    async def worker() -> None:
        while not (once and level.next_prompt >= len(level.prompts)):
            await level.request(level.next_body())

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def _open_loop(level: _Level, shape: OpenLoop, seed: int, deal: Deal) -> None:
    rng = random.Random(seed)  # the same arrival times at every depth: levels compare fairly
    slots = None if shape.max_concurrency is None else asyncio.Semaphore(shape.max_concurrency)
    tasks: set[asyncio.Task[None]] = set()

    async def send(body: dict[str, object]) -> None:
        if slots is None:
            await level.request(body)
            return
        async with slots:
            await level.request(body)

    next_at = time.perf_counter()
    try:
        for arrival in itertools.count():
            next_at += shape.gap_s(rng)
            if arrival % deal.of != deal.index:
                continue  # another process sends this one
            delay = next_at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(send(level.next_body()))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _wait(
    level: _Level,
    driver: asyncio.Task[None],
    timeout_s: float | None,
    until: Awaitable[None] | None = None,
) -> None:
    """Until the level is done, its driver stops (a bug, never a request failure), `until`
    completes, or timeout."""
    waiter = asyncio.create_task(level.done.wait())
    signal = None if until is None else asyncio.ensure_future(until)
    try:
        await asyncio.wait(
            {driver, waiter} | ({signal} if signal is not None else set()),
            timeout=timeout_s,
            return_when=asyncio.FIRST_COMPLETED,
        )
    finally:
        waiter.cancel()
        if signal is not None:
            signal.cancel()
    if signal is not None and signal.done() and not signal.cancelled():
        signal.result()  # the signal's own failure (its coordinator is gone) ends the level


class _Pace(Protocol):
    """When a running level's phases end. Each wait also returns when the level is done or its
    driver stopped (`_wait`)."""

    async def warm_up(self, level: _Level, driver: asyncio.Task[None]) -> None:
        """Until the warm-up is over and the measured window opens."""

    async def window(self, level: _Level, driver: asyncio.Task[None]) -> None:
        """Until the measured window closes."""

    async def linger(self, level: _Level, driver: asyncio.Task[None]) -> None:
        """After the window closed (its numbers taken), before the streams are cut."""


class _StopClock:
    """The stop rule's own clock: the level runs in this process alone."""

    def __init__(self, stop: StopRule) -> None:
        self.stop = stop

    async def warm_up(self, level: _Level, driver: asyncio.Task[None]) -> None:
        if self.stop.warmup > 0:
            await _wait(level, driver, self.stop.warmup)

    async def window(self, level: _Level, driver: asyncio.Task[None]) -> None:
        await _wait(level, driver, self.stop.duration_s)

    async def linger(self, level: _Level, driver: asyncio.Task[None]) -> None:
        return None


class ExternalPace:
    """Phases ended from outside this process: each waits for what `signal(phase)` returns, an
    awaitable that completes once the coordinator has reached that phase."""

    WINDOW_OPENS, WINDOW_CLOSES, CUT = "window opens", "window closes", "cut"

    def __init__(self, signal: Callable[[str], Awaitable[None]]) -> None:
        self.signal = signal

    async def warm_up(self, level: _Level, driver: asyncio.Task[None]) -> None:
        await _wait(level, driver, None, self.signal(self.WINDOW_OPENS))

    async def window(self, level: _Level, driver: asyncio.Task[None]) -> None:
        await _wait(level, driver, None, self.signal(self.WINDOW_CLOSES))

    async def linger(self, level: _Level, driver: asyncio.Task[None]) -> None:
        await _wait(level, driver, None, self.signal(self.CUT))


@dataclass(frozen=True)
class ShareLoad:
    """What one process measured of a level: its requests (times since its own start), its
    measured window as it saw it open and close, and its tokens and CPU time in that window."""

    window_start_s: float
    elapsed_s: float
    tokens: int
    cpu_s: float
    peak_in_flight: int  # streams in flight at once during the window, at most
    started: int  # requests sent (prompts used)
    requests: tuple[RequestResult, ...]


def _start(level: _Level, shape: LoadShape, seed: int, deal: Deal) -> asyncio.Task[None]:
    if isinstance(shape, ClosedLoop):
        return asyncio.create_task(_closed_loop(level, shape.concurrency, shape.once))
    return asyncio.create_task(_open_loop(level, shape, seed, deal))


async def _run(
    level: _Level, shape: LoadShape, pace: _Pace, hooks: WindowHooks, seed: int, deal: Deal
) -> ShareLoad:
    """Drive `shape` through the warm-up and the window `pace` sets, then cut every stream."""
    live = level.live
    driver = _start(level, shape, seed, deal)
    try:
        await pace.warm_up(level, driver)
        window_start = time.perf_counter()
        level.window_start = window_start - live.t0
        live.warming_up = False
        tokens0, cpu0 = live.tokens, time.process_time()
        level.peak_in_flight = live.in_flight
        await hooks.window_started()
        await pace.window(level, driver)
        window_end = time.perf_counter()
        tokens, cpu = live.tokens - tokens0, time.process_time() - cpu0
        peak = level.peak_in_flight
        await hooks.window_ended()
        await pace.linger(level, driver)
    finally:
        driver.cancel()
        await asyncio.gather(driver, return_exceptions=True)
    if level.failure is not None:
        raise level.failure
    if not driver.cancelled() and (bug := driver.exception()) is not None:
        raise bug
    return ShareLoad(
        window_start_s=window_start - live.t0,
        elapsed_s=window_end - window_start,
        tokens=tokens,
        cpu_s=cpu,
        peak_in_flight=peak,
        started=live.started,
        requests=tuple(level.results),
    )


async def run_level(
    http: httpx.AsyncClient,
    prompts: Sequence[Prompt],
    shape: LoadShape,
    stop: StopRule,
    *,
    model: str = "default",
    temperature: float = 0.0,
    prompt_offset: int = 0,
    live: LiveCounters | None = None,
    hooks: WindowHooks | None = None,
    seed: int = 0,
    style: RequestStyle | None = None,
) -> LevelLoad:
    """Run `shape` through a warm-up and one measured window; cut every stream at its end."""
    if not prompts:
        raise ValueError("no prompts to send")
    live = live or LiveCounters()
    live.t0 = time.perf_counter()
    live.warming_up = True
    streams = shape.concurrency if isinstance(shape, ClosedLoop) else shape.max_concurrency
    level = _Level(
        http, prompts, live, model=model, temperature=temperature, prompt_offset=prompt_offset,
        stop_after=stop.requests, max_errors=max(streams or 0, 5), style=style,
    )  # fmt: skip
    share = await _run(level, shape, _StopClock(stop), hooks or WindowHooks(), seed, Deal())
    return LevelLoad(
        shape=shape,
        concurrency=shape.concurrency if isinstance(shape, ClosedLoop) else share.peak_in_flight,
        warmup_s=share.window_start_s,
        elapsed_s=share.elapsed_s,
        tokens=share.tokens,
        requests=share.requests,
        client_cpu_s=share.cpu_s,
    )


async def run_share(
    http: httpx.AsyncClient,
    prompts: Sequence[Prompt],
    shape: LoadShape,
    pace: ExternalPace,
    deal: Deal,
    *,
    model: str = "default",
    temperature: float = 0.0,
    prompt_offset: int = 0,
    live: LiveCounters | None = None,
    seed: int = 0,
    style: RequestStyle | None = None,
) -> ShareLoad:
    """One process's share of a level (`shape` is that share: its streams, or the open loop's
    whole rate, of which `deal` picks this process's arrivals). `pace` ends the phases; the
    coordinating process counts the window's requests and judges failures from every share."""
    if not prompts:
        raise ValueError("no prompts to send")
    live = live or LiveCounters()
    live.t0 = time.perf_counter()
    live.warming_up = True
    level = _Level(
        http, prompts, live, model=model, temperature=temperature, prompt_offset=prompt_offset,
        stop_after=None, max_errors=None, deal=deal, style=style,
    )  # fmt: skip
    return await _run(level, shape, pace, WindowHooks(), seed, deal)
