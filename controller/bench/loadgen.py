"""Closed-loop streaming load on `/v1/completions`: `concurrency` requests always in flight.

Each of `concurrency` workers sends a streaming completion, reads it to the end and sends the
next, so the server sees a steady number of running requests (a closed loop, as in SGLang's
own `bench_serving --max-concurrency`). Tokens are counted from the usage SGLang attaches to
every chunk when asked (`stream_options.continuous_usage_stats`), so a chunk that carries
several accepted draft tokens counts as several; a server that sends no usage is counted one
token per non-empty chunk and corrected by the final usage chunk.

One `httpx.AsyncClient` with a keep-alive pool as large as the concurrency drives every stream
from one event loop; benchmarks/loadgen_ceiling.py measures how far that goes.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import httpx

from controller.bench.prompts import Prompt


class LoadError(RuntimeError):
    """Requests fail so often that the level's numbers would mean nothing."""


@dataclass(frozen=True)
class StopRule:
    """When a level ends: after `requests` completed requests, or after `duration_s` seconds."""

    requests: int | None = None
    duration_s: float | None = None

    def __post_init__(self) -> None:
        if (self.requests is None) == (self.duration_s is None):
            raise ValueError("give exactly one of requests or duration_s")
        if self.requests is not None and self.requests < 1:
            raise ValueError("requests per level must be >= 1")
        if self.duration_s is not None and self.duration_s <= 0:
            raise ValueError("duration per level must be > 0 seconds")

    def describe(self) -> str:
        if self.requests is not None:
            return f"{self.requests} requests per level"
        return f"{self.duration_s:g} s per level"


@dataclass(frozen=True)
class RequestResult:
    start_s: float  # seconds since the level started
    end_s: float
    ttft_s: float | None  # time to the first generated token
    last_token_s: float | None  # seconds since the level started
    output_tokens: int
    complete: bool  # read to the end (not cut by the level's deadline)
    error: str | None = None
    prompt_tokens: int | None = None  # as the server counted them (its usage), if it said

    @property
    def tpot_s(self) -> float | None:
        """Mean time per output token after the first (SGLang's definition)."""
        if self.ttft_s is None or self.last_token_s is None or self.output_tokens < 2:
            return None
        first = self.start_s + self.ttft_s
        return (self.last_token_s - first) / (self.output_tokens - 1)


@dataclass
class LiveCounters:
    """What a progress display polls while a level runs."""

    started: int = 0
    completed: int = 0
    errors: int = 0
    tokens: int = 0
    chunks: int = 0  # SSE events with tokens (several tokens per event when drafts are accepted)
    t0: float = field(default_factory=time.perf_counter)

    def elapsed_s(self) -> float:
        return time.perf_counter() - self.t0


@dataclass(frozen=True)
class LevelLoad:
    concurrency: int
    elapsed_s: float
    tokens: int  # every token received during the level
    requests: tuple[RequestResult, ...]
    client_cpu_s: float  # CPU time of this process during the level

    @property
    def output_tok_per_s(self) -> float:
        return self.tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def completed(self) -> list[RequestResult]:
        return [r for r in self.requests if r.complete and r.error is None]

    @property
    def errors(self) -> list[RequestResult]:
        return [r for r in self.requests if r.error is not None]


def make_client(base_url: str, concurrency: int) -> httpx.AsyncClient:
    """An HTTP/1.1 keep-alive pool with one connection per concurrent stream."""
    return httpx.AsyncClient(
        base_url=base_url.rstrip("/"),
        limits=httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency),
        # A request may queue behind hundreds of others; only connecting must be quick.
        timeout=httpx.Timeout(connect=10.0, read=600.0, write=60.0, pool=600.0),
    )


def completion_body(prompt: Prompt, model: str, temperature: float) -> dict[str, object]:
    return {
        "model": model,
        "prompt": prompt.text,
        "max_tokens": prompt.output_tokens,
        "temperature": temperature,
        "ignore_eos": True,  # fixed output lengths make levels comparable
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }


async def _one_request(
    http: httpx.AsyncClient,
    body: dict[str, object],
    t0: float,
    live: LiveCounters,
) -> RequestResult:
    start = time.perf_counter()
    first: float | None = None
    last: float | None = None
    seen = 0
    prompt: int | None = None
    try:
        async with http.stream("POST", "/v1/completions", json=body) as resp:
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
                    choices = chunk.get("choices") or ()
                    new = 1 if choices and choices[0].get("text") else 0
                if new > 0:
                    now = time.perf_counter()
                    first = first if first is not None else now
                    last = now
                    seen += new
                    live.tokens += new
                    live.chunks += 1
    except asyncio.CancelledError:
        # The level's deadline cut this request: keep what it produced, mark it incomplete.
        return _result(start, time.perf_counter(), first, last, seen, t0, complete=False,
                       prompt_tokens=prompt)  # fmt: skip
    except (_RequestFailed, httpx.HTTPError, ValueError) as err:
        live.errors += 1
        end = time.perf_counter()
        reason = str(err) or type(err).__name__
        return _result(start, end, first, last, seen, t0, complete=False, error=reason)
    live.completed += 1
    return _result(start, time.perf_counter(), first, last, seen, t0, complete=True,
                   prompt_tokens=prompt)  # fmt: skip


class _RequestFailed(Exception):
    pass


def _result(
    start: float,
    end: float,
    first: float | None,
    last: float | None,
    tokens: int,
    t0: float,
    *,
    complete: bool,
    error: str | None = None,
    prompt_tokens: int | None = None,
) -> RequestResult:
    return RequestResult(
        start_s=start - t0,
        end_s=end - t0,
        ttft_s=None if first is None else first - start,
        last_token_s=None if last is None else last - t0,
        output_tokens=tokens,
        complete=complete,
        error=error,
        prompt_tokens=prompt_tokens,
    )


async def warm_up(http: httpx.AsyncClient, prompt: Prompt, model: str, temperature: float) -> None:
    """One short request before a server's first level, not measured: the first request a
    server sees pays one-off costs (connections, lazy initialisation) no level should carry."""
    body = completion_body(Prompt(prompt.text, 2), model, temperature)
    await _one_request(http, body, time.perf_counter(), LiveCounters())  # errors show later


async def run_level(
    http: httpx.AsyncClient,
    prompts: Sequence[Prompt],
    concurrency: int,
    stop: StopRule,
    *,
    model: str = "default",
    temperature: float = 0.0,
    prompt_offset: int = 0,
    live: LiveCounters | None = None,
) -> LevelLoad:
    """Keep `concurrency` streams in flight until `stop`; return every request's timings."""
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    if not prompts:
        raise ValueError("no prompts to send")
    live = live or LiveCounters()
    live.t0 = t0 = time.perf_counter()
    cpu0 = time.process_time()
    results: list[RequestResult] = []
    next_prompt = prompt_offset
    max_errors = max(concurrency, 5)

    async def worker() -> None:
        nonlocal next_prompt
        while stop.requests is None or live.started < stop.requests:
            live.started += 1
            prompt = prompts[next_prompt % len(prompts)]
            next_prompt += 1
            body = completion_body(prompt, model, temperature)
            task = asyncio.current_task()
            result = await _one_request(http, body, t0, live)
            results.append(result)
            if task is not None and task.cancelling():
                raise asyncio.CancelledError
            if live.errors >= max_errors and live.errors > live.completed:
                raise LoadError(
                    f"{live.errors} of {len(results)} requests to {http.base_url}/v1/completions "
                    f"failed; first error: {next(r.error for r in results if r.error)}"
                )

    workers = [asyncio.create_task(worker()) for _ in range(concurrency)]
    try:
        if stop.duration_s is None:
            await asyncio.gather(*workers)
        else:
            done, _ = await asyncio.wait(
                workers, timeout=stop.duration_s, return_when=asyncio.FIRST_EXCEPTION
            )
            for w in done:
                if not w.cancelled() and (err := w.exception()) is not None:
                    raise err
    finally:
        for w in workers:
            w.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
    # Measured after the cut, so tokens that arrived while cancelling are inside the window.
    elapsed = time.perf_counter() - t0
    return LevelLoad(
        concurrency=concurrency,
        elapsed_s=elapsed,
        tokens=sum(r.output_tokens for r in results),
        requests=tuple(results),
        client_cpu_s=time.process_time() - cpu0,
    )
