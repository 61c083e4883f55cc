"""The HTTP face of a `SimulatedServer`: SGLang's endpoints over FastAPI, served by uvicorn.

The simulated clock runs at `speedup` x wall time, advanced by a background thread
(`SimClock`). An HTTP generation request becomes a real request inside the simulation: it
queues, is prefilled, joins the decode batch and receives tokens as the batch produces them,
so a load generator sees realistic TTFT, inter-token latency and throughput against
concurrency (divided by `speedup` in wall time). Generated text is synthetic.

Endpoints: /metrics, /server_info (+ deprecated /get_server_info), /set_internal_state (POST,
PUT), /health, /health_generate, /ready, /generate (`text` or `input_ids`; answers with
`output_ids` that depend on the prompt and position only, like a greedy decode),
/v1/completions and /v1/chat/completions (streaming or not, with usage; with
`stream_options.continuous_usage_stats` every chunk carries the usage so far, as SGLang sends
it), /v1/models. Auth follows SGLang 0.5.23:
/health*, /ready and /metrics are open; /set_internal_state is ADMIN_OPTIONAL; everything
else needs the API key when one is set.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
import uuid
import zlib
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST

from sims.server import SimulatedServer, validation_error_body

_WORDS = (
    " the", " model", " speculates", " and", " verifies", " tokens", " in", " one", " pass",
    " while", " the", " batch", " is", " small", ";", " under", " load", " it", " stops", ".",
)  # fmt: skip
_OPEN_PATHS = ("/health", "/ready", "/metrics")


def synthetic_text(start: int, count: int) -> str:
    """Deterministic filler text for output tokens [start, start + count)."""
    return "".join(_WORDS[i % len(_WORDS)] for i in range(start, start + count))


SYNTHETIC_VOCAB = 32000


def synthetic_output_ids(prompt: Any, start: int, count: int) -> list[int]:
    """Token ids for output positions [start, start + count): a function of the prompt and
    the position only, as a greedy decode is, so every depth (and a server without
    speculation) answers a prompt with the same ids."""
    seed = zlib.crc32(json.dumps(prompt, separators=(",", ":")).encode())
    return [(seed + 2654435761 * i) % SYNTHETIC_VOCAB for i in range(start, start + count)]


# A chat template's tokens around each message (role markers and separators), and the
# generation prompt's after the last: roughly what Llama- and Qwen-style templates add.
CHAT_TOKENS_PER_MESSAGE = 4
CHAT_GENERATION_PROMPT_TOKENS = 3


def chat_prompt_token_count(messages: list[Any]) -> int:
    """A chat request's prompt as the server would count it after its template."""
    content = sum(
        prompt_token_count(m.get("content") or "") if isinstance(m, dict) else 1 for m in messages
    )
    return content + CHAT_TOKENS_PER_MESSAGE * len(messages) + CHAT_GENERATION_PROMPT_TOKENS


def prompt_token_count(prompt: Any) -> int:
    """Prompt length: token ids count as given; text at ~4 characters per token."""
    if isinstance(prompt, list):
        if all(isinstance(x, int) for x in prompt):
            return max(len(prompt), 1)
        return sum(prompt_token_count(p) for p in prompt)
    if isinstance(prompt, str):
        return max(1, round(len(prompt) / 4))
    return 1


class SimClock:
    """Advances a server's simulated clock to `speedup` x the wall time since `start()`."""

    def __init__(self, server: SimulatedServer, speedup: float, tick_s: float = 0.002) -> None:
        if speedup <= 0:
            raise ValueError(f"speedup must be > 0, got {speedup}")
        self.server = server
        self.speedup = speedup
        self.tick_s = tick_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="sim-clock", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def wall_time_of(self, sim_time: float) -> float:
        """The `time.monotonic()` at which the simulated clock reaches `sim_time`."""
        return self._wall0 + (sim_time - self._sim0) / self.speedup

    def _run(self) -> None:
        wall0 = time.monotonic()
        sim0 = self.server.now
        self._wall0, self._sim0 = wall0, sim0
        self.server.wall_time_of = self.wall_time_of
        try:
            while not self._stop.wait(self.tick_s):
                target = sim0 + (time.monotonic() - wall0) * self.speedup
                self.server.advance_to(target)
        except BaseException as err:  # surfaced by /health, never silently lost
            self.error = err
            raise


_COARSE_TIMER_S = 0.001  # the granularity of an event loop that runs timers early (uvloop)


class _Stream:
    """Bridges the engine's callbacks (clock thread) to an asyncio queue (request handler).

    The engine computes an iteration whole, when it starts, and reports its tokens at the
    simulated time it ends; a served clock (`server.wall_time_of`) holds each event back
    until that time comes on the wall clock, so a client sees tokens when a real server would
    send them. Events are handed over in order (a deque, flushed by one timer at a time, set
    for the earliest held-back event; a timer that fires early is set again, so the last event
    of a request is never left waiting for a push that will not come)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, server: SimulatedServer) -> None:
        self.loop = loop
        self.queue: asyncio.Queue[tuple[str, int, float]] = asyncio.Queue()
        self._wall_time_of = server.wall_time_of
        self._pending: deque[tuple[float, tuple[str, int, float]]] = deque()
        self._lock = threading.Lock()
        self._timer: asyncio.TimerHandle | None = None  # touched on the loop's thread only

    def on_tokens(self, count: int, sim_time: float) -> None:
        self._push(("tokens", count, sim_time))

    def on_done(self, sim_time: float, finish_reason: str) -> None:
        self._push(("done:" + finish_reason, 0, sim_time))

    def _push(self, item: tuple[str, int, float]) -> None:
        due = self._wall_time_of(item[2]) if self._wall_time_of is not None else 0.0
        with self._lock:
            self._pending.append((due, item))
        self.loop.call_soon_threadsafe(self._flush, False)

    def _flush(self, by_timer: bool) -> None:
        """Hand over what is due, then wake again when the next held-back event is."""
        now = time.monotonic()
        released = False
        with self._lock:
            while self._pending and self._pending[0][0] <= now:
                self.queue.put_nowait(self._pending.popleft()[1])
                released = True
            head = self._pending[0][0] if self._pending else None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if head is None:
            return
        delay = head - now
        if by_timer and not released:
            # The loop ran the timer before its time: uvloop rounds a delay to whole
            # milliseconds. Waiting a millisecond more beats spinning on a zero delay.
            delay = max(delay, _COARSE_TIMER_S)
        self._timer = self.loop.call_later(delay, self._flush, True)


@dataclass
class _Progress:
    tokens: int
    text: str
    finished: str | None
    sim_time: float
    ttft_s: float = 0.0  # on the finish record: submission to first token (simulated)
    latency_s: float = 0.0  # on the finish record: submission to finish (simulated)


async def _generate(
    server: SimulatedServer, prompt_tokens: int, max_tokens: int
) -> AsyncGenerator[_Progress, None]:
    """Submit a request to the simulation and yield its progress as tokens arrive.

    A client that disconnects closes this generator: the request is aborted, as SGLang aborts
    a request whose stream is closed, so it stops taking a slot in the batch."""
    stream = _Stream(asyncio.get_running_loop(), server)
    submitted = server.now
    rid = server.submit(prompt_tokens, max_tokens, stream)
    produced = 0
    first: float | None = None
    finished = False
    try:
        while True:
            kind, count, sim_time = await stream.queue.get()
            if kind == "tokens":
                first = sim_time if first is None else first
                text = synthetic_text(produced, count)
                produced += count
                yield _Progress(produced, text, None, sim_time)
            else:
                finished = True
                ttft = (sim_time if first is None else first) - submitted
                reason = kind.split(":", 1)[1]
                yield _Progress(produced, "", reason, sim_time, ttft, sim_time - submitted)
                return
    finally:
        if not finished:
            server.abort(rid)


async def _collect(
    server: SimulatedServer, prompt_tokens: int, max_tokens: int
) -> tuple[str, _Progress]:
    """A whole (non-streamed) generation: its text and its final progress record."""
    text = ""
    last: _Progress | None = None
    async with contextlib.aclosing(_generate(server, prompt_tokens, max_tokens)) as progress:
        async for p in progress:
            text += p.text
            last = p
    assert last is not None  # _generate always ends with a finish record
    return text, last


def _sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _bad_request(message: str, field: str) -> JSONResponse:
    return JSONResponse(
        status_code=400,
        content={
            "object": "error",
            "message": f"{field}: {message}",
            "type": "BadRequestError",
            "param": field,
            "code": 400,
        },
    )


def _int_field(body: dict[str, Any], name: str, default: int, low: int = 1) -> int:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"must be an integer >= {low}, got {value!r}")
    return value


def create_app(server: SimulatedServer) -> FastAPI:
    """A FastAPI app over `server`. The clock is driven separately (see `SimClock`)."""
    app = FastAPI(title="specctl simulated SGLang server", docs_url=None, redoc_url=None)

    @app.middleware("http")
    async def api_key_auth(request: Request, call_next):  # type: ignore[no-untyped-def]
        path = request.url.path
        if request.method == "OPTIONS" or path.startswith(_OPEN_PATHS):
            return await call_next(request)
        if path in ("/set_internal_state", "/freeze_gc", "/flush_cache"):
            return await call_next(request)  # ADMIN_OPTIONAL: checked by the endpoint
        if not server.authorize("normal", request.headers.get("authorization")):
            return JSONResponse(status_code=401, content={"error": "Unauthorized"})
        return await call_next(request)

    @app.get("/health")
    @app.get("/health_generate")
    @app.get("/ready")
    async def health() -> Response:
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(server.metrics_text(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/server_info")
    @app.get("/get_server_info")
    async def server_info() -> dict[str, Any]:
        return server.server_info()

    @app.api_route("/set_internal_state", methods=["POST", "PUT"])
    async def set_internal_state(request: Request) -> JSONResponse:
        authorization = request.headers.get("authorization")
        if not server.authorize("admin_optional", authorization):
            return JSONResponse(status_code=401, content={"error": "Unauthorized"})
        raw = await request.body()
        try:
            body = json.loads(raw) if raw else None
        except json.JSONDecodeError as err:
            detail = [
                {"type": "json_invalid", "loc": ["body", err.pos], "msg": "JSON decode error"}
            ]
            return JSONResponse(status_code=400, content=validation_error_body(detail))
        if body is None:
            detail = [{"type": "missing", "loc": ["body"], "msg": "Field required"}]
            return JSONResponse(status_code=400, content=validation_error_body(detail))
        status, content = server.set_internal_state(body, authorization)
        return JSONResponse(status_code=status, content=content)

    # SGLang's maintenance endpoints, with their auth level. The simulator has no collector
    # pauses to remove and no prefix cache to flush, so it only counts the calls.
    def maintenance(counter: str, answer: str) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            if not server.authorize("admin_optional", request.headers.get("authorization")):
                return JSONResponse(status_code=401, content={"error": "Unauthorized"})
            setattr(server, counter, getattr(server, counter) + 1)
            return Response(answer, status_code=200)

        return endpoint

    for path, counter, answer in (("/freeze_gc", "gc_freezes", "Garbage collection frozen.\n"),
                                  ("/flush_cache", "cache_flushes", "Cache flushed.\n")):
        app.add_api_route(path, maintenance(counter, answer), methods=["GET", "POST"])

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": server.model_name,
                    "object": "model",
                    "created": int(time.time()),
                    "owned_by": "sglang",
                    "root": server.model_name,
                }
            ],
        }

    async def _json_body(request: Request) -> dict[str, Any] | JSONResponse:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _bad_request("request body is not valid JSON", "body")
        if not isinstance(body, dict):
            return _bad_request("must be a JSON object", "body")
        return body

    @app.api_route("/generate", methods=["POST", "PUT"], response_model=None)
    async def generate(request: Request) -> Response:
        body = await _json_body(request)
        if isinstance(body, JSONResponse):
            return body
        prompt = body.get("input_ids", body.get("text"))
        if prompt is None:
            return _bad_request("give 'text' or 'input_ids'", "text")
        params = body.get("sampling_params") or {}
        if not isinstance(params, dict):
            return _bad_request("must be an object", "sampling_params")
        try:
            max_tokens = _int_field(params, "max_new_tokens", 128)
        except ValueError as err:
            return _bad_request(str(err), "sampling_params.max_new_tokens")
        prompt_tokens = prompt_token_count(prompt)
        rid = body.get("rid") or uuid.uuid4().hex
        t0 = server.now

        def meta(p: _Progress) -> dict[str, Any]:
            info: dict[str, Any] = {
                "id": rid,
                "prompt_tokens": prompt_tokens,
                "completion_tokens": p.tokens,
                "cached_tokens": 0,
                "finish_reason": None,
            }
            if p.finished is not None:
                info["finish_reason"] = {"type": p.finished, "length": p.tokens}
                info["e2e_latency"] = p.sim_time - t0
            return info

        if body.get("stream"):

            async def events() -> AsyncIterator[bytes]:
                text = ""
                # aclosing: a client that goes away mid-stream aborts the request at once.
                async with contextlib.aclosing(
                    _generate(server, prompt_tokens, max_tokens)
                ) as progress:
                    async for p in progress:
                        text += p.text
                        if p.finished is not None:
                            server.record_streaming_finished(p.tokens, p.ttft_s, p.latency_s)
                        # Cumulative, as SGLang streams without incremental_streaming_output.
                        yield _sse({"text": text, "output_ids": synthetic_output_ids(
                            prompt, 0, p.tokens), "meta_info": meta(p)})
                yield b"data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")

        text, last = await _collect(server, prompt_tokens, max_tokens)
        return JSONResponse({"text": text, "output_ids": synthetic_output_ids(
            prompt, 0, last.tokens), "meta_info": meta(last)})

    def _usage(prompt_tokens: int, tokens: int) -> dict[str, int]:
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": tokens,
            "total_tokens": prompt_tokens + tokens,
        }

    async def _openai(body: dict[str, Any], prompt_tokens: int, chat: bool) -> Response:
        """An OpenAI completion or chat completion, streamed or whole, with its usage."""
        try:
            max_tokens = _int_field(body, "max_tokens", 16)
        except ValueError as err:
            return _bad_request(str(err), "max_tokens")
        cid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        created = int(time.time())
        model = body.get("model") or server.model_name
        kind = "chat.completion" if chat else "text_completion"

        def chunk(text: str, finish: str | None, first: bool = False) -> dict[str, Any]:
            choice: dict[str, Any]
            if chat:
                delta: dict[str, Any] = {"content": text}
                if first:
                    delta["role"] = "assistant"
                choice = {"index": 0, "delta": delta, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
            return {"id": cid, "object": f"{kind}.chunk" if chat else kind, "created": created,
                    "model": model, "choices": [choice]}  # fmt: skip

        if body.get("stream"):
            opts = body.get("stream_options") or {}
            include_usage = isinstance(opts, dict) and bool(opts.get("include_usage"))
            continuous = include_usage and bool(opts.get("continuous_usage_stats"))

            async def events() -> AsyncIterator[bytes]:
                first = True
                async with contextlib.aclosing(
                    _generate(server, prompt_tokens, max_tokens)
                ) as progress:
                    async for p in progress:
                        if p.finished is None:
                            out = chunk(p.text, None, first)
                            first = False
                            if continuous:
                                out["usage"] = _usage(prompt_tokens, p.tokens)
                            yield _sse(out)
                            continue
                        server.record_streaming_finished(p.tokens, p.ttft_s, p.latency_s)
                        last = chunk("", p.finished)
                        if continuous:
                            last["usage"] = _usage(prompt_tokens, p.tokens)
                        yield _sse(last)
                        if include_usage:
                            final = chunk("", None)
                            final["choices"] = []
                            final["usage"] = _usage(prompt_tokens, p.tokens)
                            yield _sse(final)
                yield b"data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")

        text, last = await _collect(server, prompt_tokens, max_tokens)
        if chat:
            message = {"role": "assistant", "content": text}
            out = {"id": cid, "object": kind, "created": created, "model": model,
                   "choices": [{"index": 0, "message": message,
                                "finish_reason": last.finished}]}  # fmt: skip
        else:
            out = chunk(text, last.finished)
        out["usage"] = _usage(prompt_tokens, last.tokens)
        return JSONResponse(out)

    @app.post("/v1/completions", response_model=None)
    async def completions(request: Request) -> Response:
        body = await _json_body(request)
        if isinstance(body, JSONResponse):
            return body
        if "prompt" not in body:
            return _bad_request("is required", "prompt")
        return await _openai(body, prompt_token_count(body["prompt"]), chat=False)

    @app.post("/v1/chat/completions", response_model=None)
    async def chat_completions(request: Request) -> Response:
        body = await _json_body(request)
        if isinstance(body, JSONResponse):
            return body
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return _bad_request("must be a non-empty list of messages", "messages")
        if not all(isinstance(m, dict) and "role" in m for m in messages):
            return _bad_request("each message must be an object with a 'role'", "messages")
        return await _openai(body, chat_prompt_token_count(messages), chat=True)

    return app


# ----------------------------------------------------------------------------- serving


class ServedSimulation:
    """A SimulatedServer behind uvicorn on a loopback port, its clock running in a thread.

    `start()` returns once the socket accepts connections; `stop()` shuts both down.
    `port=0` picks a free port (read `base_url` after `start()`). `speedup=None`: no clock
    thread; the caller advances the server (`advance_to`), so a client that is slow to answer
    (a loaded machine) sees the same simulated run as a fast one.
    """

    def __init__(
        self,
        server: SimulatedServer,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        speedup: float | None = 1.0,
        log_level: str = "warning",
    ) -> None:
        self.server = server
        self.clock = None if speedup is None else SimClock(server, speedup)
        server.speedup = speedup
        self.host = host
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._sock.bind((host, port))
            # Listening from here on: a client told the URL (sim serve prints it before
            # uvicorn runs) queues in the backlog instead of being refused.
            self._sock.listen(2048)
        except OSError:
            self._sock.close()  # the caller reports the port; leave no socket behind
            raise
        self.port = self._sock.getsockname()[1]
        config = uvicorn.Config(
            create_app(server), log_level=log_level, access_log=False, lifespan="off"
        )
        self.uvicorn = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout_s: float = 10.0) -> str:
        if self.clock is not None:
            self.clock.start()
        self._thread = threading.Thread(
            target=self.uvicorn.run, kwargs={"sockets": [self._sock]}, daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.uvicorn.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                self.stop()
                raise RuntimeError(f"simulated server did not start on {self.base_url}")
            time.sleep(0.01)
        return self.base_url

    def serve_forever(self) -> None:
        """Blocking: serve until interrupted (Ctrl-C), for `specctl sim serve`."""
        if self.clock is None:
            raise ValueError("serve_forever needs a running clock: pass a speedup > 0")
        self.clock.start()
        try:
            self.uvicorn.run(sockets=[self._sock])
        finally:
            self.clock.stop()

    def stop(self) -> None:
        self.uvicorn.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.clock is not None:
            self.clock.stop()
        self._sock.close()

    def __enter__(self) -> ServedSimulation:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
