"""A /metrics reader beside a trace: what the daemon's scrapes alone cost the server.

The policy `static:D+scrape` runs the static table of depth D while this thread reads the
server's /metrics at the daemon's trace interval (one a second, benchmarks/gpu/daemon_run.py),
as the daemon does, and nothing else: its tok/s beside `static:D`'s is the price of the
scrapes, apart from the daemon's decisions. Each read's time and size are kept, so the result
also shows how long the server takes to render the page under that load.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType
from typing import Any

import httpx
import numpy as np

SUFFIX = "+scrape"


def split_policy(text: str) -> tuple[str, bool]:
    """(`static:3`, True) for `static:3+scrape`; (text, False) for a policy without it."""
    if text.endswith(SUFFIX):
        return text.removesuffix(SUFFIX), True
    return text, False


class MetricsReader:
    """Reads `url`/metrics every `interval_s` on a thread until closed (a context manager)."""

    def __init__(self, url: str, interval_s: float, api_key: str | None = None,
                 timeout_s: float = 5.0) -> None:  # fmt: skip
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.Client(base_url=url, headers=headers, timeout=timeout_s)
        self._interval = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="metrics-reader", daemon=True)
        self.seconds: list[float] = []
        self.sizes: list[int] = []
        self.errors: list[str] = []

    def __enter__(self) -> MetricsReader:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, err: BaseException | None,
                 tb: TracebackType | None) -> None:  # fmt: skip
        self._stop.set()
        self._thread.join()
        self._client.close()

    def _loop(self) -> None:
        due = time.monotonic()
        while not self._stop.is_set():
            start = time.perf_counter()
            try:
                response = self._client.get("/metrics")
                response.raise_for_status()
                self.seconds.append(time.perf_counter() - start)
                self.sizes.append(len(response.content))
            except httpx.HTTPError as err:
                self.errors.append(f"{type(err).__name__}: {err}"[:200])
            # the next read one interval on; a read that overran it is not made up for
            due = max(due + self._interval, time.monotonic())
            self._stop.wait(due - time.monotonic())

    def summary(self) -> dict[str, Any]:
        """Reads made, their time (ms: median, p99, max) and size (bytes, mean), errors."""
        ms = np.asarray(self.seconds) * 1000.0
        return {
            "interval_s": self._interval,
            "reads": len(self.seconds),
            "ms_p50": round(float(np.percentile(ms, 50)), 2) if ms.size else None,
            "ms_p99": round(float(np.percentile(ms, 99)), 2) if ms.size else None,
            "ms_max": round(float(ms.max()), 2) if ms.size else None,
            "bytes_mean": round(float(np.mean(self.sizes))) if self.sizes else None,
            "errors": len(self.errors),
            "first_error": self.errors[0] if self.errors else None,
        }
