"""Where a target's counters come from: its own /metrics, or a Prometheus server.

Both return a `CounterSnapshot`, so deltas, reset handling and sample checks are the same code.
The Prometheus source reads the raw counters (`sum by (depth, bs_bucket)` over DP ranks, TP and
PP rank 0) through `/api/v1/query` rather than `increase()`: `increase()` extrapolates to the
window edges, and the models need exact ratios of deltas.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import httpx

from controller.daemon.scrape import CounterSnapshot, ScrapeError, parse_counters, series_key
from controller.daemon.transport import ServerTransport, TransportError
from sglang_hooks.contract import (
    BS_BUCKET_EDGES,
    COUNTER_FAMILIES,
    LABEL_BUCKET,
    LABEL_DEPTH,
    MAX_DEPTH,
)


class CounterSource(Protocol):
    def read_counters(self) -> CounterSnapshot: ...


class MetricsPageSource:
    """Scrape the server's /metrics and parse it with prometheus_client's parser."""

    def __init__(self, transport: ServerTransport) -> None:
        self.transport = transport

    def read_counters(self) -> CounterSnapshot:
        try:
            text = self.transport.metrics_text()
        except TransportError as err:
            raise ScrapeError(err.kind, str(err)) from err
        snap = parse_counters(text)
        if not snap.values and snap.dropped_series:
            raise ScrapeError(
                "garbage",
                f"every specctl series is unreadable ({snap.dropped_series} dropped: NaN, "
                "negative, bad labels or incomplete cells)",
            )
        if not snap.values:
            raise ScrapeError(
                "no_series",
                "no specctl_* counters on /metrics yet: the server has not decoded since it "
                "started, or the specctl plugin is not loaded (SGLANG_PLUGINS=specctl) or "
                "--enable-metrics is not set",
            )
        return snap


class PrometheusSource:
    """Read the same counters from a Prometheus server's HTTP query API."""

    def __init__(self, base_url: str, selector: str, timeout_s: float) -> None:
        self.base_url = base_url.rstrip("/")
        self.selector = selector.strip().strip(",")
        self._client = httpx.Client(base_url=self.base_url, timeout=timeout_s)

    def query_for(self, family: str) -> str:
        matchers = 'tp_rank="0",pp_rank="0"'
        if self.selector:
            matchers += "," + self.selector
        return f"sum by ({LABEL_DEPTH}, {LABEL_BUCKET}) ({family}_total{{{matchers}}})"

    def _query(self, promql: str) -> list[dict[str, Any]]:
        try:
            resp = self._client.get("/api/v1/query", params={"query": promql})
        except httpx.TimeoutException as err:
            raise ScrapeError("timeout", f"Prometheus query timed out: {err}") from err
        except httpx.HTTPError as err:
            raise ScrapeError("unreachable", f"Prometheus at {self.base_url}: {err}") from err
        try:
            body = resp.json()
        except ValueError:
            raise ScrapeError(
                "parse", f"Prometheus answered HTTP {resp.status_code}, not JSON"
            ) from None
        if resp.status_code != 200 or body.get("status") != "success":
            raise ScrapeError(
                "http_status",
                f"Prometheus query failed (HTTP {resp.status_code}): {body.get('error', body)}",
            )
        data = body.get("data", {})
        if data.get("resultType") != "vector" or not isinstance(data.get("result"), list):
            raise ScrapeError("parse", "Prometheus answer is not an instant vector")
        return list(data["result"])

    def read_counters(self) -> CounterSnapshot:
        snap = CounterSnapshot()
        for family in COUNTER_FAMILIES:
            for row in self._query(self.query_for(family)):
                try:
                    labels = row["metric"]
                    depth = int(labels[LABEL_DEPTH])
                    bucket = int(labels[LABEL_BUCKET])
                    value = float(row["value"][1])
                except (KeyError, ValueError, TypeError, IndexError):
                    snap.dropped_series += 1
                    continue
                if (
                    not 0 <= depth <= MAX_DEPTH
                    or bucket not in BS_BUCKET_EDGES
                    or not math.isfinite(value)
                    or value < 0
                ):
                    snap.dropped_series += 1
                    continue
                snap.values[series_key(family, depth, bucket, "")] = value
        if not snap.values:
            raise ScrapeError(
                "no_series", f"Prometheus has no specctl_* counters for {self.selector or 'any'}"
            )
        return snap

    def close(self) -> None:
        self._client.close()
