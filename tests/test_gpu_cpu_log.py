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
        assert any("cpu_log_standin" in label and share >= 0.5 for label, share in row["top"])
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
