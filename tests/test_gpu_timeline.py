"""`python -m benchmarks.gpu.timeline`: every level of several benches in the order they ran.

The bench.json files are written here in `specctl bench`'s format (the fields the timeline
reads), so each level's place and figures are known by hand.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.gpu import timeline


def _row(
    series: str, c: int, start: float, elapsed: float, passes: tuple[int, int],
    evict_ms: float | None = None, flushed: bool | None = None,
) -> dict[str, object]:  # fmt: skip
    return {"series": series, "concurrency": c, "output_tok_per_s": 1000.0 * c,
            "elapsed_s": elapsed, "prefill_passes": passes[0], "decode_passes": passes[1],
            "step_ms": 5.0 if series == "d0" else None, "evict_ms": evict_ms,
            "cache_flushed": flushed, "window_start_unix": start}  # fmt: skip


def _bench(path: Path, rows: list[dict[str, object]]) -> Path:
    path.mkdir()
    (path / "bench.json").write_text(json.dumps({"results": rows}))
    return path


def test_levels_of_several_benches_in_the_order_they_ran(tmp_path: Path, capsys) -> None:
    """Bench b ran between bench a's two levels' windows; a level without its window's time
    cannot be placed and is left out."""
    a = _bench(tmp_path / "a", [
        _row("d0", 64, 1000.0, 8.0, (200, 1000), evict_ms=60.0, flushed=False),
        _row("no-spec", 64, 1030.0, 8.0, (100, 900)),
    ])  # fmt: skip
    b = _bench(tmp_path / "b", [
        _row("d0", 64, 1010.0, 8.0, (200, 1400), flushed=True),
        {"series": "d0", "concurrency": 128, "output_tok_per_s": 1.0},
    ])  # fmt: skip
    levels = timeline.levels_of([a, b])
    assert [(lv.bench, lv.series, lv.at_s) for lv in levels] == [
        ("a", "d0", 0.0), ("b", "d0", 10.0), ("a", "no-spec", 30.0)]
    first = levels[0]
    assert first.ms_per_pass == pytest.approx(8000.0 / 1200)
    assert first.evict_ms_per_pass == pytest.approx(60.0 / 1200)
    assert first.prefills_per_decode == pytest.approx(0.2) and first.flushed is False
    assert levels[1].evict_ms_per_pass is None and levels[1].flushed is True
    assert timeline.main([str(a), str(b)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[1].split() == [
        "0", "a", "d0", "64", "64000", "6.67", "5.00", "0.200", "0.050", "no"]


def test_drift_compares_the_first_level_with_the_last_third(tmp_path: Path) -> None:
    """Six levels of d0 at 128 streams whose ms per pass climbs 7, 7.5, ..., 9.5: the last
    third's mean is 9.25 ms, +32% on the first, and time ranks them perfectly. A server with
    fewer than MIN_LEVELS levels at a load gets no row."""
    rows = [_row("d0", 128, 100.0 * i, (7.0 + 0.5 * i) * 1000 / 1000, (0, 1000))
            for i in range(6)]  # fmt: skip
    rows.append(_row("no-spec", 128, 700.0, 7.0, (0, 1000)))
    levels = timeline.levels_of([_bench(tmp_path / "a", rows)])
    (drift,) = timeline.drifts(levels)
    assert (drift.series, drift.concurrency, drift.levels) == ("d0", 128, 6)
    assert drift.first_ms == pytest.approx(7.0) and drift.last_third_ms == pytest.approx(9.25)
    assert drift.change == pytest.approx(9.25 / 7.0 - 1.0) and drift.rho_time == 1.0


def test_a_bench_that_cannot_be_read_is_named(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "bench.json").write_text("{not json")
    assert timeline.main([str(bad)]) == 2
    assert f"{bad / 'bench.json'}" in capsys.readouterr().err
    old = _bench(tmp_path / "old", [{"series": "d0", "concurrency": 4, "output_tok_per_s": 9.0}])
    assert timeline.main([str(old)]) == 2
    assert "window_start_unix" in capsys.readouterr().err
