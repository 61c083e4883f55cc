"""`python -m benchmarks.gpu.gpu_clocks`: a paired `specctl bench` over two served simulators
(real HTTP over loopback) records each level's window in wall-clock time, and an nvidia-smi
log is cut by those windows. No GPU here: the log is written in nvidia-smi's CSV format by the
test (`--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader,
nounits`), with a clock that steps up at a known time."""

from __future__ import annotations

import itertools
import json
import time
from datetime import datetime
from pathlib import Path

from test_cli_bench_paired import paired_bench

from benchmarks.gpu import gpu_clocks


def _log(path: Path, start: float, end: float, step_at: float) -> Path:
    """Samples every 10 ms from `start` to `end`: 1,500 MHz and 300 W before `step_at`, 1,980
    MHz and 600 W after, the temperature the sample's index; a header and a failed read among
    them, as nvidia-smi can print."""
    lines = ["timestamp, clocks.current.sm [MHz], power.draw [W], temperature.gpu"]
    t, i = start, 0
    while t <= end:
        stamp = datetime.fromtimestamp(t).strftime(gpu_clocks.TIME_FORMAT)[:-3]
        hot = t >= step_at
        lines.append(f"{stamp}, {1980 if hot else 1500}, {600.0 if hot else 300.0}, {i}")
        if i == 3:
            lines.append(f"{stamp}, [N/A], [N/A], [N/A]")
        t, i = t + 0.01, i + 1
    path.write_text("\n".join(lines) + "\n")
    return path


def test_levels_read_the_samples_inside_their_windows(sim_server_factory, tmp_path, capsys):
    before = time.time()
    _, _, out = paired_bench(sim_server_factory, tmp_path, "0", 4)
    after = time.time()
    rows = json.loads((out / "bench.json").read_text())["results"]
    windows = [(r["window_start_unix"], r["window_end_unix"]) for r in rows]
    assert [(r["series"], r["concurrency"]) for r in rows] == [
        ("d0", 1), ("no-spec", 1), ("d0", 3), ("no-spec", 3)]  # fmt: skip
    assert all(before < start < end < after for start, end in windows)
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(windows))  # in order
    # The clock steps up as the plain server's one-stream level starts: d0 at 1 stream reads
    # the low clock, every later level the high one.
    log = _log(tmp_path / "clocks.csv", before, after, step_at=windows[1][0])
    report = tmp_path / "clocks.json"
    assert gpu_clocks.main([str(log), str(out), "--json", str(report)]) == 0
    got = json.loads(report.read_text())
    assert [(r["series"], r["concurrency"]) for r in got] == [
        ("d0", 1), ("no-spec", 1), ("d0", 3), ("no-spec", 3)]  # fmt: skip
    assert all(r["samples"] >= 1 for r in got)
    assert [r["sm_mhz"] for r in got] == [1500, 1980, 1980, 1980]
    assert [r["power_w"] for r in got] == [300, 600, 600, 600]
    printed = capsys.readouterr().out
    assert "| bench | 1 | 1500 / 1980 | 300 / 600 |" in printed


def test_bad_logs_and_old_benches_are_named(tmp_path, capsys):
    empty = tmp_path / "empty.csv"
    empty.write_text("nvidia-smi: command failed\n")
    bench = tmp_path / "old"
    bench.mkdir()
    (bench / "bench.json").write_text(json.dumps({"results": [
        {"series": "d0", "concurrency": 1}]}))  # fmt: skip
    assert gpu_clocks.main([str(empty), str(bench)]) == 2
    assert "empty.csv: no samples in it" in capsys.readouterr().err
    log = _log(tmp_path / "clocks.csv", time.time() - 1, time.time(), step_at=time.time())
    assert gpu_clocks.main([str(log), str(bench)]) == 2
    assert "carry no window times" in capsys.readouterr().err
    assert gpu_clocks.main([str(log), str(tmp_path / "nowhere")]) == 2
    assert "not a bench result" in capsys.readouterr().err
