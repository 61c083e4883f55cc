"""Read the contract's per-(depth, bucket) counters and SGLang's gauges from `/metrics` text.

Counters are summed over every series of a (depth, bucket) pair (one series per TP/DP rank), so
a delta between two scrapes is the server's total work at that depth and bucket in between.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from controller.daemon.scrape import ScrapeError, first_rank, parse_counters, split_key
from sglang_hooks.contract import (
    COUNTER_FAMILIES,
    LABEL_SHAPE,
    METRIC_EXPLORE_ITERATIONS,
    METRIC_GPU_SECONDS,
    METRIC_ITERATIONS,
    METRIC_REQUEST_STEPS,
    METRIC_TOKENS,
    TREE_COUNTER_FAMILIES,
)

_FIELD_BY_FAMILY = {
    METRIC_ITERATIONS: "iterations",
    METRIC_REQUEST_STEPS: "request_steps",
    METRIC_TOKENS: "tokens",
    METRIC_GPU_SECONDS: "gpu_seconds",
    METRIC_EXPLORE_ITERATIONS: "explore_iterations",
}
# A shape server's tree series carry the same fields, by shape instead of depth.
_TREE_FIELD_BY_FAMILY = {
    tree: _FIELD_BY_FAMILY[family]
    for family, tree in zip(COUNTER_FAMILIES, TREE_COUNTER_FAMILIES, strict=True)
}


# Server-side latencies SGLang's tokenizer manager observes (count: requests; for the
# inter-token latency: tokens after each request's first, sum: the intervals between them).
TTFT_HISTOGRAM = "sglang:time_to_first_token_seconds"
ITL_HISTOGRAM = "sglang:inter_token_latency_seconds"
LATENCY_HISTOGRAMS = (TTFT_HISTOGRAM, ITL_HISTOGRAM)

# GPU seconds per forward kind, from SGLang's device timer (exported only when the server runs
# with SGLANG_ENABLE_METRICS_DEVICE_TIMER=1): CUDA events around each forward, by `category`
# (decode, extend, target_verify, eagle_draft, eagle_draft_extend, idle, split_prefill).
FORWARD_SECONDS = "sglang:forward_execution_seconds"
# The categories that are prefill work: a speculative server's draft prefill runs the draft
# model's extend, which SGLang times as `extend` too.
PREFILL_CATEGORIES = frozenset({"extend", "split_prefill"})
# Forward passes by kind, counted by SGLang with --enable-metrics whatever the device timer:
# `mode` is prefill_cuda_graph / prefill_none / decode_cuda_graph / decode_none. A window's
# prefills per decode iteration say how often new requests' prefills ran between iterations.
FORWARD_PASSES = "sglang:cuda_graph_passes"
# The prefix cache's evictions, timed by SGLang on the scheduler's host loop around each call
# (exported with --enable-metrics where the radix cache is on). Once the KV pool is full of
# cached prefixes, every allocation evicts first, each call walking every evictable leaf.
EVICTION_HISTOGRAM = "sglang:eviction_duration_seconds"
# SGLang's own speculative counters, kept by its tokenizer manager as requests finish: output
# tokens and verify passes. Their ratio over a window is the accept length of a server without
# the plugin's counters (SGLang's own static shape, a tree among them). Family names as the
# parser gives them (without `_total`).
GENERATION_TOKENS = "sglang:generation_tokens"
VERIFY_CALLS = "sglang:spec_verify_calls"


class MetricsFormatError(ValueError):
    """The `/metrics` body is not Prometheus text format."""


@dataclass(frozen=True)
class DepthWork:
    """Decode work done at one depth (summed over buckets, or one bucket)."""

    iterations: float = 0.0
    request_steps: float = 0.0
    tokens: float = 0.0
    gpu_seconds: float = 0.0
    explore_iterations: float = 0.0

    def __add__(self, other: DepthWork) -> DepthWork:
        return DepthWork(
            self.iterations + other.iterations,
            self.request_steps + other.request_steps,
            self.tokens + other.tokens,
            self.gpu_seconds + other.gpu_seconds,
            self.explore_iterations + other.explore_iterations,
        )

    def __sub__(self, other: DepthWork) -> DepthWork:
        return DepthWork(
            self.iterations - other.iterations,
            self.request_steps - other.request_steps,
            self.tokens - other.tokens,
            self.gpu_seconds - other.gpu_seconds,
            self.explore_iterations - other.explore_iterations,
        )

    @property
    def mean_batch(self) -> float | None:
        return self.request_steps / self.iterations if self.iterations > 0 else None

    @property
    def accept_length(self) -> float | None:
        return self.tokens / self.request_steps if self.request_steps > 0 else None

    @property
    def decode_tok_per_s(self) -> float | None:
        return self.tokens / self.gpu_seconds if self.gpu_seconds > 0 else None

    @property
    def step_ms(self) -> float | None:
        return 1000.0 * self.gpu_seconds / self.iterations if self.iterations > 0 else None


@dataclass(frozen=True)
class Scrape:
    """One `/metrics` scrape: contract counters per (depth, bucket) and every gauge by name."""

    counters: Mapping[tuple[int, int], DepthWork]
    gauges: Mapping[str, float]
    # SGLang's latency histograms (`LATENCY_HISTOGRAMS`): (sum of seconds, count), summed over
    # label sets. Measured inside the server, so free of the client's and the network's time.
    histograms: Mapping[str, tuple[float, float]] = field(default_factory=dict)
    # `FORWARD_SECONDS` per category (TP rank 0, PP rank 0, summed over DP ranks); empty when
    # the server does not export it.
    forward_seconds: Mapping[str, float] = field(default_factory=dict)
    # `FORWARD_PASSES` per mode, read the same way; empty when the server does not export it.
    forward_passes: Mapping[str, float] = field(default_factory=dict)
    # `EVICTION_HISTOGRAM` of TP rank 0 and PP rank 0 (SGLang 0.5.23 labels it by rank; 0.5.17
    # by cache type alone, which sums the TP ranks): (sum of seconds, count); None when the
    # server does not export it.
    evictions: tuple[float, float] | None = None
    # `GENERATION_TOKENS` and `VERIFY_CALLS`, summed over label sets; absent when not exported.
    spec_totals: Mapping[str, float] = field(default_factory=dict)
    # A shape server's decode work of each draft tree (by shape, over buckets), read as the
    # contract counters are: TP and PP rank 0, summed over DP ranks.
    trees: Mapping[str, DepthWork] = field(default_factory=dict)

    def by_depth(self) -> dict[int, DepthWork]:
        out: dict[int, DepthWork] = {}
        for (depth, _bucket), work in self.counters.items():
            out[depth] = out.get(depth, DepthWork()) + work
        return out

    def has_contract_counters(self) -> bool:
        return bool(self.counters)


def parse_scrape(text: str) -> Scrape:
    """Parse Prometheus text; raise MetricsFormatError with the parser's reason on garbage.

    The contract counters are read exactly as the daemon reads them (`parse_counters`): TP rank
    0 and PP rank 0 only (every TP rank counts the same iterations), summed over DP ranks,
    NaN and negative values dropped.
    """
    try:
        snapshot = parse_counters(text)
        families = list(text_string_to_metric_families(text))
    except (ScrapeError, ValueError) as err:
        raise MetricsFormatError(f"not Prometheus text format: {err}") from None
    sums: dict[tuple[int, int], dict[str, float]] = {}
    for key, value in snapshot.values.items():
        family, depth, bucket, _dp_rank = split_key(key)
        slot = sums.setdefault((depth, bucket), {})
        field = _FIELD_BY_FAMILY[family]
        slot[field] = slot.get(field, 0.0) + value
    gauges: dict[str, float] = {}
    histograms: dict[str, tuple[float, float]] = {}
    forward: dict[str, float] = {}
    passes: dict[str, float] = {}
    evictions: tuple[float, float] | None = None
    spec_totals: dict[str, float] = {}
    trees: dict[str, dict[str, float]] = {}
    for metric in families:
        tree_field = _TREE_FIELD_BY_FAMILY.get(metric.name)
        if metric.type == "counter" and tree_field is not None:
            for sample in metric.samples:
                shape = sample.labels.get(LABEL_SHAPE)
                if (shape and sample.name.endswith("_total") and first_rank(sample.labels)
                        and math.isfinite(sample.value) and sample.value >= 0):
                    slot = trees.setdefault(shape, {})
                    slot[tree_field] = slot.get(tree_field, 0.0) + sample.value
        if metric.type == "counter" and metric.name in (GENERATION_TOKENS, VERIFY_CALLS):
            spec_totals[metric.name] = sum(
                max(x.value, 0.0) for x in metric.samples
                if x.name.endswith("_total") and math.isfinite(x.value))
        if metric.type == "counter" and metric.name in (FORWARD_SECONDS, FORWARD_PASSES):
            into, label = (forward, "category") if metric.name == FORWARD_SECONDS else (
                passes, "mode")
            for sample in metric.samples:
                labels = sample.labels
                if sample.name.endswith("_total") and first_rank(labels) \
                        and math.isfinite(sample.value):
                    kind = labels.get(label, "")
                    into[kind] = into.get(kind, 0.0) + max(sample.value, 0.0)
        if metric.type == "histogram" and metric.name == EVICTION_HISTOGRAM:
            # every rank has its own cache and evicts alike: rank 0's, finite values only
            evictions = _sum_count(metric.name, metric.samples,
                                   lambda x: first_rank(x.labels) and math.isfinite(x.value))
        if metric.type == "histogram" and metric.name in LATENCY_HISTOGRAMS:
            histograms[metric.name] = _sum_count(metric.name, metric.samples, lambda x: True)
        if metric.type != "gauge":
            continue
        for sample in metric.samples:
            # Several ranks report the same gauge; keep the largest (e.g. running reqs).
            gauges[sample.name] = max(gauges.get(sample.name, float("-inf")), sample.value)
    counters = {key: DepthWork(**fields) for key, fields in sums.items()}
    return Scrape(
        counters=counters, gauges=gauges, histograms=histograms, forward_seconds=forward,
        forward_passes=passes, evictions=evictions, spec_totals=spec_totals,
        trees={shape: DepthWork(**fields) for shape, fields in trees.items()},
    )  # fmt: skip


def _sum_count(name: str, samples: Iterable[Sample], keep: Callable[[Sample], bool]
               ) -> tuple[float, float]:
    """A histogram's sum and count, added up over the samples `keep` takes."""
    kept = [x for x in samples if keep(x)]
    return (sum(x.value for x in kept if x.name == name + "_sum"),
            sum(x.value for x in kept if x.name == name + "_count"))


def sglang_accept_length_between(before: Scrape, after: Scrape) -> float | None:
    """Output tokens per verify pass of the requests that finished between two scrapes, by
    SGLang's own counters; None where the server does not count verify passes or ran none."""
    try:
        tokens = after.spec_totals[GENERATION_TOKENS] - before.spec_totals[GENERATION_TOKENS]
        calls = after.spec_totals[VERIFY_CALLS] - before.spec_totals[VERIFY_CALLS]
    except KeyError:
        return None
    return tokens / calls if calls > 0 else None


def mean_between(before: Scrape, after: Scrape, histogram: str) -> float | None:
    """Mean of one latency histogram's observations between two scrapes (seconds)."""
    if histogram not in before.histograms or histogram not in after.histograms:
        return None
    (s0, n0), (s1, n1) = before.histograms[histogram], after.histograms[histogram]
    return (s1 - s0) / (n1 - n0) if n1 > n0 else None


@dataclass(frozen=True)
class ForwardBusy:
    """GPU seconds per second of a window, split into prefill and the rest (decode, verify,
    drafting), as SGLang's device timer measured them."""

    prefill: float
    decode: float


def forward_busy_between(before: Scrape, after: Scrape, seconds: float) -> ForwardBusy | None:
    """None when either scrape lacks the device timer's counter or the window is empty."""
    if not before.forward_seconds or not after.forward_seconds or seconds <= 0:
        return None
    prefill = decode = 0.0
    for kind, value in after.forward_seconds.items():
        delta = max(value - before.forward_seconds.get(kind, 0.0), 0.0)
        if kind in PREFILL_CATEGORIES:
            prefill += delta
        else:
            decode += delta
    return ForwardBusy(prefill=prefill / seconds, decode=decode / seconds)


@dataclass(frozen=True)
class ForwardPasses:
    """Forward passes of a window: prefill batches and decode iterations (verify included)."""

    prefill: int
    decode: int


def passes_between(before: Scrape, after: Scrape) -> ForwardPasses | None:
    """None when either scrape lacks SGLang's pass counter."""
    if not before.forward_passes or not after.forward_passes:
        return None
    counts = {"prefill": 0, "decode": 0}
    for mode, value in after.forward_passes.items():
        kind = mode.split("_", 1)[0]
        if kind in counts:
            counts[kind] += round(max(value - before.forward_passes.get(mode, 0.0), 0.0))
    return ForwardPasses(prefill=counts["prefill"], decode=counts["decode"])


@dataclass(frozen=True)
class Evictions:
    """The prefix cache's evictions in a window: calls, and seconds spent in them."""

    calls: int
    seconds: float


def evictions_between(before: Scrape, after: Scrape) -> Evictions | None:
    """None when the closing scrape lacks SGLang's eviction histogram. SGLang exports it from
    the first eviction on, so one that appears inside the window counted from zero. A count
    that went back (a restarted server) reads as none rather than a negative."""
    if after.evictions is None:
        return None
    (s0, n0), (s1, n1) = before.evictions or (0.0, 0.0), after.evictions
    if n1 < n0:
        return Evictions(calls=0, seconds=0.0)
    return Evictions(calls=round(n1 - n0), seconds=max(s1 - s0, 0.0))


def work_between(before: Scrape, after: Scrape) -> dict[int, DepthWork]:
    """Work per depth done between two scrapes (depths with no new iterations are left out)."""
    b, a = before.by_depth(), after.by_depth()
    out = {}
    for depth, work in a.items():
        delta = work - b.get(depth, DepthWork())
        if delta.iterations > 0:
            out[depth] = delta
    return out


def tree_work_between(before: Scrape, after: Scrape) -> dict[str, DepthWork]:
    """Work per draft tree done between two scrapes (a shape server; trees with no new
    iterations are left out)."""
    out = {}
    for shape, work in after.trees.items():
        delta = work - before.trees.get(shape, DepthWork())
        if delta.iterations > 0:
            out[shape] = delta
    return out


def total(works: Iterable[DepthWork]) -> DepthWork:
    out = DepthWork()
    for w in works:
        out = out + w
    return out
