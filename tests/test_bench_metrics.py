"""bench and status read the contract counters as the daemon does: one TP rank, all DP ranks."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, generate_latest

from controller.bench.metrics import (
    FORWARD_PASSES,
    FORWARD_SECONDS,
    forward_busy_between,
    parse_scrape,
    passes_between,
)
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
