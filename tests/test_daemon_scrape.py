"""Scrape: real Prometheus text (rendered by prometheus_client) -> counter deltas -> Samples."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest

from controller.daemon.scrape import (
    ScrapeError,
    build_samples,
    counter_deltas,
    parse_counters,
    series_key,
)
from sglang_hooks.contract import (
    BASE_LABELS,
    LABEL_BUCKET,
    LABEL_DEPTH,
    METRIC_EXPLORE_ITERATIONS,
    METRIC_GPU_SECONDS,
    METRIC_ITERATIONS,
    METRIC_REQUEST_STEPS,
    METRIC_TOKENS,
)

FAMILIES = (
    METRIC_ITERATIONS,
    METRIC_REQUEST_STEPS,
    METRIC_TOKENS,
    METRIC_GPU_SECONDS,
    METRIC_EXPLORE_ITERATIONS,
)


class FakeServerCounters:
    """Counters shaped like the plugin's, rendered by prometheus_client (real text format)."""

    def __init__(self, dp_ranks: int = 1, tp_ranks: int = 1) -> None:
        self.registry = CollectorRegistry()
        labels = [*BASE_LABELS, "dp_rank", LABEL_DEPTH, LABEL_BUCKET]
        self.c = {f: Counter(f, f, labels, registry=self.registry) for f in FAMILIES}
        self.dp_ranks = dp_ranks
        self.tp_ranks = tp_ranks

    def run(self, depth: int, bucket: int, batch: float, iters: int, accept: float, step_s: float):
        """Record `iters` iterations at mean batch `batch` on every DP rank and TP rank."""
        for dp in range(self.dp_ranks):
            for tp in range(self.tp_ranks):
                lab = {
                    "model_name": "m",
                    "engine_type": "unified",
                    "tp_rank": str(tp),
                    "pp_rank": "0",
                    "moe_ep_rank": "0",
                    "dp_rank": str(dp),
                    LABEL_DEPTH: str(depth),
                    LABEL_BUCKET: str(bucket),
                }
                self.c[METRIC_ITERATIONS].labels(**lab).inc(iters)
                self.c[METRIC_REQUEST_STEPS].labels(**lab).inc(iters * batch)
                self.c[METRIC_TOKENS].labels(**lab).inc(iters * batch * accept)
                self.c[METRIC_GPU_SECONDS].labels(**lab).inc(iters * step_s)
                self.c[METRIC_EXPLORE_ITERATIONS].labels(**lab).inc(0)

    def text(self) -> str:
        return generate_latest(self.registry).decode()


def test_parse_keeps_tp0_and_keys_by_dp_rank():
    srv = FakeServerCounters(dp_ranks=2, tp_ranks=2)
    srv.run(depth=3, bucket=8, batch=9.0, iters=100, accept=2.5, step_s=0.02)
    snap = parse_counters(srv.text())
    assert snap.values[series_key(METRIC_ITERATIONS, 3, 8, "0")] == 100
    assert snap.values[series_key(METRIC_ITERATIONS, 3, 8, "1")] == 100
    # TP rank 1 is not double counted: 5 families x 2 DP ranks.
    assert len(snap.values) == 10


def test_deltas_sum_over_dp_ranks_into_one_sample_per_depth_and_bucket():
    srv = FakeServerCounters(dp_ranks=2)
    srv.run(3, 8, 9.0, 10, 2.5, 0.02)
    first = counter_deltas(None, parse_counters(srv.text()).values)
    assert first.deltas == {}  # a baseline only
    srv.run(3, 8, 9.0, 100, 2.5, 0.02)
    srv.run(0, 32, 35.0, 50, 1.0, 0.03)
    res = counter_deltas(first.merged, parse_counters(srv.text()).values)
    built = build_samples(res.deltas, group="g", target="t", t_end=10.0, interval_s=5.0)
    by = {(s.depth, s.bs_bucket): s for s in built.samples}
    assert set(by) == {(3, 8), (0, 32)}
    s = by[(3, 8)]
    assert s.iterations == 200 and math.isclose(s.mean_batch, 9.0)
    assert math.isclose(s.accept_length, 2.5) and math.isclose(s.step_s, 0.02)
    assert by[(0, 32)].iterations == 100  # new series: counted from zero


def test_counter_going_down_is_a_restart_and_counts_from_zero():
    srv = FakeServerCounters()
    srv.run(3, 8, 9.0, 1000, 2.5, 0.02)
    base = counter_deltas(None, parse_counters(srv.text()).values)
    restarted = FakeServerCounters()
    restarted.run(3, 8, 9.0, 40, 2.5, 0.02)
    res = counter_deltas(base.merged, parse_counters(restarted.text()).values)
    assert res.restarted
    built = build_samples(res.deltas, group="g", target="t", t_end=1.0, interval_s=1.0)
    assert [s.iterations for s in built.samples] == [40]


@pytest.mark.parametrize(
    "text",
    [
        "this is not prometheus text {{{",
        'specctl_decode_iterations_total{depth="3",bs_bucket="8"} notanumber\n',
        "# TYPE specctl_decode_iterations counter\nspecctl_decode_iterations_total{depth=3} 1\n",
    ],
)
def test_garbage_page_is_rejected_whole(text):
    with pytest.raises(ScrapeError) as err:
        parse_counters(text)
    assert err.value.kind == "parse"


def test_nan_negative_and_unknown_labels_are_dropped_and_counted():
    good = "".join(
        f'{f}_total{{depth="2",bs_bucket="8"}} {v}\n'
        for f, v in (
            (METRIC_ITERATIONS, 7),
            (METRIC_REQUEST_STEPS, 60),
            (METRIC_TOKENS, 130),
            (METRIC_GPU_SECONDS, 0.5),
        )
    )
    text = (
        'specctl_decode_iterations_total{depth="3",bs_bucket="8"} NaN\n'
        'specctl_decode_iterations_total{depth="3",bs_bucket="9"} 5\n'  # 9 is not a bucket edge
        'specctl_decode_iterations_total{depth="99",bs_bucket="8"} 5\n'
        'specctl_decode_iterations_total{depth="1",bs_bucket="8"} -4\n' + good
    )
    snap = parse_counters(text)
    assert snap.values[series_key(METRIC_ITERATIONS, 2, 8, "")] == 7.0
    assert len(snap.values) == 4
    assert snap.dropped_series == 4


def test_a_cell_with_one_unreadable_counter_does_not_advance():
    srv = FakeServerCounters()
    srv.run(3, 8, 9.0, 100, 2.5, 0.02)
    lines = [
        ln if not ln.startswith("specctl_decode_tokens_total") else ln.rsplit(" ", 1)[0] + " NaN"
        for ln in srv.text().splitlines()
    ]
    snap = parse_counters("\n".join(lines) + "\n")
    assert snap.values == {} and snap.dropped_series == 2  # NaN series + its cell


def test_impossible_deltas_are_not_stored():
    # Mean batch 50 cannot sit in bucket 8 (8..9): a mislabeled or corrupted series.
    deltas = {
        series_key(METRIC_ITERATIONS, 3, 8, ""): 10.0,
        series_key(METRIC_REQUEST_STEPS, 3, 8, ""): 500.0,
        series_key(METRIC_TOKENS, 3, 8, ""): 1000.0,
        series_key(METRIC_GPU_SECONDS, 3, 8, ""): 0.2,
    }
    built = build_samples(deltas, group="g", target="t", t_end=1.0, interval_s=1.0)
    assert built.samples == [] and built.inconsistent == 1
