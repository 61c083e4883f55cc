"""Per-depth counters on SGLang's own registry, from real results through the real hooks.

Real: `SchedulerMetricsCollector` (construction runs the plugin's hook, which adds our
families to the same multiprocess registry), `GenerationBatchResult`, the multiprocess
collector and exposition that SGLang's /metrics uses, prometheus' text parser.
Stand-in: the batch (`SimpleNamespace(reqs=[...])`), since only `len(batch.reqs)` is read.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from sglang_hooks import hooks
from sglang_hooks.contract import BASE_LABELS, COUNTER_FAMILIES, bs_bucket
from sglang_hooks.runtime import SchedulerRuntime


def _metrics_text() -> str:
    """What SGLang's /metrics serves: every process's multiprocess files, aggregated."""
    from prometheus_client import CollectorRegistry, generate_latest, multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    return generate_latest(registry).decode()


def _scrape() -> dict[str, Any]:
    from prometheus_client.parser import text_string_to_metric_families

    return {f.name: f for f in text_string_to_metric_families(_metrics_text())}


@pytest.fixture(scope="module")
def collector(plugin_loaded: bool) -> Any:
    import tempfile

    from sglang.srt import runtime_context
    from sglang.srt.observability.metrics_collector import SchedulerMetricsCollector
    from sglang.srt.server_args import ServerArgs

    model = tempfile.mkdtemp()
    with open(f"{model}/config.json", "w") as f:
        f.write('{"architectures": ["LlamaForCausalLM"], "model_type": "llama", '
                '"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 8, '
                '"intermediate_size": 128, "vocab_size": 1000, "num_key_value_heads": 4}')
    args = ServerArgs(model_path=model, device="cpu", skip_tokenizer_init=True)
    args.resolve_once()
    runtime_context.publish(args, role="scheduler")
    labels = {"model_name": "tiny", "engine_type": "unified", "tp_rank": 0, "pp_rank": 0,
              "moe_ep_rank": 0}
    SchedulerMetricsCollector(labels, server_args=args)
    # The plugin's AFTER hook on the collector's __init__ built our exporter beside it.
    assert hooks.RUNTIME.exporter is not None, "constructing the collector built no exporter"
    return hooks.RUNTIME.exporter


def _unsettled(processor: Any, result: Any, batch: Any) -> None:
    """Stands in for SGLang's body under the AROUND hook: no per-request runs, so the hook
    counts every row as SGLang sums them."""
    return None


def _result(width: int, correct: int) -> Any:
    from sglang.srt.managers.utils import GenerationBatchResult

    return GenerationBatchResult(speculative_num_draft_tokens=width, num_correct_drafts=correct)


def test_counts_follow_the_depth_each_result_ran_with(collector: Any,
                                                      runtime: SchedulerRuntime) -> None:
    runtime.exporter = collector
    runtime.activate({0, 1, 3}, None)
    batch = SimpleNamespace(reqs=[object()] * 12)
    # Launched at depth 3, processed later (overlap): the result says what ran.
    for width, correct, explore in ((4, 20, False), (4, 18, True), (2, 6, False)):
        result = _result(width, correct)
        result.specctl_launch = (explore, None)
        hooks.count_result(_unsettled, None, result, batch)
    runtime.flush()
    fams = _scrape()
    it = {(s.labels["depth"], s.labels["bs_bucket"]): s.value
          for s in fams["specctl_decode_iterations"].samples if s.name.endswith("_total")}
    assert it[("3", str(bs_bucket(12)))] == 2 and it[("1", str(bs_bucket(12)))] == 1
    tokens = {s.labels["depth"]: s.value for s in fams["specctl_decode_tokens"].samples
              if s.name.endswith("_total")}
    assert tokens["3"] == (20 + 12) + (18 + 12) and tokens["1"] == 6 + 12
    explore = {s.labels["depth"]: s.value for s in fams["specctl_explore_iterations"].samples
               if s.name.endswith("_total")}
    assert explore["3"] == 1
    sample = fams["specctl_decode_iterations"].samples[0]
    assert set(sample.labels) == {*BASE_LABELS, "depth", "bs_bucket"}
    assert set(COUNTER_FAMILIES) <= set(fams)
    assert any(n.startswith("sglang:") for n in fams)  # same registry as SGLang's series
    captured = {s.labels["depth"] for s in fams["specctl_captured_depth"].samples}
    assert captured == {"0", "1", "3"}


def _iterations(fams: dict[str, Any], **labels: str) -> float:
    return sum(s.value for s in fams["specctl_decode_iterations"].samples
               if s.name.endswith("_total") and all(s.labels.get(k) == v
                                                    for k, v in labels.items()))


def test_server_info_read_exports_the_counts_of_the_last_second(
    collector: Any, runtime: SchedulerRuntime
) -> None:
    """Counts wait up to a second in memory; a /server_info read (get_internal_state) writes
    them, so the last second before an idle spell is not held back until the next decode."""
    from sglang.srt.managers.io_struct import GetInternalStateReqOutput

    runtime.exporter = collector
    runtime.activate({0, 1, 3}, None)
    batch = SimpleNamespace(reqs=[object()] * 3)
    start = _iterations(_scrape(), depth="0")
    for _ in range(3):  # the first result exports at once, the next two wait for the interval
        result = _result(1, 0)
        result.specctl_launch = (False, None)
        hooks.count_result(_unsettled, None, result, batch)
    assert _iterations(_scrape(), depth="0") - start == 1
    hooks.get_internal_state(GetInternalStateReqOutput(internal_state={}), None)
    assert _iterations(_scrape(), depth="0") - start == 3


def test_collector_labels_are_copied_so_dp_replicas_stay_apart(plugin_loaded: bool) -> None:
    """Labels as SGLang 0.5.23's `SchedulerMetricsCollector.init_new` builds them with data
    parallelism, priority scheduling and an operator's extra label (written out here: a
    second real collector cannot be built in one process, its `sglang:*` names would clash).
    The daemon's own parser then reads one cell per DP replica."""
    from prometheus_client import CollectorRegistry

    from controller.daemon.scrape import parse_counters, split_key
    from sglang_hooks.contract import METRIC_ITERATIONS
    from sglang_hooks.exporter import PrometheusExporter

    for dp_rank in (0, 1):
        labels = {"model_name": "tiny-dp", "engine_type": "unified", "tp_rank": 0,
                  "pp_rank": 0, "moe_ep_rank": 0, "priority": "", "dp_rank": dp_rank,
                  "cluster": "eu-1"}
        rt = SchedulerRuntime()
        rt.exporter = PrometheusExporter(labels, registry=CollectorRegistry())
        rt.activate({2}, None)
        for _ in range(dp_rank + 1):
            rt.record_result(2, 5, 12, (False, None), now=0.0)
        rt.flush()
    fams = _scrape()
    ours = [s for s in fams["specctl_decode_iterations"].samples
            if s.labels["model_name"] == "tiny-dp" and s.name.endswith("_total")]
    assert {s.labels["dp_rank"] for s in ours} == {"0", "1"}
    assert all(s.labels["cluster"] == "eu-1" and s.labels["priority"] == "" for s in ours)
    version = [s for s in fams["specctl_policy_version"].samples
               if s.labels["model_name"] == "tiny-dp"]
    assert {s.labels["dp_rank"] for s in version} == {"0", "1"}

    snap = parse_counters(_metrics_text())
    per_dp = {split_key(k)[3]: v for k, v in snap.values.items()
              if split_key(k)[:3] == (METRIC_ITERATIONS, 2, 5)}
    assert per_dp == {"0": 1.0, "1": 2.0}


def test_a_shape_server_exports_a_trees_counts_by_its_shape(
    collector: Any, runtime: SchedulerRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a server that switches shapes, a chain's result is counted at its depth and a
    tree's under `specctl_tree_*{shape=...}`: same counts, the shape label in place of depth.
    The registry of captured shapes is a stand-in (capturing needs a GPU)."""
    from sglang_hooks.contract import TREE_COUNTER_FAMILIES
    from sglang_hooks.draft_shape import DraftShape

    tree, chain = DraftShape(3, 4, 16), DraftShape(3, 1, 4)
    monkeypatch.setattr(hooks, "SHAPES", SimpleNamespace(by_width=lambda width: None))
    runtime.exporter = collector
    runtime.activate({3}, None, captured_trees={tree})
    batch = SimpleNamespace(reqs=[object()] * 5)
    before = _iterations(_scrape(), depth="3")
    for shape, width, correct in ((tree, 16, 9), (tree, 16, 7), (chain, 4, 8)):
        result = _result(width, correct)
        result.specctl_launch = (False, None)
        result.specctl_shape = shape
        hooks.count_result(_unsettled, None, result, batch)
    runtime.flush()
    fams = _scrape()
    assert set(TREE_COUNTER_FAMILIES) <= set(fams)
    it = {(s.labels["shape"], s.labels["bs_bucket"]): s.value
          for s in fams["specctl_tree_decode_iterations"].samples if s.name.endswith("_total")}
    assert it == {("3x4x16", str(bs_bucket(5))): 2}
    tokens = [s.value for s in fams["specctl_tree_decode_tokens"].samples
              if s.name.endswith("_total")]
    assert tokens == [(9 + 5) + (7 + 5)]
    assert _iterations(fams, depth="3") - before == 1  # the chain, at its depth
    assert runtime.tree_results == 2
    sample = fams["specctl_tree_decode_iterations"].samples[0]
    assert set(sample.labels) == {*BASE_LABELS, "shape", "bs_bucket"}
