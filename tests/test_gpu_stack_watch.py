"""`stack_watch`: both schedulers sampled now and then over a run, first against last.

Real: the harness's state file, /proc (a child process titled as SGLang titles its scheduler,
in its own session like a server's processes, whose memory is read), the rounds' timing and
SIGTERM. A stand-in for py-spy (it needs ptrace rights this machine may not grant): a script
taking py-spy's arguments that writes a raw stacks file of py-spy's format, in which one
function's samples grow from round to round, as a server whose host work grows would show.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.gpu import stack_watch

TITLED = (
    "from pathlib import Path\nPath('/proc/self/comm').write_text('sglang::schedul')\n"
    "import time\ntime.sleep(60)\n"
)
# py-spy's stand-in: `record ... --output F`; the round is the file name's number.
PY_SPY = f"""#!{sys.executable}
import sys, re
out = sys.argv[sys.argv.index("--output") + 1]
n = int(re.search(r"_(\\d+)\\.txt$", out).group(1))
with open(out, "w") as f:
    f.write(f"thread (1): MainThread;loop (s.py:1);Event.synchronize (c.py:9) {{100 - 20 * n}}\\n")
    f.write(f"thread (1): MainThread;loop (s.py:1);grow (s.py:3) {{20 * n}}\\n")
"""


@pytest.fixture
def run_dir(tmp_path: Path) -> Iterator[Path]:
    child = tmp_path / "sglang_scheduler_standin.py"
    child.write_text(TITLED)
    leader = subprocess.Popen(
        [sys.executable, "-c",
         "import os, subprocess, sys; subprocess.run([sys.executable, os.environ['CHILD']])"],
        start_new_session=True, env={**os.environ, "CHILD": str(child)},
    )  # fmt: skip
    (tmp_path / "state.json").write_text(json.dumps(
        {"servers": {"spec": {"pid": leader.pid, "url": "http://127.0.0.1:1"}}}))
    spy = tmp_path / "py-spy"
    spy.write_text(PY_SPY)
    spy.chmod(spy.stat().st_mode | stat.S_IXUSR)
    time.sleep(0.5)  # the child has titled itself
    yield tmp_path
    os.killpg(leader.pid, signal.SIGKILL)
    leader.wait(timeout=10)


def _record(path: Path, *extra: str) -> list[str]:
    return ["record", "--run-dir", str(path), "--py-spy", str(path / "py-spy"),
            "--out", str(path / "stacks"), "--servers", "spec", "--seconds", "0.2",
            "--every", "0.3", *extra]  # fmt: skip


def test_rounds_sample_the_scheduler_and_compare_says_what_grew(
    run_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert stack_watch.main(_record(run_dir, "--rounds", "3")) == 0
    index = json.loads((run_dir / "stacks" / "samples.json").read_text())
    samples = index["samples"]
    assert [(s["server"], s["round"], s["file"], s["rc"]) for s in samples] == [
        ("spec", n, f"spec_{n}.txt", 0) for n in (1, 2, 3)]  # fmt: skip
    assert all(s["scheduler_rss_mb"] > 0 and s["scheduler_pid"] for s in samples)
    assert samples[1]["start_unix"] - samples[0]["start_unix"] == pytest.approx(0.3, abs=0.25)
    lines = stack_watch.compare(run_dir / "stacks", top=5)
    assert lines[0].startswith("== spec: round 1 against round 3")
    assert "scheduler memory" in lines[0]
    grow = next(line for line in lines if "grow (s.py)" in line)
    assert "+40.0%" in grow  # 20% of the window busy in it, then 60%


def test_sigterm_ends_the_recording_with_its_index(run_dir: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.gpu.stack_watch", *_record(run_dir, "--every", "5")],
        cwd=Path(__file__).resolve().parents[1],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    time.sleep(1.5)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0 and "1 rounds" in out
    index = json.loads((run_dir / "stacks" / "samples.json").read_text())
    assert len(index["samples"]) == 1


def test_bad_input_is_named(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit, match="no server 'plain'"):
        stack_watch.main(_record(run_dir, "--servers", "spec,plain", "--rounds", "1"))
    assert stack_watch.main(_record(run_dir, "--rounds", "0")) == 2
    with pytest.raises(SystemExit, match="give the folder `record` wrote"):
        stack_watch.compare(run_dir / "nothing", top=5)


def test_a_sample_counts_the_passes_its_server_ran(run_dir: Path, sim_server_factory) -> None:
    """The server's pass counter, scraped over loopback HTTP at both ends of each sample, from a
    simulated server with its own closed-loop load; the unreachable URL of the fixture gives
    None, not a guess."""
    assert stack_watch.main(_record(run_dir, "--rounds", "1")) == 0
    unreachable = json.loads((run_dir / "stacks" / "samples.json").read_text())["samples"][0]
    assert unreachable["decode_passes"] is None and unreachable["prefill_passes"] is None
    sim = sim_server_factory(concurrency=8, speedup=50)
    state = json.loads((run_dir / "state.json").read_text())
    state["servers"]["spec"]["url"] = sim.base_url
    (run_dir / "state.json").write_text(json.dumps(state))
    assert stack_watch.main(_record(run_dir, "--rounds", "1")) == 0
    sample = json.loads((run_dir / "stacks" / "samples.json").read_text())["samples"][0]
    assert sample["decode_passes"] > 0 and sample["prefill_passes"] >= 0
    assert sample["window_s"] > 0  # the stand-in for py-spy returns at once


def test_compare_reads_host_ms_per_decode_iteration_where_both_samples_counted(
        tmp_path: Path) -> None:
    """Round 1: 20% of a 6 s window busy in `grow` over 1,200 iterations (1.0 ms each); round 2:
    30% of 6 s over 600 (3.0 ms). Without pass counts the same files compare by share."""
    for n, busy in enumerate((20, 30), 1):
        (tmp_path / f"spec_{n}.txt").write_text(
            f"thread (1): MainThread;loop (s.py:1);Event.synchronize (c.py:9) {100 - busy}\n"
            f"thread (1): MainThread;loop (s.py:1);grow (s.py:3) {busy}\n")
    samples = [{"server": "spec", "round": n, "start_unix": 60.0 * n, "seconds": 6.0,
                "file": f"spec_{n}.txt", "rc": 0, "scheduler_pid": 1, "scheduler_rss_mb": 900.0,
                "decode_passes": passes, "prefill_passes": passes // 4, "window_s": 6.0}
               for n, passes in ((1, 1200), (2, 600))]  # fmt: skip
    (tmp_path / "samples.json").write_text(json.dumps({"samples": samples}))
    lines = stack_watch.compare(tmp_path, top=5)
    assert "1200 decode iterations, 300 prefill batches" in "\n".join(lines)
    grow = next(line for line in lines if "grow (s.py)" in line)
    assert grow.split()[:3] == ["1.000", "3.000", "+2.000"]
    for s in samples:
        s["decode_passes"] = None  # an index recorded before passes were counted
    (tmp_path / "samples.json").write_text(json.dumps({"samples": samples}))
    grow = next(line for line in stack_watch.compare(tmp_path, top=5) if "grow (s.py)" in line)
    assert "+10.0%" in grow
