"""Export the per-depth counts to SGLang's own `/metrics` (its multiprocess registry).

Created in the scheduler process that owns SGLang's scheduler metrics (TP rank 0 of each
replica; only with `--enable-metrics`), after SGLang has set PROMETHEUS_MULTIPROC_DIR, so
the series land in the same files SGLang's HTTP process aggregates: no new port.
Deltas are pushed at a coarse cadence (runtime.EXPORT_INTERVAL_S), never per iteration.
Labels: those of SGLang's scheduler collector, as given (see `series_labels`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sglang_hooks.contract import (
    BASE_LABELS,
    COUNTER_FAMILIES,
    LABEL_BUCKET,
    LABEL_DEPTH,
    LABEL_SHAPE,
    METRIC_CAPTURED_DEPTH,
    METRIC_EXPLORE_ITERATIONS,
    METRIC_GPU_SECONDS,
    METRIC_ITERATIONS,
    METRIC_POLICY_VERSION,
    METRIC_REQUEST_STEPS,
    METRIC_TOKENS,
    TREE_COUNTER_FAMILIES,
)

if TYPE_CHECKING:
    from sglang_hooks.runtime import SchedulerRuntime

_HELP = {
    METRIC_ITERATIONS: "Decode iterations run, by speculation depth and batch-size bucket.",
    METRIC_REQUEST_STEPS: "Sum of batch sizes over those decode iterations.",
    METRIC_TOKENS: "Tokens emitted by those decode iterations (bonus token included).",
    METRIC_GPU_SECONDS: "GPU seconds spent in those decode iterations (CUDA events).",
    METRIC_EXPLORE_ITERATIONS: "Decode iterations that were exploration probes.",
}


def series_labels(collector_labels: Mapping[str, Any]) -> tuple[str, ...]:
    """Label names of our series: the contract's base labels, then every other label SGLang's
    scheduler collector carries (`dp_rank` under data parallelism, `priority` with priority
    scheduling, the operator's extra metric labels), so our series line up with `sglang:*`
    and DP replicas stay apart. Our own `depth`/`bs_bucket` are never taken from SGLang."""
    own = {*BASE_LABELS, LABEL_DEPTH, LABEL_BUCKET}
    return (*BASE_LABELS, *(str(k) for k in collector_labels if str(k) not in own))


class PrometheusExporter:
    def __init__(self, labels: Mapping[str, Any], registry: Any = None) -> None:
        from prometheus_client import REGISTRY, Counter, Gauge

        registry = REGISTRY if registry is None else registry
        base_names = series_labels(labels)
        self.base = tuple(str(labels.get(name, "")) for name in base_names)
        names = (*base_names, LABEL_DEPTH, LABEL_BUCKET)
        self.counters = [
            Counter(family, _HELP[family], labelnames=names, registry=registry)
            for family in COUNTER_FAMILIES
        ]
        self.policy_version = Gauge(
            METRIC_POLICY_VERSION,
            "Version of the live specctl table (0: SGLang's own adaptive choice).",
            labelnames=base_names,
            multiprocess_mode="mostrecent",
            registry=registry,
        )
        self.captured = Gauge(
            METRIC_CAPTURED_DEPTH,
            "1 for each speculation depth captured at start-up (a table may use it).",
            labelnames=(*base_names, LABEL_DEPTH),
            multiprocess_mode="mostrecent",
            registry=registry,
        )
        self.registry = registry
        self.base_names = base_names
        self.tree_counters: list[Any] = []  # created with a shape server's first tree result
        self._children: dict[tuple[Any, int], list[Any]] = {}
        self._captured_shown: frozenset[int] = frozenset()

    def _trees(self) -> list[Any]:
        if not self.tree_counters:
            from prometheus_client import Counter

            names = (*self.base_names, LABEL_SHAPE, LABEL_BUCKET)
            self.tree_counters = [
                Counter(tree, _HELP[family].replace("speculation depth", "draft tree's shape"),
                        labelnames=names, registry=self.registry)
                for family, tree in zip(COUNTER_FAMILIES, TREE_COUNTER_FAMILIES, strict=True)
            ]
        return self.tree_counters

    def export(self, runtime: SchedulerRuntime) -> None:
        for counts, trees in ((runtime.counters, False), (runtime.tree_counters, True)):
            for key, cell in counts.drain().items():
                children = self._children.get(key)
                if children is None:
                    depth, bucket = key
                    families = self._trees() if trees else self.counters
                    children = self._children[key] = [
                        c.labels(*self.base, str(depth), str(bucket)) for c in families
                    ]
                for child, value in zip(children, cell, strict=True):
                    if value:
                        child.inc(value)
        table = runtime.table
        self.policy_version.labels(*self.base).set(0 if table is None else table.version)
        if runtime.captured_depths != self._captured_shown:
            for depth in runtime.captured_depths:
                self.captured.labels(*self.base, str(depth)).set(1)
            self._captured_shown = runtime.captured_depths
