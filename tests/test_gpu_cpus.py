"""`benchmarks.gpu.cpus`: CPU lists, the pinning wrapper as a real process, and the harness's
server launches through it (a real `specctl sim serve` stand-in over loopback)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.gpu import servers
from benchmarks.gpu.cpus import CpuListError, parse_cpu_list, pinned_argv
from benchmarks.gpu.options import OptionError, Options, validate
from benchmarks.gpu.procs import session_pids

ROOT = Path(__file__).resolve().parent.parent
FIRST = min(os.sched_getaffinity(0))


def test_cpu_lists_take_cores_and_ranges_this_machine_allows():
    assert parse_cpu_list(str(FIRST)) == {FIRST}
    assert pinned_argv("", ["serve"]) == ["serve"]
    allowed = sorted(os.sched_getaffinity(0))
    assert parse_cpu_list(f"{allowed[0]}-{allowed[0]}," + str(allowed[-1])) == {
        allowed[0], allowed[-1]}
    with pytest.raises(CpuListError, match=r"--spec-cpus: expected core numbers and ranges"):
        parse_cpu_list("0-x", "spec-cpus")
    with pytest.raises(CpuListError, match=r"'3-1' is not a range of cores"):
        parse_cpu_list("3-1")
    with pytest.raises(CpuListError, match=r"core 99999 is not available here; this machine "
                                           r"allows \d"):
        parse_cpu_list("99999")


def test_the_wrapper_pins_the_command_and_keeps_its_pid():
    code = "import os; print(os.getpid(), sorted(os.sched_getaffinity(0)))"
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.gpu.cpus", str(FIRST), "--", sys.executable, "-c",
         code], cwd=ROOT, stdout=subprocess.PIPE, text=True)  # fmt: skip
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert out.split(maxsplit=1) == [str(proc.pid), f"[{FIRST}]\n"]
    bad = subprocess.run([sys.executable, "-m", "benchmarks.gpu.cpus", "0"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "usage:" in bad.stderr
    missing = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu.cpus", str(FIRST), "--", "no-such-command-x"],
        cwd=ROOT, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert missing.returncode == 127 and "cannot run 'no-such-command-x'" in missing.stderr


def test_harness_options_refuse_a_core_the_machine_lacks():
    with pytest.raises(OptionError, match="--plain-cpus: core 99999 is not available"):
        validate(Options(backend="sim", plain_cpus="99999"))
    validate(Options(backend="sim", spec_cpus=str(FIRST)))


def test_a_pinned_server_session_runs_on_its_cores(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    opts = servers.ServerOptions(backend="sim", admin_key="k", spec_port=port,
                                 plain_port=port + 1, spec_cpus=str(FIRST), sim_speedup=20.0)
    spec, plain = servers.plans(None, opts, tmp_path)
    assert spec.argv[:5] == pinned_argv(str(FIRST), [], sys.executable)
    assert "benchmarks.gpu.cpus" not in plain.argv  # --plain-cpus not given
    assert spec.describe().split()[2:4] == ["benchmarks.gpu.cpus", str(FIRST)]
    pid = servers.launch(spec)
    try:
        servers.wait_healthy(spec.url, pid, spec.log, timeout_s=60)
        for member in session_pids(pid) | {pid}:
            assert os.sched_getaffinity(member) == {FIRST}
    finally:
        assert servers.stop(pid) in ("stopped", "killed")
