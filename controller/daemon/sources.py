"""Where a target's counters come from: its own /metrics, or a Prometheus server.

Both return a `CounterSnapshot`, so deltas, reset handling and sample checks are the same code.
The Prometheus source reads the raw counters (`sum by (depth, bs_bucket)` over DP ranks, TP and
PP rank 0; a shape server's trees `sum by (shape, bs_bucket)`) through `/api/v1/query` rather
than `increase()`: `increase()` extrapolates to the
window edges, and the models need exact ratios of deltas.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import httpx

from controller.daemon.scrape import (
    CounterSnapshot,
    ScrapeError,
    parse_counters,
    series_key,
    tree_of,
)
from controller.daemon.transport import ServerTransport, TransportError
from sglang_hooks.contract import (
    BS_BUCKET_EDGES,
    COUNTER_FAMILIES,
    LABEL_BUCKET,
    LABEL_DEPTH,
    LABEL_SHAPE,
    MAX_DEPTH,
    TREE_COUNTER_FAMILIES,
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
        snap = parse_counters(text, trees=True)
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

    def query_for(self, family: str, arm_label: str = LABEL_DEPTH) -> str:
        matchers = 'tp_rank="0",pp_rank="0"'
        if self.selector:
            matchers += "," + self.selector
        return f"sum by ({arm_label}, {LABEL_BUCKET}) ({family}_total{{{matchers}}})"

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
        queries = [(f, f, LABEL_DEPTH) for f in COUNTER_FAMILIES]
        # A shape server's trees, keyed under the chain family as parse_counters keys them.
        trees = zip(COUNTER_FAMILIES, TREE_COUNTER_FAMILIES, strict=True)
        queries += [(f, t, LABEL_SHAPE) for f, t in trees]
        for family, name, arm_label in queries:
            for row in self._query(self.query_for(name, arm_label)):
                try:
                    labels = row["metric"]
                    arm = _arm(labels[arm_label], arm_label)
                    bucket = int(labels[LABEL_BUCKET])
                    value = float(row["value"][1])
                except (KeyError, ValueError, TypeError, IndexError):
                    snap.dropped_series += 1
                    continue
                if (
                    arm is None
                    or bucket not in BS_BUCKET_EDGES
                    or not math.isfinite(value)
                    or value < 0
                ):
                    snap.dropped_series += 1
                    continue
                snap.values[series_key(family, arm, bucket, "")] = value
        if not snap.values:
            raise ScrapeError(
                "no_series", f"Prometheus has no specctl_* counters for {self.selector or 'any'}"
            )
        return snap

    def close(self) -> None:
        self._client.close()


def _arm(raw: str, arm_label: str) -> int | str | None:
    """A depth in [0, MAX_DEPTH], a countable tree's label, or None; ValueError: no integer."""
    if arm_label == LABEL_SHAPE:
        shape = tree_of(raw)
        return None if shape is None else shape.label
    depth = int(raw)
    return depth if 0 <= depth <= MAX_DEPTH else None
