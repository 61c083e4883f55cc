"""bench and status read the contract counters as the daemon does: one TP rank, all DP ranks."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from controller.bench.loadgen import ClosedLoop, LevelLoad
from controller.bench.metrics import (
    EVICTION_HISTOGRAM,
    FORWARD_PASSES,
    FORWARD_SECONDS,
    GENERATION_TOKENS,
    VERIFY_CALLS,
    evictions_between,
    forward_busy_between,
    parse_scrape,
    passes_between,
    sglang_accept_length_between,
    total,
    work_between,
)
from controller.bench.sweep import summarize
from sglang_hooks.contract import (
    BASE_LABELS,
    COUNTER_FAMILIES,
    LABEL_BUCKET,
    LABEL_DEPTH,
    METRIC_ITERATIONS,
    METRIC_TOKENS,
)


def _page(ranks: list[tuple[str, str]]) -> str:
    """A real exposition page: the same work counted by every (tp_rank, dp_rank) given."""
    registry = CollectorRegistry()
    labels = (*BASE_LABELS, "dp_rank", LABEL_DEPTH, LABEL_BUCKET)
    counters = {f: Counter(f, f, labels, registry=registry) for f in COUNTER_FAMILIES}
    for tp, dp in ranks:
        values = {METRIC_ITERATIONS: 10.0, METRIC_TOKENS: 50.0}
        for family, counter in counters.items():
            counter.labels("m", "unified", tp, "0", "0", dp, "2", "8").inc(values.get(family, 1.0))
    return generate_latest(registry).decode()


def test_tensor_parallel_ranks_are_not_counted_twice() -> None:
    one = parse_scrape(_page([("0", "0")])).by_depth()[2]
    tp4 = parse_scrape(_page([("0", "0"), ("1", "0"), ("2", "0"), ("3", "0")])).by_depth()[2]
    assert (tp4.iterations, tp4.tokens) == (one.iterations, one.tokens) == (10.0, 50.0)


def test_data_parallel_ranks_add_up() -> None:
    dp2 = parse_scrape(_page([("0", "0"), ("0", "1")])).by_depth()[2]
    assert (dp2.iterations, dp2.tokens) == (20.0, 100.0)


def _kind_page(name: str, label: str, values: dict[tuple[str, str], float]) -> str:
    """One of SGLang's counters by kind, real exposition, per (tp_rank, kind)."""
    registry = CollectorRegistry()
    counter = Counter(name, name, (*BASE_LABELS, label), registry=registry)
    for (tp, kind), value in values.items():
        counter.labels("m", "unified", tp, "0", "0", kind).inc(value)
    return generate_latest(registry).decode()


def _timer_page(seconds: dict[tuple[str, str], float]) -> str:
    """SGLang's device-timer counter per (tp_rank, category)."""
    return _kind_page(FORWARD_SECONDS, "category", seconds)


def test_device_timer_splits_prefill_from_the_rest_on_one_rank() -> None:
    before = parse_scrape(_timer_page({("0", "extend"): 1.0, ("0", "target_verify"): 2.0}))
    after = parse_scrape(
        _timer_page(
            {("0", "extend"): 1.5, ("0", "target_verify"): 5.0, ("0", "eagle_draft_extend"): 1.0,
             ("1", "extend"): 9.0, ("1", "target_verify"): 9.0}
        )
    )  # fmt: skip
    assert after.forward_seconds == {"extend": 1.5, "target_verify": 5.0, "eagle_draft_extend": 1.0}
    busy = forward_busy_between(before, after, seconds=5.0)
    assert busy is not None
    # prefill 0.5 s of 5; the rest: verify 3 s + the draft's extend 1 s (new since before)
    assert (busy.prefill, busy.decode) == (0.1, 0.8)


def test_no_device_timer_no_split() -> None:
    page = parse_scrape(_page([("0", "0")]))
    assert page.forward_seconds == {}
    assert forward_busy_between(page, page, seconds=5.0) is None


def _passes_page(passes: dict[tuple[str, str], float]) -> str:
    """SGLang's forward-pass counter per (tp_rank, mode)."""
    return _kind_page(FORWARD_PASSES, "mode", passes)


def test_forward_passes_of_a_window_add_the_graph_modes_on_one_rank() -> None:
    before = parse_scrape(_passes_page({("0", "decode_cuda_graph"): 100, ("0", "prefill_none"): 7}))
    after = parse_scrape(
        _passes_page(
            {("0", "decode_cuda_graph"): 160, ("0", "decode_none"): 5, ("0", "prefill_none"): 37,
             ("0", "prefill_cuda_graph"): 3, ("1", "decode_cuda_graph"): 999}
        )
    )  # fmt: skip
    passes = passes_between(before, after)
    assert passes is not None and (passes.prefill, passes.decode) == (33, 65)
    page = parse_scrape(_page([("0", "0")]))
    assert page.forward_passes == {} and passes_between(page, after) is None


def _eviction_page(observations: dict[str, list[float]]) -> str:
    """SGLang 0.5.23's eviction histogram (RadixCacheMetricsCollector's) per tp_rank."""
    registry = CollectorRegistry()
    labels = ["cache_type", "tp_rank", "pp_rank", "dp_rank"]
    histogram = Histogram(EVICTION_HISTOGRAM, "evictions", labels, buckets=(0.001, 0.01, 0.1),
                          registry=registry)  # fmt: skip
    for rank, seconds in observations.items():
        for s in seconds:
            histogram.labels("RadixCache", rank, "0", "0").observe(s)
    return generate_latest(registry).decode()


def test_evictions_labelled_by_cache_type_alone_are_read_whole() -> None:
    """SGLang 0.5.17 labels the histogram by cache type only (its TP ranks summed)."""
    registry = CollectorRegistry()
    histogram = Histogram(EVICTION_HISTOGRAM, "evictions", ["cache_type"], registry=registry)
    for s in (0.002, 0.003):
        histogram.labels("RadixCache").observe(s)
    page = parse_scrape(generate_latest(registry).decode())
    assert page.evictions == (pytest.approx(0.005), 2.0)


def test_evictions_of_a_window_on_one_rank() -> None:
    before = parse_scrape(_eviction_page({"0": [0.002], "1": [0.5]}))
    after = parse_scrape(_eviction_page({"0": [0.002, 0.001, 0.004], "1": [0.5, 0.5]}))
    got = evictions_between(before, after)
    assert got is not None and got.calls == 2
    assert got.seconds == pytest.approx(0.005)


def test_evictions_first_exported_inside_the_window_count_from_zero() -> None:
    """SGLang exports the histogram from its first eviction on, so a server that had not
    evicted before the window has no such family in the opening scrape."""
    bare = parse_scrape(_page([("0", "0")]))
    assert bare.evictions is None
    after = parse_scrape(_eviction_page({"0": [0.003, 0.003]}))
    got = evictions_between(bare, after)
    assert got is not None and (got.calls, got.seconds) == (2, pytest.approx(0.006))
    assert evictions_between(after, bare) is None  # not exported at the close: unknown
    restarted = evictions_between(after, parse_scrape(_eviction_page({"0": [0.001]})))
    assert restarted is not None and (restarted.calls, restarted.seconds) == (0, 0.0)


def _sglang_spec_page(
    tokens: dict[str, float] | None, verify_calls: float | None, declared: bool = True
) -> str:
    """SGLang's own speculative counters as its tokenizer manager exports them, real
    exposition: output tokens per `is_streaming`, verify passes (None: not counted yet; with
    `declared`, the family is on the page without a sample, as a labelled counter never
    incremented is)."""
    registry = CollectorRegistry()
    generated = Counter(GENERATION_TOKENS, "Number of generation tokens processed.",
                        ("model_name", "engine_type", "is_streaming"), registry=registry)
    for streaming, value in (tokens or {}).items():
        generated.labels("m", "unified", streaming).inc(value)
    if declared or verify_calls is not None:
        verify = Counter(VERIFY_CALLS, "Number of speculative decoding verification calls.",
                         ("model_name", "engine_type"), registry=registry)
        if verify_calls is not None:
            verify.labels("m", "unified").inc(verify_calls)
    # what else such a page carries must not count
    Counter("sglang:prompt_tokens", "prefill", ("model_name",), registry=registry).labels(
        "m").inc(1e6)
    return generate_latest(registry).decode()


def test_sglang_s_own_counters_give_the_accept_length_of_a_window() -> None:
    before = parse_scrape(_sglang_spec_page({"true": 300.0, "false": 100.0}, 160.0))
    after = parse_scrape(_sglang_spec_page({"true": 600.0, "false": 200.0}, 320.0))
    assert before.spec_totals == {GENERATION_TOKENS: 400.0, VERIFY_CALLS: 160.0}
    assert after.spec_totals == {GENERATION_TOKENS: 800.0, VERIFY_CALLS: 320.0}
    assert sglang_accept_length_between(before, after) == 2.5  # 400 tokens over 160 passes
    assert before.counters == {}  # not the plugin's counters


def test_no_sglang_accept_length_without_verify_passes() -> None:
    plugin = parse_scrape(_page([("0", "0")]))  # the plugin's counters only
    assert plugin.spec_totals == {}
    assert sglang_accept_length_between(plugin, plugin) is None
    # a plain server counts output tokens and never declares verify passes
    plain = [parse_scrape(_sglang_spec_page({"false": t}, None, declared=False))
             for t in (10.0, 90.0)]
    assert plain[0].spec_totals == {GENERATION_TOKENS: 10.0}
    assert sglang_accept_length_between(*plain) is None
    # declared but never incremented: no verify pass
    idle = [parse_scrape(_sglang_spec_page({"false": t}, None)) for t in (10.0, 90.0)]
    assert idle[1].spec_totals == {GENERATION_TOKENS: 90.0, VERIFY_CALLS: 0.0}
    assert sglang_accept_length_between(*idle) is None
    # nothing finished between the scrapes
    same = parse_scrape(_sglang_spec_page({"true": 50.0}, 20.0))
    assert sglang_accept_length_between(same, same) is None


def _level_load() -> LevelLoad:
    return LevelLoad(shape=ClosedLoop(4), concurrency=4, warmup_s=0.0, elapsed_s=2.0,
                     tokens=800, requests=(), client_cpu_s=0.1)


def test_a_level_without_the_plugin_s_counters_takes_sglang_s_accept_length() -> None:
    """`summarize` on real pages: SGLang's own counters where the plugin's are absent (a
    stock SGLang server of a static shape), the plugin's where both are."""
    before = _sglang_spec_page({"true": 100.0}, 40.0)
    after = _sglang_spec_page({"true": 500.0}, 200.0)
    stock = summarize(None, _level_load(), parse_scrape(before), parse_scrape(after))
    assert stock.accept_length == 2.5 and stock.mean_batch is None
    plain = summarize(None, _level_load(),
                      parse_scrape(_sglang_spec_page({"true": 100.0}, None, declared=False)),
                      parse_scrape(_sglang_spec_page({"true": 500.0}, None, declared=False)))
    assert plain.accept_length is None
    # with the plugin's counters on the pages too, its figure stands
    plugin_before, plugin_after = _page([("0", "0")]), _page([("0", "0"), ("0", "1")])
    both = summarize(None, _level_load(), parse_scrape(plugin_before + before),
                     parse_scrape(plugin_after + after))
    work = total(work_between(parse_scrape(plugin_before), parse_scrape(plugin_after)).values())
    assert work.accept_length is not None and work.accept_length != 2.5
    assert both.accept_length == work.accept_length
