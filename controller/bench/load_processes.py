"""A level's load split across worker processes (`specctl bench --client-processes N`).

One event loop reads every stream of a level in `run_level`; at thousands of SSE chunks per
second that loop saturates a core and the level measures the client, not the server. Here each
of N worker processes runs the same load generator (`controller.bench.loadgen.run_share`) on
its share of the level:

- closed loop: the streams, dealt as evenly as they go (c=64 over 3: 22, 21, 21);
- open loop: every process draws the whole arrival schedule from the same seed and sends every
  Nth arrival, so the arrivals together are exactly those of one process (the same at every
  depth); `max_concurrency` is dealt like streams, each process capping its own share;
- prompts: process i sends prompts offset+i, offset+i+N, ..., so no two send the same one.

The coordinator (this process) keeps the level's clock: it releases the processes together
once all of them have their client ready, opens and closes the measured window (scraping the
server there through the sweep's hooks, while every stream is still open), counts the window's
completed requests across processes to end a `--requests-per-level` window, judges failures on
the merged counts, and tells the processes to cut their streams. Phases travel through one
shared integer the workers poll every couple of milliseconds, and the live counters through a
shared array (one writer per slot); results come back through the executor as picklable
`ShareLoad`s and are merged into one `LevelLoad`, each process's times shifted so that its
window opens when the coordinator's does. Workers start with the `spawn` method (no state of
this process is inherited) and ignore Ctrl-C: the coordinator ends them. A worker whose
coordinator dies (SIGKILL, out of memory) exits at once, which closes its streams: no load
outlives the sweep.
"""

from __future__ import annotations

import asyncio
import ctypes
import dataclasses
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Any

from controller.bench.loadgen import (
    ClosedLoop,
    Deal,
    ExternalPace,
    LevelLoad,
    LiveCounters,
    LoadError,
    LoadShape,
    OpenLoop,
    RequestResult,
    RequestStyle,
    ShareLoad,
    StopRule,
    WindowHooks,
    make_client,
    run_share,
)
from controller.bench.prompts import Prompt

# The phases of a level, in order, as the shared integer holds them.
IDLE, GO, WINDOW, WINDOW_OVER, CUT = range(5)
_PHASE_OF_SIGNAL = {
    ExternalPace.WINDOW_OPENS: WINDOW,
    ExternalPace.WINDOW_CLOSES: WINDOW_OVER,
    ExternalPace.CUT: CUT,
}
# What each worker publishes, one slot per process.
_FIELDS = ("ready", "started", "completed", "errors", "tokens", "chunks", "in_flight",
           "window_completed")  # fmt: skip
# Workers see a phase change within this (their windows agree with the coordinator's to a few
# ms); the polling costs them well under 1% of a core.
PHASE_POLL_S = 0.002
# How often the coordinator reads the counters (progress, the window's request count, failures).
COORDINATOR_POLL_S = 0.005
PUBLISH_S = 0.005
# Spawning the processes (a fresh interpreter importing httpx each) on a loaded machine.
START_TIMEOUT_S = 60.0
# Cut streams end at once; a process still running this long after the cut is stuck.
STOP_TIMEOUT_S = 30.0


def level_streams(shape: LoadShape) -> int | None:
    """The streams a level holds open at most (None: an open loop without a cap)."""
    return shape.concurrency if isinstance(shape, ClosedLoop) else shape.max_concurrency


def _deal(total: int, processes: int) -> list[int]:
    return [total // processes + (1 if i < total % processes else 0) for i in range(processes)]


def split_shape(shape: LoadShape, processes: int) -> list[LoadShape]:
    """Each process's part of `shape`; ValueError if some process would get no stream."""
    streams = level_streams(shape)
    if streams is not None and streams < processes:
        raise ValueError(f"{shape.describe()} has {streams} streams for {processes} processes")
    if isinstance(shape, ClosedLoop):
        return [ClosedLoop(c) for c in _deal(shape.concurrency, processes)]
    caps: list[int | None] = (
        [None] * processes if streams is None else list(_deal(streams, processes))
    )
    return [OpenLoop(shape.rate, shape.burstiness, cap) for cap in caps]


@dataclass(frozen=True)
class ShareTask:
    """What a worker needs for its share of one level (prompts came with the process)."""

    url: str
    shape: LoadShape
    deal: Deal
    model: str
    temperature: float
    prompt_offset: int
    seed: int
    style: RequestStyle = dataclasses.field(default_factory=RequestStyle)
    headers: tuple[tuple[str, str], ...] = ()  # the client's (API key, --header)


class _Shared:
    """The phase and the counters, as both sides see them."""

    def __init__(self, phase: Any, counters: Any) -> None:
        self.phase = phase
        self.counters = counters

    def publish(self, index: int, live: LiveCounters, ready: bool = True) -> None:
        base = index * len(_FIELDS)
        values = (1.0 if ready else 0.0, live.started, live.completed, live.errors, live.tokens,
                  live.chunks, live.in_flight, live.window_completed)  # fmt: skip
        for offset, value in enumerate(values):
            self.counters[base + offset] = value

    def read(self, index: int) -> dict[str, float]:
        base = index * len(_FIELDS)
        return {name: self.counters[base + i] for i, name in enumerate(_FIELDS)}


# ----------------------------------------------------------------------------- worker side

_worker: tuple[_Shared, list[Prompt]] | None = None
_all_started: Any = None  # a barrier of every worker: `start` meets it once per worker


def _init_worker(phase: Any, counters: Any, prompts: list[Prompt], all_started: Any) -> None:
    """Runs once in each worker process (the shared memory can only travel at its start)."""
    global _worker, _all_started
    _all_started = all_started
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the coordinator, who ends us
    _worker = (_Shared(phase, counters), prompts)
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=_exit_with, args=(parent.sentinel,), daemon=True).start()


def _exit_with(parent_sentinel: int) -> None:
    """Exit the moment the coordinator does (the executor's own worker loop would wait for work
    forever, and a running share would keep loading the server)."""
    multiprocessing.connection.wait([parent_sentinel])
    os._exit(0)


async def _phase_reached(shared: _Shared, phase: int) -> None:
    while shared.phase.value < phase:
        await asyncio.sleep(PHASE_POLL_S)


async def _keep_publishing(shared: _Shared, index: int, live: LiveCounters) -> None:
    while True:
        shared.publish(index, live)
        await asyncio.sleep(PUBLISH_S)


async def _share(task: ShareTask) -> ShareLoad:
    assert _worker is not None, "run in a process started by LoadProcesses"
    shared, prompts = _worker
    index = task.deal.index
    live = LiveCounters()
    async with make_client(task.url, level_streams(task.shape), dict(task.headers)) as http:
        shared.publish(index, live)  # ready: the coordinator releases every process at once
        await _phase_reached(shared, GO)
        publisher = asyncio.create_task(_keep_publishing(shared, index, live))
        try:
            return await run_share(
                http, prompts, task.shape,
                ExternalPace(lambda name: _phase_reached(shared, _PHASE_OF_SIGNAL[name])),
                task.deal, model=task.model, temperature=task.temperature,
                prompt_offset=task.prompt_offset, live=live, seed=task.seed, style=task.style,
            )  # fmt: skip
        finally:
            publisher.cancel()
            shared.publish(index, live)


def _started(timeout_s: float) -> int:
    """A worker's answer that it runs, given once every worker runs one (so that no worker
    answers twice while another is still starting)."""
    _all_started.wait(timeout_s)
    return os.getpid()


def run_share_task(task: ShareTask) -> ShareLoad:
    """A worker's entry point: one share of one level, on its own event loop."""
    return asyncio.run(_share(task))


# ----------------------------------------------------------------------------- coordinator


def _shifted(r: RequestResult, by: float) -> RequestResult:
    last = None if r.last_token_s is None else r.last_token_s + by
    return dataclasses.replace(r, start_s=r.start_s + by, end_s=r.end_s + by, last_token_s=last)


def peak_in_flight(requests: Sequence[RequestResult], start: float, end: float) -> int:
    """The most requests open at once between `start` and `end` (what one process counts as it
    goes, from the merged requests of several)."""
    open_at_start = sum(1 for r in requests if r.start_s <= start < r.end_s)
    events = [(r.start_s, 1) for r in requests if start < r.start_s <= end]
    events += [(r.end_s, -1) for r in requests if start < r.end_s <= end]
    peak = running = open_at_start
    for _, step in sorted(events):  # at equal times an end (-1) sorts first
        running += step
        peak = max(peak, running)
    return peak


def merge(
    shape: LoadShape, shares: Sequence[ShareLoad], window_start_s: float, elapsed_s: float
) -> LevelLoad:
    """One level from its shares, on the coordinator's clock: each share's times are moved so
    that its window opens at `window_start_s`."""
    requests: list[RequestResult] = []
    for share in shares:
        by = window_start_s - share.window_start_s
        requests += [_shifted(r, by) for r in share.requests]
    requests.sort(key=lambda r: r.end_s)  # the order one process records them in
    concurrency = (
        shape.concurrency
        if isinstance(shape, ClosedLoop)
        else peak_in_flight(requests, window_start_s, window_start_s + elapsed_s)
    )
    return LevelLoad(
        shape=shape,
        concurrency=concurrency,
        warmup_s=window_start_s,
        elapsed_s=elapsed_s,
        tokens=sum(s.tokens for s in shares),
        requests=tuple(requests),
        client_cpu_s=sum(s.cpu_s for s in shares),
        process_cpu_s=tuple(s.cpu_s for s in shares),
    )


class LoadProcesses:
    """N worker processes for a whole sweep: started on the first level, each running its share
    of every level. Close it (or use it as a context manager) to end them."""

    def __init__(self, processes: int, prompts: Sequence[Prompt]) -> None:
        if processes < 2:
            raise ValueError("a load split across processes needs at least 2 of them")
        if not prompts:
            raise ValueError("no prompts to send")
        ctx = multiprocessing.get_context("spawn")
        self.processes = processes
        phase = ctx.RawValue(ctypes.c_int, IDLE)
        counters = ctx.RawArray(ctypes.c_double, processes * len(_FIELDS))
        self.shared = _Shared(phase, counters)
        self.pool = ProcessPoolExecutor(
            processes, mp_context=ctx, initializer=_init_worker,
            initargs=(phase, counters, list(prompts), ctx.Barrier(processes)),
        )  # fmt: skip

    def __enter__(self) -> LoadProcesses:
        return self

    def start(self) -> set[int]:
        """Start every worker now (the executor starts them on the first level otherwise,
        which then waits for the interpreters: a gap in a trace whose clock runs); the
        process ids that answered."""
        pending = [self.pool.submit(_started, START_TIMEOUT_S) for _ in range(self.processes)]
        return {future.result(timeout=START_TIMEOUT_S) for future in pending}

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.shared.phase.value = CUT
        self.pool.shutdown(wait=True, cancel_futures=True)

    def _totals(self, live: LiveCounters) -> int:
        """Merged counters into `live`; how many processes are ready."""
        rows = [self.shared.read(i) for i in range(self.processes)]
        for name in ("started", "completed", "errors", "tokens", "chunks", "in_flight",
                     "window_completed"):  # fmt: skip
            setattr(live, name, int(sum(row[name] for row in rows)))
        return sum(1 for row in rows if row["ready"])

    async def _until(
        self,
        futures: Sequence[asyncio.Future[ShareLoad]],
        live: LiveCounters,
        timeout_s: float | None,
        done: Callable[[int], bool],
    ) -> bool:
        """Poll the counters until `done(ready processes)`, a process returns (a bug or a crash)
        or the timeout; whether `done` held."""
        deadline = None if timeout_s is None else time.perf_counter() + timeout_s
        while True:
            if done(self._totals(live)):
                return True
            if any(f.done() for f in futures):
                return False
            now = time.perf_counter()
            if deadline is not None and now >= deadline:
                return False
            wait = COORDINATOR_POLL_S if deadline is None else min(COORDINATOR_POLL_S,
                                                                   deadline - now)  # fmt: skip
            await asyncio.sleep(wait)

    async def run_level(
        self,
        url: str,
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
        headers: dict[str, str] | None = None,
    ) -> tuple[LevelLoad, int]:
        """`loadgen.run_level` across the processes; also the prompt offset for the next level
        (past every prompt any process may have sent)."""
        n = self.processes
        hooks = hooks or WindowHooks()
        live = live or LiveCounters()
        shares = split_shape(shape, n)
        max_errors = max(level_streams(shape) or 0, 5)  # as one process judges it

        def failing(_: int) -> bool:
            return live.errors >= max_errors and live.errors > live.completed

        self.shared.phase.value = IDLE
        for i in range(len(self.shared.counters)):
            self.shared.counters[i] = 0.0
        futures = [
            asyncio.wrap_future(self.pool.submit(run_share_task, ShareTask(
                url, part, Deal(i, n), model, temperature, prompt_offset, seed,
                style or RequestStyle(), tuple((headers or {}).items()))))
            for i, part in enumerate(shares)
        ]  # fmt: skip
        failed = started = False
        try:
            started = await self._until(futures, live, START_TIMEOUT_S, lambda ready: ready == n)
            if started:
                live.t0 = time.perf_counter()
                live.warming_up = True
                self.shared.phase.value = GO
                if stop.warmup > 0:
                    failed = await self._until(futures, live, stop.warmup, failing)
                window_start = time.perf_counter()
                self.shared.phase.value = WINDOW
                live.warming_up = False
                await hooks.window_started()

                def window_done(ready: int) -> bool:
                    enough = stop.requests is not None and live.window_completed >= stop.requests
                    return enough or failing(ready)

                await self._until(futures, live, stop.duration_s, window_done)
                failed = failed or failing(n)
                window_end = time.perf_counter()
                self.shared.phase.value = WINDOW_OVER
                await hooks.window_ended()
        finally:
            self.shared.phase.value = CUT
            _, pending = await asyncio.wait(futures, timeout=STOP_TIMEOUT_S)
            for f in futures:  # retrieved here too, so an interrupted level logs nothing
                if f.done() and not f.cancelled():
                    f.exception()
        loads = self._results(futures, pending, started)
        self._totals(live)
        merged = merge(shape, loads, window_start - live.t0, window_end - window_start)
        if failed or failing(n):
            raise LoadError(_failure(url, merged))
        next_offset = prompt_offset + n * max(s.started for s in loads)
        return merged, next_offset

    def _results(
        self,
        futures: Sequence[asyncio.Future[ShareLoad]],
        pending: set[asyncio.Future[ShareLoad]],
        started: bool,
    ) -> list[ShareLoad]:
        if pending:
            raise LoadError(
                f"{len(pending)} of {self.processes} load-generator processes did not stop "
                f"{STOP_TIMEOUT_S:g} s after their streams were cut"
            )
        for f in futures:
            err = f.exception()
            if isinstance(err, BrokenProcessPool):
                raise LoadError(
                    f"a load-generator process ended unexpectedly ({err}); was it killed, or "
                    "out of memory? Try fewer --client-processes"
                ) from None
            if err is not None:
                raise err
        if not started:
            raise LoadError(
                f"the {self.processes} load-generator processes were not ready within "
                f"{START_TIMEOUT_S:g} s; the machine is too busy for --client-processes "
                f"{self.processes}"
            )
        return [f.result() for f in futures]


def _failure(url: str, load: LevelLoad) -> str:
    errors = [r for r in load.requests if r.error is not None]
    first = errors[0].error if errors else "none recorded"
    return (
        f"{len(errors)} of {len(load.requests)} requests to {url.rstrip('/')}/v1/completions "
        f"failed; first error: {first}"
    )
