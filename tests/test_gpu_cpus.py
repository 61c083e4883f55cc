"""`benchmarks.gpu.cpus`: CPU lists, the pinning wrapper as a real process, and the harness's
server launches through it (a real `specctl sim serve` stand-in over loopback)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
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


def test_repin_moves_every_thread_of_a_running_session(tmp_path):
    """A real session: its leader starts a child, and the child a second thread, all pinned
    to the first core; `repin` moves all three threads to the last core. A pid that is no
    process's, or a malformed call, is an error naming the fix."""
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("needs two cores to move a session between")
    first, last = allowed[0], allowed[-1]
    ready = tmp_path / "ready"
    child = ("import os, threading, time, sys; threading.Thread(target=time.sleep, args=(60,), "
             "daemon=True).start(); open(sys.argv[1], 'w').write(str(os.getpid())); "
             "time.sleep(60)")
    leader_code = (f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', "
                   f"{child!r}, {str(ready)!r}]); p.wait()")
    leader = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.gpu.cpus", str(first), "--", sys.executable, "-c",
         leader_code], cwd=ROOT, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() or not ready.read_text():
            assert leader.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        child_pid = int(ready.read_text())
        threads = [int(t) for p in (leader.pid, child_pid) for t in os.listdir(f"/proc/{p}/task")]
        assert len(threads) >= 3 and all(os.sched_getaffinity(t) == {first} for t in threads)
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.gpu.cpus", "repin", str(leader.pid), str(last)],
            cwd=ROOT, capture_output=True, text=True, timeout=60)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(f"moved {len(threads)} threads of 2 processes")
        assert all(os.sched_getaffinity(t) == {last} for t in threads)
    finally:
        os.killpg(leader.pid, 9)
        leader.wait(timeout=30)
    gone = subprocess.run([sys.executable, "-m", "benchmarks.gpu.cpus", "repin", "999999999",
                           str(first)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert gone.returncode == 2 and "give a running server's pid" in gone.stderr
    usage = subprocess.run([sys.executable, "-m", "benchmarks.gpu.cpus", "repin", "x"],
                           cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2 and "usage: python -m benchmarks.gpu.cpus repin" in usage.stderr
