"""GPU seconds per decode iteration, measured without a device sync on the hot path.

CUDA path (`CudaEventTimer`): at launch, two timing events bracket the iteration's work on
the current (forward) stream: one recorded before `forward_batch_generation` enqueues
anything, one right after it returns. Recording is asynchronous. When the iteration's result
is processed, its tokens have already been copied to the host, which happens on the same
stream after the end event, so the end event is complete and `elapsed_time` returns at once.
If it ever is not complete (`query()` is False) the pair is parked and read on a later
iteration: the plugin never waits on the GPU. The figure is the GPU time between the two
points, idle gaps inside the iteration included, which is what tok/s per GPU second needs.

Host path (`HostIntervalTimer`, used where CUDA is absent, e.g. CPU tests): the time between
consecutive result-ready points. Under overlap scheduling with back-to-back decode batches
that interval is the iteration time; an idle gap longer than `max_gap_s` is not attributed.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any, Protocol


class LaunchTimer(Protocol):
    def begin(self) -> Any: ...
    def end(self, token: Any) -> Any: ...
    def discard(self, token: Any) -> None: ...
    def seconds(self, token: Any) -> float | None: ...


class HostIntervalTimer:
    """Seconds between consecutive result-ready points (no device needed)."""

    def __init__(self, max_gap_s: float = 1.0, clock: Any = time.perf_counter) -> None:
        self._clock = clock
        self._last: float | None = None
        self._max_gap = max_gap_s

    def begin(self) -> Any:
        return None

    def end(self, token: Any) -> Any:
        return None

    def discard(self, token: Any) -> None:
        return None

    def seconds(self, token: Any) -> float | None:
        now = self._clock()
        last, self._last = self._last, now
        if last is None or now - last > self._max_gap:
            return 0.0
        return now - last


class CudaEventTimer:
    """Timing-event pairs from a pool; read back only once complete."""

    def __init__(self, event_factory: Any, pool_size: int = 64) -> None:
        self._new_event = event_factory
        self._pool: deque[Any] = deque(event_factory() for _ in range(2 * pool_size))
        self.parked: deque[tuple[Any, Any, Any]] = deque()

    def _take(self) -> Any:
        return self._pool.popleft() if self._pool else self._new_event()

    def begin(self) -> Any:
        start = self._take()
        start.record()
        return start

    def end(self, token: Any) -> Any:
        stop = self._take()
        stop.record()
        return (token, stop)

    def discard(self, token: Any) -> None:
        if token is not None:
            self._pool.append(token)

    def seconds(self, token: Any) -> float | None:
        """GPU seconds of a finished pair, or None if its end event is not complete yet."""
        start, stop = token
        if not stop.query():
            return None
        ms = start.elapsed_time(stop)
        self._pool.append(start)
        self._pool.append(stop)
        return ms / 1000.0


def make_timer() -> LaunchTimer:
    try:
        import torch

        if torch.cuda.is_available():
            return CudaEventTimer(lambda: torch.cuda.Event(enable_timing=True))
    except Exception:  # no torch / no driver: fall back to host intervals
        pass
    return HostIntervalTimer()
