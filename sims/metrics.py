"""Prometheus exposition of a simulated server: the contract's counters and SGLang's own series.

One `CollectorRegistry` per server with one custom collector that reads the engine's state at
scrape time, so the text is exactly what prometheus_client renders for a real process.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from sglang_hooks import contract
from sims.engine import Engine
from sims.profile import Profile


class ExposedServer(Protocol):
    """What the exposition reads from a `sims.server.SimulatedServer` (which owns the registry:
    naming the class here would make the two modules import each other)."""

    engine: Engine
    profile: Profile
    speculative: bool
    model_name: str
    device_timer: bool

    @property
    def captured_depths(self) -> list[int]: ...  # a table's depths (a shape server: its chains)

    @property
    def lane_labels(self) -> dict[int, str]: ...  # a shape server's tree lanes by key

    @property
    def policy_version(self) -> int: ...

    def base_label_values(self) -> list[str]: ...

    def finished_by_streaming(self) -> dict[bool, tuple[int, int]]: ...

    def latency_by_streaming(self) -> dict[bool, tuple[int, float, float]]: ...


_COUNTER_HELP = {
    contract.METRIC_ITERATIONS: "Decode iterations run at this depth and batch-size bucket",
    contract.METRIC_REQUEST_STEPS: "Sum of batch sizes over those decode iterations",
    contract.METRIC_TOKENS: "Tokens emitted by those decode iterations, bonus token included",
    contract.METRIC_GPU_SECONDS: "Seconds spent in those decode iterations",
    contract.METRIC_EXPLORE_ITERATIONS: "Those decode iterations that were exploration probes",
}

_GAUGE_HELP = {
    "sglang:num_running_reqs": "The number of running requests.",
    "sglang:num_queue_reqs": "The number of requests in the waiting queue.",
    "sglang:gen_throughput": "The generation throughput (token/s).",
    "sglang:token_usage": "The token usage.",
    "sglang:spec_accept_length": "The average acceptance length of speculative decoding.",
    "sglang:spec_accept_rate": "The average acceptance rate of speculative decoding.",
    "sglang:spec_num_steps": "The active speculative num_steps (depth).",
}


class SimulatedServerCollector(Collector):
    def __init__(self, server: ExposedServer) -> None:
        self.server = server

    def collect(self) -> Iterator[Metric]:
        server = self.server
        engine = server.engine
        base = server.base_label_values()
        labels = [*contract.BASE_LABELS, contract.LABEL_DEPTH, contract.LABEL_BUCKET]
        if server.speculative:
            families = [
                CounterMetricFamily(name, _COUNTER_HELP[name], labels=labels)
                for name in contract.COUNTER_FAMILIES
            ]
            # A shape server's trees count apart, by shape, as the plugin counts them.
            trees = server.lane_labels
            tree_families = [
                CounterMetricFamily(name, _COUNTER_HELP[family].replace("at this depth",
                                                                        "of this draft tree"),
                                    labels=[*contract.BASE_LABELS, contract.LABEL_SHAPE,
                                            contract.LABEL_BUCKET])
                for family, name in zip(contract.COUNTER_FAMILIES, contract.TREE_COUNTER_FAMILIES,
                                        strict=True)
            ]  # fmt: skip
            for (lane, bucket), row in sorted(engine.counters.items()):
                tree = trees.get(lane)
                for family, value in zip(families if tree is None else tree_families, row,
                                         strict=True):  # fmt: skip
                    family.add_metric([*base, tree or str(lane), str(bucket)], value)
            yield from families
            if any(lane in trees for lane, _ in engine.counters):
                yield from tree_families

            version = GaugeMetricFamily(
                contract.METRIC_POLICY_VERSION,
                "Version of the policy table in force (0: SGLang's own choice)",
                labels=list(contract.BASE_LABELS),
            )
            version.add_metric(base, float(server.policy_version))
            yield version
            captured = GaugeMetricFamily(
                contract.METRIC_CAPTURED_DEPTH,
                "1 for every depth the server captured CUDA graphs for",
                labels=[*contract.BASE_LABELS, contract.LABEL_DEPTH],
            )
            for depth in server.captured_depths:
                captured.add_metric([*base, str(depth)], 1.0)
            yield captured

        g = engine.gauges
        values = {
            "sglang:num_running_reqs": g.num_running_reqs,
            "sglang:num_queue_reqs": g.num_queue_reqs,
            "sglang:gen_throughput": g.gen_throughput,
            "sglang:token_usage": g.token_usage,
            "sglang:spec_accept_length": g.spec_accept_length,
            "sglang:spec_accept_rate": g.spec_accept_rate,
            "sglang:spec_num_steps": g.spec_num_steps,
        }
        for name in contract.SGLANG_GAUGES:
            gauge = GaugeMetricFamily(name, _GAUGE_HELP[name], labels=list(contract.BASE_LABELS))
            gauge.add_metric(base, values[name])
            yield gauge

        if server.device_timer:
            yield _forward_seconds(server, base)
        yield _forward_passes(server, base)

        tok_labels = ["model_name", "engine_type", "is_streaming"]
        gen = CounterMetricFamily(
            "sglang:generation_tokens", "Number of generation tokens processed.", labels=tok_labels
        )
        req = CounterMetricFamily(
            "sglang:num_requests", "The number of requests finished.", labels=tok_labels
        )
        for streaming, (tokens, requests) in sorted(server.finished_by_streaming().items()):
            flag = "true" if streaming else "false"
            gen.add_metric([server.model_name, "unified", flag], tokens)
            req.add_metric([server.model_name, "unified", flag], requests)
        yield gen
        yield req
        yield from _latency_histograms(server, tok_labels)


def _forward_seconds(server: ExposedServer, base: list[str]) -> Metric:
    """SGLang's device-timer counter (its SGLANG_ENABLE_METRICS_DEVICE_TIMER=1): GPU seconds
    per forward kind. Prefills are `extend`; a decode iteration, drafting included, is one
    `target_verify` on a speculative server (SGLang splits out `eagle_draft` and
    `eagle_draft_extend`; the simulator's step has no such split) and `decode` on a plain one."""
    stats = server.engine.stats
    kind = "target_verify" if server.speculative else "decode"
    return _by_kind(
        "sglang:forward_execution_seconds",
        "Total time that GPU is busy executing model forward passes.",
        base, "category", {"extend": stats.prefill_seconds, kind: stats.decode_gpu_seconds},
    )  # fmt: skip


def _forward_passes(server: ExposedServer, base: list[str]) -> Metric:
    """SGLang's count of forward passes by kind (exported with --enable-metrics): prefill
    batches and decode iterations. The simulator does not model which passes ran in a CUDA
    graph, so every pass is counted under the graph modes."""
    stats = server.engine.stats
    return _by_kind(
        "sglang:cuda_graph_passes",
        "Total number of forward passes categorized by CUDA graph.",
        base, "mode",
        {"prefill_cuda_graph": stats.prefill_iterations,
         "decode_cuda_graph": stats.decode_iterations},
    )  # fmt: skip


def _by_kind(
    name: str, help_text: str, base: list[str], label: str, values: dict[str, float]
) -> Metric:
    """One counter family of SGLang's scheduler labels plus `label`, a sample per kind."""
    family = CounterMetricFamily(name, help_text, labels=[*contract.BASE_LABELS, label])
    for kind, value in values.items():
        family.add_metric([*base, kind], value)
    return family


def _latency_histograms(server: ExposedServer, tok_labels: list[str]) -> Iterator[Metric]:
    """SGLang's latency histograms, summed over finished requests on the simulated clock.

    Sums and counts are exact; the simulator keeps no distribution, so each histogram has
    only its +Inf bucket (a valid exposition: every observation is below +Inf)."""
    ttft = HistogramMetricFamily(
        "sglang:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        labels=tok_labels,
    )
    e2e = HistogramMetricFamily(
        "sglang:e2e_request_latency_seconds",
        "Histogram of End-to-end request latency in seconds",
        labels=tok_labels,
    )
    for streaming, (requests, ttft_s, latency_s) in sorted(server.latency_by_streaming().items()):
        values = [server.model_name, "unified", "true" if streaming else "false"]
        ttft.add_metric(values, [("+Inf", requests)], ttft_s)
        e2e.add_metric(values, [("+Inf", requests)], latency_s)
    st = server.engine.stats
    itl = HistogramMetricFamily(
        "sglang:inter_token_latency_seconds",
        "Histogram of inter-token latency in seconds.",
        labels=tok_labels[:2],
    )
    itl.add_metric([server.model_name, "unified"], [("+Inf", st.tokens_after_first)],
                   st.decode_sum_s)  # fmt: skip
    yield ttft
    yield e2e
    yield itl


def new_registry(server: ExposedServer) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SimulatedServerCollector(server))
    return registry


def render(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode()
