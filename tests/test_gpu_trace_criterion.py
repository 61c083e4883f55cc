"""The closed loop's done-when read with the trace's own noise (benchmarks/gpu/seeded/criterion):
the pooled spread, the intervals, the three verdicts, and a closed_loop.json it cannot use."""

from __future__ import annotations

import json
import math

import pytest
from scipy import stats

from benchmarks.gpu.seeded import criterion


def test_the_spread_is_pooled_over_every_policy_with_repeats():
    sd, df = criterion.pooled_spread({"a": [10.0, 12.0], "b": [20.0, 20.0, 23.0], "c": [5.0]})
    assert df == 1 + 2
    assert sd == pytest.approx(math.sqrt((1 + 1 + 1 + 1 + 4) / 3))


def test_a_gain_larger_than_the_noise_is_met_a_loss_not_met_a_small_one_inside():
    noisy = {"static:1": [100.0, 102.0], "static:3": [90.0, 92.0], "bench-table": [95.0, 97.0]}
    sd, df = criterion.pooled_spread({**noisy, "daemon": [120.0, 122.0]})
    found = {c.against: c for c in criterion.comparisons({**noisy, "daemon": [120.0, 122.0]})}
    best = found["static:1 (best static)"]
    assert best.ratio == pytest.approx(121 / 101) and best.verdict == "met"
    half = float(stats.t.ppf(0.975, df)) * sd
    assert best.low == pytest.approx((121 - half) / 101)
    assert "sglang-adaptive" not in found  # a policy the trace did not run is no bar
    # static:D+scrape measures the scrapes' cost: never the best static, however fast
    scraped = criterion.comparisons({**noisy, "static:1+scrape": [200.0, 202.0],
                                     "daemon": [120.0, 122.0]})
    assert "static:1 (best static)" in {c.against for c in scraped}
    worse = criterion.comparisons({**noisy, "daemon": [80.0, 82.0]})
    assert {c.verdict for c in worse} == {"not met"}
    close = criterion.comparisons({**noisy, "daemon": [101.0, 102.0]})
    assert close[0].verdict == "inside the noise"


def test_sglang_s_choice_must_be_beaten_by_three_percent():
    runs = {"sglang-adaptive": [100.0, 100.2], "daemon-from-bench": [102.0, 102.2]}
    (c,) = criterion.comparisons(runs)
    assert c.margin == 0.03 and c.ratio > 1.0 and c.verdict == "not met"


def test_the_command_prints_the_table_or_one_error_line(tmp_path, capsys):
    good = tmp_path / "closed_loop.json"
    good.write_text(json.dumps({"policies": {"static:3": [10.0, 11.0],
                                             "daemon": [12.0, 12.5]}}))  # fmt: skip
    assert criterion.main([str(good)]) == 0
    out = capsys.readouterr().out
    assert "| daemon | static:3 (best static) | 1.00 |" in out and "degrees of freedom" in out
    single = tmp_path / "single.json"
    single.write_text(json.dumps({"policies": {"static:3": [10.0], "daemon": [12.0]}}))
    assert criterion.main([str(single)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--trace-repeats 2" in err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"policies": {"daemon": "fast"}}))
    assert criterion.main([str(bad)]) == 2
    assert "tok/s per run" in capsys.readouterr().err


def test_a_policy_sharing_another_s_runs_counts_once_in_the_spread(tmp_path, capsys):
    """bench-table that pushed static:3's very table lists static:3's runs: the comparison
    against it is made, but the spread and its degrees of freedom count those runs once."""
    own = {"static:3": [100.0, 104.0], "daemon": [103.0, 105.0]}
    shared = {**own, "bench-table": [100.0, 104.0]}
    assert criterion.pooled_spread(shared, {"bench-table"}) == criterion.pooled_spread(own)
    assert criterion.pooled_spread(shared)[1] == 3  # counted twice without it
    found = {c.against: c for c in criterion.comparisons(shared, {"bench-table"})}
    assert found["bench-table"].ratio == found["static:3 (best static)"].ratio
    path = tmp_path / "closed_loop.json"
    path.write_text(json.dumps({"policies": shared, "same_runs": {"bench-table": "static:3"}}))
    assert criterion.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "2 degrees of freedom" in out and "bench-table's runs are static:3's" in out
    path.write_text(json.dumps({"policies": own, "same_runs": {"bench-table": "static:9"}}))
    assert criterion.main([str(path)]) == 2
    assert "'same_runs'" in capsys.readouterr().err
