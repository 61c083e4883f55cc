"""`python -m benchmarks.gpu.parity`: depth 0 against the plain server pooled over bench runs.

The bench.json files are written here in `specctl bench`'s format (the fields parity reads), so
each run's numbers are known and the pooled figures can be checked by hand.
"""

from __future__ import annotations

import json
import math

import pytest

from benchmarks.gpu import parity


def _row(series: str, c: int, tok_s: float, elapsed: float, tpot: float, ttft=(20.0, 30.0)):
    return {"series": series, "depth": 0 if series == "d0" else None, "concurrency": c,
            "output_tok_per_s": tok_s, "elapsed_s": elapsed, "tpot_p50_ms": tpot,
            "ttft_p50_ms": ttft[0], "ttft_p99_ms": ttft[1], "request_rate": None}  # fmt: skip


def _bench(path, rows):
    path.mkdir()
    (path / "bench.json").write_text(json.dumps({"format": 1, "results": rows}))
    return path


def test_pooled_ratio_weights_each_run_by_its_seconds(tmp_path, capsys):
    a = _bench(tmp_path / "a", [
        _row("d0", 4, 90.0, 10.0, 5.1, ttft=(20.0, 400.0)), _row("no-spec", 4, 100.0, 10.0, 5.0),
        _row("d0", 16, 300.0, 5.0, 5.2), _row("no-spec", 16, 300.0, 5.0, 5.0),
    ])  # fmt: skip
    b = _bench(tmp_path / "b", [
        _row("d0", 4, 100.0, 30.0, 5.0), _row("no-spec", 4, 100.0, 30.0, 5.0),
        {**_row("d0", 64, 50.0, 5.0, 5.0), "tpot_p50_ms": None, "too_short": True},
    ])  # fmt: skip
    pairs = parity.compare_runs([a, b])
    # c=16 from run a alone (run b did not sweep it); c=64 too short in the one run with it
    assert [p.concurrency for p in pairs] == [4, 16]
    p, sixteen = pairs
    assert sixteen.ratios == [1.0] and sixteen.tpot_change == pytest.approx(0.04)
    assert p.ratios == [0.9, 1.0] and p.worst_ratio == 0.9
    # d0: (90*10 + 100*30) / 40 = 97.5 tok/s against plain's 100
    assert p.pooled_ratio == pytest.approx(0.975)
    assert p.tpot_change == pytest.approx(0.01)  # medians 5.05 / 5.0
    assert (p.stalls_series, p.stalls_plain) == (1, 0)
    out = tmp_path / "parity.json"
    assert parity.main([str(a), str(b / "bench.json"), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "at every level: no (c=4)" in text  # 0.975 < 0.98
    assert "within 3% of plain at every level: no (c=16)" in text  # 5.2 / 5.0
    assert "at most 3% above plain at every level: no (c=16)" in text
    written = json.loads(out.read_text())
    assert written["levels"][0]["worst_ratio"] == 0.9 and written["left_out"] == [64]
    assert "left out (too short to finish a request, or one server only, wherever swept): " \
        "c=[64]" in text
    assert parity.main([str(a), str(b), "--min-ratio", "0.97"]) == 0
    assert "at every level: yes" in capsys.readouterr().out


def test_three_runs_or_more_give_the_pooled_ratios_interval(tmp_path, capsys):
    """Equal seconds per run: the pooled ratio is the mean ratio, and resampling the runs keeps
    the interval between the lowest and the highest run's, around the pooled one; two runs
    give none. The target inside the interval is named as undecided."""
    ratios = (0.96, 0.98, 1.0, 0.99)
    runs = [_bench(tmp_path / f"r{i}", [_row("d0", 1, 100.0 * r, 10.0, 5.0),
                                        _row("no-spec", 1, 100.0, 10.0, 5.0)])
            for i, r in enumerate(ratios)]  # fmt: skip
    (one,) = parity.compare_runs(runs)
    assert one.pooled_ratio == pytest.approx(sum(ratios) / 4)
    assert one.interval is not None
    low, high = one.interval
    assert 0.96 <= low < one.pooled_ratio < high <= 1.0
    assert parity.compare_runs(runs) == [one]  # a fixed seed: the same interval every time
    assert parity.compare_runs(runs[:2])[0].interval is None
    assert parity.main([str(r) for r in runs]) == 0
    text = capsys.readouterr().out
    assert f"{low:.3f}-{high:.3f}" in text
    assert "0.98 lies inside the pooled ratio's 90% interval at c=1" in text
    # 0.9825 against 0.98: the interval must narrow to a half-width of 0.0025
    need = math.ceil(4 * ((high - low) / 2 / (one.pooled_ratio - 0.98)) ** 2)
    assert parity.runs_to_resolve(one, 0.98) == need and need > 4
    assert f"put it outside the interval: c=1 ~{need}" in text
    assert parity.runs_to_resolve(one, 0.9815) is None  # within 0.002: too close to call
    assert parity.main([str(r) for r in runs] + ["--min-ratio", "0.9"]) == 0
    assert "lies inside" not in capsys.readouterr().out


def test_a_faster_depth_0_fails_the_two_sided_tpot_check_only(tmp_path, capsys):
    """At 128 streams depth 0's TPOT 10% below the plain server's (the plain server's own spread
    at that load): outside 3% both ways, but not slower."""
    a = _bench(tmp_path / "a", [_row("d0", 128, 110.0, 10.0, 9.0),
                                _row("no-spec", 128, 100.0, 10.0, 10.0)])  # fmt: skip
    assert parity.main([str(a)]) == 0
    text = capsys.readouterr().out
    assert "within 3% of plain at every level: no (c=128)" in text
    assert "at most 3% above plain at every level: yes" in text


def test_errors_name_the_file_and_the_fix(tmp_path, capsys):
    only_spec = _bench(tmp_path / "s", [_row("d0", 1, 10.0, 5.0, 5.0)])
    assert parity.main([str(only_spec)]) == 2
    assert "no plain-server series; bench with --no-spec-url" in capsys.readouterr().err
    assert parity.main([str(tmp_path / "missing")]) == 2
    assert "missing" in capsys.readouterr().err
    garbage = tmp_path / "g.json"
    garbage.write_text("[1, 2]")
    assert parity.main([str(garbage)]) == 2
    assert "no 'results' list" in capsys.readouterr().err


def _timed(row, prefill: float, decode: float, requests: int, running: float | None):
    return {**row, "gpu_prefill_busy": prefill, "gpu_decode_busy": decode, "requests": requests,
            "running_mean": running}  # fmt: skip


def test_where_the_time_went_pools_the_device_timer_figures(tmp_path, capsys):
    """Two runs at 128 streams; d0's prefills cost three times the plain server's per request."""
    a = _bench(tmp_path / "a", [
        _timed(_row("d0", 128, 9000.0, 10.0, 10.0), 0.30, 0.60, 300, 110.0),
        _timed(_row("no-spec", 128, 10000.0, 10.0, 9.0), 0.10, 0.80, 300, 120.0),
        _row("d0", 1, 200.0, 10.0, 5.0), _row("no-spec", 1, 200.0, 10.0, 5.0),
    ])  # fmt: skip
    b = _bench(tmp_path / "b", [
        _timed(_row("d0", 128, 9000.0, 30.0, 10.0), 0.30, 0.60, 900, 110.0),
        _timed(_row("no-spec", 128, 10000.0, 30.0, 9.0), 0.10, 0.80, 900, None),
        _row("d0", 1, 200.0, 10.0, 5.0), _row("no-spec", 1, 200.0, 10.0, 5.0),
    ])  # fmt: skip
    one, many = parity.compare_runs([a, b])
    assert one.time is None  # no device timer at one stream
    assert many.time is not None
    d0, plain = many.time
    # d0: 0.3 x 40 s of prefill over 1,200 requests = 10 ms each; plain 0.1 x 40 / 1,200
    assert d0.prefill_ms_per_request == pytest.approx(10.0)
    assert plain.prefill_ms_per_request == pytest.approx(3.333, abs=1e-3)
    # decode: 0.6 x 40 s over 9,000 x 40 tokens
    assert d0.decode_ms_per_token == pytest.approx(1000 * 0.6 / 9000, abs=1e-4)
    assert (d0.idle_share, plain.idle_share) == (pytest.approx(0.1), pytest.approx(0.1))
    assert (d0.running, plain.running) == (110.0, 120.0)  # plain: only run a had the gauge
    assert parity.main([str(a), str(b)]) == 0
    text = capsys.readouterr().out
    assert "where the time went" in text and "10.00 / 3.33" in text


def test_prefill_batches_per_decode_iteration_pool_over_the_runs_that_counted_them(
    tmp_path, capsys
):
    """At 128 streams the plain server ran 0.6 prefills per decode iteration in both runs, d0
    0.3 and then 0.5: pooled by their iterations, 0.4. A run without the counts (one stream)
    leaves the line out for that level."""
    def counted(row, prefills: int, decodes: int):  # type: ignore[no-untyped-def]
        return {**row, "prefill_passes": prefills, "decode_passes": decodes}

    a = _bench(tmp_path / "a", [
        counted(_row("d0", 128, 9000.0, 10.0, 10.0), 300, 1000),
        counted(_row("no-spec", 128, 8000.0, 10.0, 12.0), 600, 1000),
        _row("d0", 1, 200.0, 10.0, 5.0), _row("no-spec", 1, 200.0, 10.0, 5.0),
    ])  # fmt: skip
    b = _bench(tmp_path / "b", [
        counted(_row("d0", 128, 9000.0, 10.0, 10.0), 500, 1000),
        counted(_row("no-spec", 128, 8000.0, 10.0, 12.0), 600, 1000),
    ])  # fmt: skip
    one, many = parity.compare_runs([a, b])
    assert one.prefills_per_decode is None
    assert many.prefills_per_decode == (pytest.approx(0.4), pytest.approx(0.6))
    assert parity.main([str(a), str(b)]) == 0
    assert "prefill batches per decode iteration (d0 / plain): c=128 0.40 / 0.60" in (
        capsys.readouterr().out)


def test_run_by_run_counts_slower_runs_and_compares_admissions_and_passes(tmp_path, capsys):
    """Three paired runs at one stream: d0 slower per token in two, its TTFT taken from the
    server's own figure where both servers have it (else the client's p50), and each
    server's ms per forward pass pooled over the runs that counted passes."""

    def level(series, tpot, server_ttft, passes):
        row = _row(series, 1, 100.0, 10.0, tpot)
        if server_ttft is not None:
            row["server_ttft_ms"] = server_ttft
        if passes is not None:
            row["prefill_passes"], row["decode_passes"] = passes
        return row

    runs = [
        _bench(tmp_path / "a", [level("d0", 5.1, 18.0, (10, 1990)),
                                level("no-spec", 5.0, 27.0, (10, 1990))]),
        _bench(tmp_path / "b", [level("d0", 5.2, 19.0, (10, 1990)),
                                level("no-spec", 5.0, 29.0, (10, 2490))]),
        # no server TTFT and no pass count on the plain server: the client's p50 (20 - 20)
        _bench(tmp_path / "c", [level("d0", 4.9, None, (10, 990)),
                                level("no-spec", 5.0, None, None)]),
    ]  # fmt: skip
    (one,) = parity.compare_runs(runs)
    assert one.slower_runs == 2
    assert one.ttft_change_ms == pytest.approx(-9.0)  # median of -9, -10, 0
    # d0: 30 s over 2000 + 2000 + 1000 passes; plain: 20 s over 2000 + 2500 (run c uncounted)
    assert one.ms_per_pass == pytest.approx((6.0, 20000 / 4500), abs=1e-3)
    assert parity.main([str(r) for r in runs]) == 0
    text = capsys.readouterr().out
    assert "run by run (d0 against plain)" in text
    row = next(line for line in text.splitlines() if line.split()[:1] == ["1"]
               and "of 3" in line)  # fmt: skip
    assert row.split() == ["1", "2", "of", "3", "-9.0", "ms", "6.000", "/", "4.444"]


def test_the_spread_between_runs_sets_passes_beside_the_decode_forward(tmp_path, capsys):
    """Two runs at 128 streams whose decode forward (the plugin's step_ms) repeats within
    0.1 ms while their passes differ by 2 ms: the table shows both spreads; a level with one
    run has no spread and is left out of it."""

    def level(series, passes, elapsed, step):  # type: ignore[no-untyped-def]
        row = {**_row(series, 128, 10000.0, elapsed, 11.0),
               "prefill_passes": passes[0], "decode_passes": passes[1]}
        return {**row, "step_ms": step} if step is not None else row

    a = _bench(tmp_path / "a", [
        level("d0", (250, 750), 8.0, 6.9), level("no-spec", (250, 750), 9.0, None),
        level("d0", (0, 2000), 10.0, 4.8) | {"concurrency": 1},
        level("no-spec", (0, 2000), 10.0, None) | {"concurrency": 1},
    ])  # fmt: skip
    b = _bench(tmp_path / "b", [
        level("d0", (250, 750), 10.0, 7.0), level("no-spec", (250, 750), 8.5, None),
    ])  # fmt: skip
    one, many = parity.compare_runs([a, b])
    assert many.pass_ms_range == ((8.0, 10.0), (8.5, 9.0))
    assert many.decode_ms_range == (6.9, 7.0)
    assert one.pass_ms_range == ((5.0, 5.0), (5.0, 5.0)) and one.decode_ms_range == (4.8, 4.8)
    assert parity.main([str(a), str(b)]) == 0
    text = capsys.readouterr().out
    assert "spread between runs, lowest-highest (d0 / plain)" in text
    rows = [line.split() for line in text.split("spread between runs")[1].splitlines()[2:]]
    assert rows == [["128", "8.00-10.00", "/", "8.50-9.00", "6.90-7.00"]]


def test_a_folder_whose_bench_was_cut_is_left_out_with_a_note(tmp_path, capsys):
    """A series folder without bench.json (the bench timed out before writing it) must not
    stop the verdict on the others."""
    a = _bench(tmp_path / "a", [_row("d0", 1, 100.0, 10.0, 5.0),
                                _row("no-spec", 1, 100.0, 10.0, 5.0)])
    cut = tmp_path / "cut"
    cut.mkdir()
    out = tmp_path / "p.json"
    assert parity.main([str(a), str(cut), "--json", str(out)]) == 0
    captured = capsys.readouterr()
    assert f"left out {cut}: no bench.json" in captured.err
    assert "over 1 bench runs" in captured.out
    assert json.loads(out.read_text())["cut"] == [str(cut)]
    assert parity.main([str(cut)]) == 2
    assert "no bench.json in any folder given" in capsys.readouterr().err


def test_paired_runs_of_both_orders_split_by_which_server_went_first(tmp_path, capsys):
    """Four paired runs at one stream: d0 slower per token whenever it went second. Runs
    from before `--plain-first` (paired, no order recorded) count as d0 first; an unpaired
    run joins the pooled verdict but neither order."""

    def run(name, order, d0_tpot, d0_tok_s):  # type: ignore[no-untyped-def]
        path = _bench(tmp_path / name, [_row("d0", 1, d0_tok_s, 10.0, d0_tpot),
                                        _row("no-spec", 1, 100.0, 10.0, 5.0)])
        data = json.loads((path / "bench.json").read_text())
        if order != "unpaired":
            data["paired"] = True
        if order == "plain-first":
            data["paired_order"] = order
        (path / "bench.json").write_text(json.dumps(data))
        return path

    runs = [run("a", "spec-first", 4.9, 102.0), run("b", "spec-first (old)", 4.95, 101.0),
            run("c", "plain-first", 5.2, 96.0), run("d", "plain-first", 5.1, 98.0),
            run("e", "unpaired", 5.0, 100.0)]  # fmt: skip
    assert [parity.paired_order(json.loads((r / "bench.json").read_text())) for r in runs] == [
        "spec-first", "spec-first", "plain-first", "plain-first", None]
    (one,) = parity.compare_runs(runs)
    assert one.by_order == {"spec-first": (pytest.approx(1.015), 0, 2),
                            "plain-first": (pytest.approx(0.97), 2, 2)}  # fmt: skip
    assert parity.main([str(r) for r in runs]) == 0
    text = capsys.readouterr().out
    table = text.split("by order within each paired load")[1].splitlines()
    # the orders weighed equally: sqrt(1.015 * 0.97), whatever the mix of runs pooled
    assert table[2].split() == ["1", "1.015", "(0", "of", "2)", "0.970", "(2", "of", "2)",
                                "0.992"]
    assert parity.balanced_ratio(one.by_order) == pytest.approx((1.015 * 0.97) ** 0.5, abs=1e-4)
    out = tmp_path / "p.json"
    assert parity.main([str(r) for r in runs] + ["--json", str(out)]) == 0
    capsys.readouterr()
    (level,) = json.loads(out.read_text())["levels"]
    assert level["orders_equal_ratio"] == pytest.approx(0.992, abs=1e-3)
    # One order only: no table.
    assert parity.compare_runs(runs[:2])[0].by_order is None
    assert parity.main([str(r) for r in runs[:2]]) == 0
    assert "by order" not in capsys.readouterr().out


def test_the_runs_under_the_target_are_set_beside_the_series_decode_forward(tmp_path, capsys):
    """Four runs at 128 streams: the two where d0 fell under 0.98 are the two whose own decode
    forward (step_ms) was longer, while the plain server's passes did not follow the ratio, so
    the ratio ranks exactly against the decode forward (rho -1) and not with the plain pass.
    A run without a step is left out of the table's runs; with fewer than three left, none."""

    def run(name, ratio, step, plain_passes):  # type: ignore[no-untyped-def]
        d0 = {**_row("d0", 128, 10000.0 * ratio, 10.0, 11.0), "step_ms": step,
              "prefill_passes": 300, "decode_passes": 700}
        plain = {**_row("no-spec", 128, 10000.0, 10.0, 11.0), "prefill_passes": 300,
                 "decode_passes": plain_passes - 300}
        return _bench(tmp_path / name, [d0, plain])

    runs = [run("a", 1.02, 6.9, 1000), run("b", 0.90, 7.6, 1050), run("c", 0.99, 7.0, 1100),
            run("d", 0.80, 8.4, 1000)]  # fmt: skip
    (level,) = parity.compare_runs(runs)
    t = level.tracks
    assert t is not None and t.runs_below == 2
    assert (t.decode_ms_below, t.decode_ms_rest) == (8.0, 6.95)
    # d0's pass is 10 ms in every run (10 s over 1,000 passes): outside = 10 - decode forward
    assert (t.outside_ms_below, t.outside_ms_rest) == (2.0, 3.05)
    assert t.rho_decode == -1.0
    # plain ms per pass 10.0, 9.524, 9.091, 10.0 against ratios ranked 3, 2, 1, 4 (low to high)
    assert t.rho_plain_pass is not None and abs(t.rho_plain_pass) < 0.5
    assert parity.main([str(r) for r in runs]) == 0
    text = capsys.readouterr().out
    assert "what the runs under 0.98 share" in text
    row = text.split("what the runs under 0.98 share")[1].splitlines()[2].split()
    assert row == ["128", "2", "of", "4", "8.00", "/", "6.95", "2.00", "/", "3.05", "-1.00",
                   row[-1]]
    # the step missing from two runs: two left, too few to rank
    for name in ("a", "b"):
        data = json.loads((tmp_path / name / "bench.json").read_text())
        del data["results"][0]["step_ms"]
        (tmp_path / name / "bench.json").write_text(json.dumps(data))
    assert parity.compare_runs(runs)[0].tracks is None
    assert parity.main([str(r) for r in runs]) == 0
    assert "what the runs under" not in capsys.readouterr().out


def _decode_row(series: str, c: int, tok_s: float, elapsed: float, passes: int, itl: float,
                prefills: int = 0):
    return {**_row(series, c, tok_s, elapsed, 0.0), "tpot_p50_ms": None, "too_short": True,
            "prefill_passes": prefills, "decode_passes": passes, "server_itl_ms": itl}


def test_decode_only_levels_pool_tok_s_passes_and_sglangs_itl(tmp_path, capsys):
    a = _bench(tmp_path / "a", [_decode_row("d0", 128, 990.0, 10.0, 700, 8.7),
                                _decode_row("no-spec", 128, 1000.0, 10.0, 705, 8.6)])
    b = _bench(tmp_path / "b", [_decode_row("d0", 128, 1000.0, 30.0, 2100, 8.5),
                                _decode_row("no-spec", 128, 1000.0, 30.0, 2100, 8.5)])
    with pytest.raises(parity.ParityError):
        parity.compare_runs([a, b])  # no TPOT anywhere: nothing the usual verdict can judge
    (p,) = parity.compare_decode_only([a, b])
    assert p.ratios == [0.99, 1.0]
    assert p.pooled_ratio == pytest.approx((9900 + 30000) / (10000 + 30000), abs=1e-4)
    assert p.passes_per_s == (70.0, 70.1) and p.itl_ms == (8.55, 8.525)
    assert parity.main([str(a), str(b), "--decode-only"]) == 0
    out = capsys.readouterr().out
    assert "70.0 / 70.1" in out and "at every level: yes" in out


def test_decode_only_refuses_a_window_that_admitted_requests(tmp_path, capsys):
    a = _bench(tmp_path / "a", [_decode_row("d0", 16, 990.0, 10.0, 700, 8.7, prefills=3),
                                _decode_row("no-spec", 16, 1000.0, 10.0, 705, 8.6)])
    assert parity.main([str(a), "--decode-only"]) == 2
    err = capsys.readouterr().err
    assert "d0 at c=16 ran 3 prefill passes in its window" in err and "--decode-only" in err


def test_the_h200_decode_only_series_read_at_parity() -> None:
    """The twenty-first run's two decode-only series at 64 and 128 streams, as checked in."""
    from pathlib import Path

    run = Path(__file__).parents[1] / "benchmarks/results/gpu/h200-sglang-0.5.17-seeded-8b-run21"
    pairs = parity.compare_decode_only([run / "series_decode_1", run / "series_decode_2"])
    assert [p.concurrency for p in pairs] == [64, 128]
    for p in pairs:  # the two servers iterate at the same rate when nothing is admitted
        assert p.pooled_ratio == pytest.approx(1.0, abs=0.005)
        assert p.passes_per_s[0] == pytest.approx(p.passes_per_s[1], rel=0.005)


def test_eviction_ms_per_pass_pool_over_the_runs_that_recorded_them(tmp_path, capsys):
    """d0 evicted 30 ms over 1,300 passes in one run and 0 over 1,500 in the other, the plain
    server 60 ms over 1,600 in the one run that recorded it: pooled, 30/2,800 and 60/1,600 ms
    a pass. A run without the histogram leaves the plain server's other level out."""
    def evicting(row, prefills: int, decodes: int, ms: float | None):  # type: ignore[no-untyped-def]
        return {**row, "prefill_passes": prefills, "decode_passes": decodes, "evict_ms": ms}

    a = _bench(tmp_path / "a", [
        evicting(_row("d0", 64, 9000.0, 10.0, 7.0), 300, 1000, 30.0),
        evicting(_row("no-spec", 64, 9000.0, 10.0, 7.0), 400, 1200, 60.0),
    ])  # fmt: skip
    b = _bench(tmp_path / "b", [
        evicting(_row("d0", 64, 9000.0, 10.0, 7.0), 500, 1000, 0.0),
        evicting(_row("no-spec", 64, 9000.0, 10.0, 7.0), 500, 1000, None),
    ])  # fmt: skip
    (pair,) = parity.compare_runs([a, b])
    assert pair.evict_ms_per_pass == (pytest.approx(30 / 2800, abs=1e-4),
                                      pytest.approx(60 / 1600, abs=1e-4))  # fmt: skip
    assert parity.main([str(a), str(b)]) == 0
    assert "prefix-cache eviction ms per forward pass (d0 / plain): c=64 0.011 / 0.037" in (
        capsys.readouterr().out)
    c = _bench(tmp_path / "c", [_row("d0", 64, 9000.0, 10.0, 7.0),
                                _row("no-spec", 64, 9000.0, 10.0, 7.0)])  # fmt: skip
    (bare,) = parity.compare_runs([c])
    assert bare.evict_ms_per_pass is None
