"""`python -m benchmarks.gpu.cpu_log`: a log recorded from this machine's real /proc while a
paired `specctl bench` runs over two served simulators (real HTTP over loopback), with a busy
process pinned to CPU 0 standing for a neighbour on a server's cores; then cut by level."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest
from test_cli_bench import KEY, push_before
from test_cli_bench_paired import dataset
from typer.testing import CliRunner

from benchmarks.gpu import cpu_log
from controller.cli import app

SPIN = "import time\nt = time.time()\nwhile time.time() - t < 60: pass\n"


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs Linux CPU affinity")
def test_levels_see_a_busy_neighbour_on_its_cores(sim_server_factory, tmp_path, capsys):
    spec = sim_server_factory(admin_key=KEY, speedup=50)
    plain = sim_server_factory(speedup=50, speculative=False)
    push_before(spec.base_url)
    script = tmp_path / "cpu_log_standin.py"
    script.write_text(SPIN)
    neighbour = subprocess.Popen([sys.executable, str(script)])
    os.sched_setaffinity(neighbour.pid, {0})
    log, stop = tmp_path / "cpus.jsonl", threading.Event()
    recorder = threading.Thread(target=cpu_log.record, args=(log, 0.05, stop))
    recorder.start()
    try:
        out = tmp_path / "bench"
        result = CliRunner().invoke(app, [
            "bench", "--url", spec.base_url, "--admin-key", KEY, "--depths", "0",
            "--concurrency", "1,2", "--no-spec-url", plain.base_url, "--paired",
            "--duration-per-level", "0.5", "--warmup-per-level", "0",
            "--dataset", str(dataset(tmp_path)), "--out", str(out), "--client-bound-share", "100",
        ])  # fmt: skip
        assert result.exit_code == 0, result.output
    finally:
        stop.set()
        recorder.join(timeout=10)
        neighbour.kill()
        neighbour.wait(timeout=10)
    report = tmp_path / "cpus.json"
    assert cpu_log.main(["levels", str(log), str(out), "--cores", "first=0",
                         "--cores", "all=0-1023", "--json", str(report)]) == 0  # fmt: skip
    rows = json.loads(report.read_text())
    assert [(r["series"], r["concurrency"]) for r in rows] == [
        ("d0", 1), ("no-spec", 1), ("d0", 2), ("no-spec", 2)]  # fmt: skip
    for row in rows:
        assert row["intervals"] >= 3
        # The spinning neighbour holds CPU 0 (shared with whatever else the machine runs there).
        assert 0.5 <= row["busy"]["first"] <= 1.0
        assert row["busy"]["all"] >= row["busy"]["first"]
        # CPU 0 is the only core of `first`; of every core, the neighbour's is busy enough
        assert row["busiest_core"]["first"] == [0, row["busy"]["first"]]
        assert row["busiest_core"]["all"][1] >= 0.5
        for part in ("irq", "steal"):  # read off this machine: parts of the busy time
            assert 0.0 <= row[part]["first"] <= row["busy"]["first"]
        assert any("cpu_log_standin" in label and share >= 0.5 for label, share in row["top"])
        if cpu_log.cpu_mhz():  # this machine reports its clocks: every level has CPU 0's
            assert row["mhz"]["first"] > 0
    assert "| bench | d0 | 1 |" in capsys.readouterr().out


def test_bad_logs_and_options_are_named(tmp_path, capsys):
    log = tmp_path / "cpus.jsonl"
    log.write_text("not json\n")
    bench = tmp_path / "b"
    bench.mkdir()
    (bench / "bench.json").write_text(json.dumps({"results": []}))
    assert cpu_log.main(["levels", str(log), str(bench)]) == 2
    assert "line 1: not a line `cpu_log record` writes" in capsys.readouterr().err
    log.write_text("")
    assert cpu_log.main(["levels", str(log), str(bench)]) == 2
    assert "no intervals in it" in capsys.readouterr().err
    assert cpu_log.main(["levels", str(log), str(bench), "--cores", "spec"]) == 2
    assert "--cores 'spec': give NAME=CORES" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cpu_log.main(["record", "--out", str(log), "--interval", "0"])
    assert "--interval 0.0: give a positive number" in capsys.readouterr().err


# /proc/stat as Linux writes it: user nice system idle iowait irq softirq steal guest guest_nice
STAT_BEFORE = """cpu  400 0 200 1000 0 10 10 40 0 0
cpu0 100 0 50 500 0 10 10 30 0 0
cpu1 300 0 150 500 0 0 0 10 50 0
intr 12345 0 0
ctxt 999
"""
STAT_AFTER = """cpu  620 0 300 1250 0 30 30 100 0 0
cpu0 150 0 70 540 10 30 30 70 0 0
cpu1 470 0 230 710 0 0 0 30 90 0
intr 23456 0 0
"""


def test_interrupt_and_steal_shares_come_apart_from_the_busy_share(tmp_path, capsys):
    """Two readings of /proc/stat's text: CPU 0 spent 200 jiffies, 40 in interrupts and 40
    stolen by the hypervisor, 50 idle or waiting; CPU 1's guest time (already in its user time)
    is not counted twice. A log line of that interval, beside one recorded before the shares
    existed (busy only: zeros), is cut into a level's row."""
    before, after = cpu_log.parse_stat(STAT_BEFORE), cpu_log.parse_stat(STAT_AFTER)
    assert set(after) == {0, 1}
    assert after[0] == cpu_log.Ticks(busy=350, total=900, irq=60, steal=70)
    got = cpu_log.shares(before, after)
    assert got["cpu_busy"][0] == pytest.approx(150 / 200)
    assert got["cpu_irq"][0] == pytest.approx(40 / 200)
    assert got["cpu_steal"][0] == pytest.approx(40 / 200)
    assert got["cpu_busy"][1] == pytest.approx(270 / 480, abs=1e-3)  # 3 decimals; no guest
    bench = tmp_path / "b"
    bench.mkdir()
    (bench / "bench.json").write_text(json.dumps({"results": [{
        "series": "d0", "concurrency": 128, "window_start_unix": 100.0,
        "window_end_unix": 104.0, "request_rate": None}]}))  # fmt: skip
    log = tmp_path / "cpus.jsonl"
    log.write_text(
        json.dumps({"unix": 102.0, "seconds": 1.0, **got, "top": [["sglang::scheduler", 1.0]]})
        + "\n" + json.dumps({"unix": 103.0, "seconds": 1.0, "cpu_busy": {"0": 0.25, "1": 0.5},
                             "top": []}) + "\n")  # fmt: skip
    assert cpu_log.main(["levels", str(log), str(bench), "--cores", "spec=0",
                         "--json", str(tmp_path / "out.json")]) == 0  # fmt: skip
    (row,) = json.loads((tmp_path / "out.json").read_text())
    assert row["intervals"] == 2
    assert row["busy"]["spec"] == pytest.approx((0.75 + 0.25) / 2, abs=0.01)
    assert row["irq"]["spec"] == pytest.approx(0.2 / 2, abs=0.01)
    assert row["steal"]["spec"] == pytest.approx(0.2 / 2, abs=0.01)
    out = capsys.readouterr().out
    assert "spec busy (irq, steal)" in out and "| 0.5 (0.1, 0.1) |" in out


CPUINFO = """processor\t: 0
model name\t: Some CPU
cpu MHz\t\t: 2596.152
flags\t\t: fpu

processor\t: 1
cpu MHz\t\t: 1800.5
"""


def test_clocks_come_from_cpufreq_where_the_kernel_has_it_else_from_cpuinfo(tmp_path):
    """Files laid out as Linux lays them out (sysfs's kHz, /proc/cpuinfo's MHz)."""
    info = tmp_path / "cpuinfo"
    info.write_text(CPUINFO)
    assert cpu_log.parse_cpuinfo_mhz(CPUINFO) == {0: 2596.2, 1: 1800.5}
    sysfs = tmp_path / "cpu"
    assert cpu_log.cpu_mhz(sysfs, info) == {0: 2596.2, 1: 1800.5}  # no cpufreq: cpuinfo
    for cpu, khz in ((0, 3100000), (1, 1200000)):
        freq = sysfs / f"cpu{cpu}" / "cpufreq"
        freq.mkdir(parents=True)
        (freq / "scaling_cur_freq").write_text(f"{khz}\n")
    assert cpu_log.cpu_mhz(sysfs, info) == {0: 3100.0, 1: 1200.0}
    assert cpu_log.cpu_mhz(tmp_path / "none", tmp_path / "missing") == {}


def test_a_levels_clock_is_its_cores_mean_and_older_logs_show_none(tmp_path, capsys):
    bench = tmp_path / "b"
    bench.mkdir()
    (bench / "bench.json").write_text(json.dumps({"results": [{
        "series": "d0", "concurrency": 4, "window_start_unix": 100.0,
        "window_end_unix": 104.0, "request_rate": None}]}))  # fmt: skip
    line = {"unix": 102.0, "seconds": 1.0, "cpu_busy": {"0": 0.5, "1": 0.5}, "top": []}
    log = tmp_path / "cpus.jsonl"
    log.write_text(json.dumps(line) + "\n")
    out = tmp_path / "out.json"
    assert cpu_log.main(["levels", str(log), str(bench), "--cores", "spec=0-1",
                         "--json", str(out)]) == 0  # fmt: skip
    assert json.loads(out.read_text())[0]["mhz"] == {"spec": None}
    assert "MHz" not in capsys.readouterr().out
    log.write_text(json.dumps({**line, "cpu_mhz": {"0": 3000.0, "1": 2000.0}}) + "\n"
                   + json.dumps({**line, "unix": 103.0, "cpu_mhz": {"0": 2800.0}}) + "\n")
    assert cpu_log.main(["levels", str(log), str(bench), "--cores", "spec=0-1",
                         "--cores", "plain=6", "--json", str(out)]) == 0  # fmt: skip
    assert json.loads(out.read_text())[0]["mhz"] == {"spec": 2600, "plain": None}
    text = capsys.readouterr().out
    assert "| spec MHz |" in text and "plain MHz" not in text and "| 2600 |" in text
