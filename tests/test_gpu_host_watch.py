"""The host-time tools of the GPU harness, on this CPU: `host_watch` loading a real simulated
server over loopback HTTP (depth forced and restored through its admin RPC) while it reads the
/proc counters of real processes: a busy child in its own session stands for the SGLang
server's processes (the simulator runs in this test's process, so it has none of its own), and
`stack_share` over a file py-spy 0.4 wrote (`record --format raw --idle --threads`) for a
two-thread script: a main loop that computes then sleeps, and a sleeping watchdog thread."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.gpu import host_watch, stack_share

DATA = Path(__file__).parent / "data"

# Titled as SGLang titles its scheduler (setproctitle sets the command name too).
BUSY = (
    "from pathlib import Path\nPath('/proc/self/comm').write_text('sglang::schedul')\n"
    "import time\nt = time.time()\nwhile time.time() - t < 30: pass\n"
)


@pytest.fixture
def run_dir(tmp_path: Path, sim_server_factory):
    """A harness run whose 'spec' server is a simulated server (HTTP) and a session of busy
    processes, one titled like SGLang's scheduler (its /proc counters), led by one whose command
    line names a scheduler flag."""
    sim = sim_server_factory(admin_key="k", speedup=100)
    child = tmp_path / "sglang_scheduler_standin.py"
    child.write_text(BUSY)
    # The leader's command line holds a flag with "scheduler" in it, as SGLang's launcher's
    # does with --scheduler-recv-interval: it must not be taken for the scheduler.
    leader = subprocess.Popen(
        [sys.executable, "-c",
         "import os, subprocess, sys; subprocess.run([sys.executable, os.environ['CHILD']])",
         "--scheduler-recv-interval", "8"],
        start_new_session=True, env={**os.environ, "CHILD": str(child)},
    )  # fmt: skip
    state = {"admin_key": "k", "servers": {"spec": {"pid": leader.pid, "url": sim.base_url}}}
    (tmp_path / "state.json").write_text(json.dumps(state))
    (tmp_path / "prompts.jsonl").write_text(
        "".join(
            json.dumps({"prompt": f"question {i}", "output_tokens": 16}) + "\n" for i in range(8)
        )
    )
    time.sleep(0.5)
    yield tmp_path, sim
    os.killpg(leader.pid, signal.SIGKILL)  # the leader and its child: one process group
    leader.wait(timeout=10)


def test_the_watch_loads_each_level_and_sees_the_server_busy(run_dir) -> None:
    path, sim = run_dir
    before = sim.server.specctl_state()["table"]
    out = path / "host"
    rc = host_watch.main(["--run-dir", str(path), "--server", "spec", "--depth", "0",
                          "--streams", "1,4", "--seconds", "1", "--warmup", "0.3",
                          "--dataset", str(path / "prompts.jsonl"), "--out", str(out)])  # fmt: skip
    assert rc == 0
    for streams in (1, 4):
        summary = json.loads((out / f"d0-c{streams}" / "host.json").read_text())
        assert summary["streams"] == streams and summary["tok_per_s"] > 0
        # The spinning child holds up to one CPU (less on a machine busy with other tests);
        # the session no more than it and the idle leader.
        assert 0.2 <= summary["server_cpu_share"] <= 1.3
        busiest = next(row for row in summary["processes"] if row["server"])
        assert summary["scheduler_pid"] == busiest["pid"]
        assert "sglang_scheduler_standin" in host_watch.cmdline(busiest["pid"])
        assert summary["machine_cpu_share"] >= summary["server_cpu_share"]
        # The server's own pass counter across the window, scraped over loopback HTTP.
        assert summary["decode_passes"] > 0 and summary["prefill_passes"] >= 0
    assert sim.server.stats().iterations_per_depth.get(0, 0) > 0  # the forced depth ran
    assert sim.server.specctl_state()["table"] == before  # and the table is restored


def test_bad_requests_are_named(run_dir) -> None:
    path, _ = run_dir
    common = ["--run-dir", str(path), "--dataset", str(path / "prompts.jsonl"),
              "--out", str(path / "w")]  # fmt: skip
    with pytest.raises(SystemExit, match="no server 'plain'"):
        host_watch.main([*common, "--server", "plain"])
    (path / "state.json").write_text(json.dumps({"servers": {"plain": {"pid": 1, "url": "x"}}}))
    with pytest.raises(SystemExit, match="--depth needs --server spec"):
        host_watch.main([*common, "--server", "plain", "--depth", "0"])


def test_cgroup_counters_parse_when_present() -> None:
    stat = host_watch.cgroup_stat()
    # Present on a cgroup-v1 or v2 machine; where neither file exists, nothing is invented.
    if stat:
        assert all(isinstance(v, int) for v in stat.values())
    else:
        assert not any(p.exists() for p in host_watch.CGROUP_FILES)


def test_stack_shares_count_the_main_thread_only() -> None:
    shares = stack_share.load(DATA / "py_spy_raw_threads.txt")
    assert shares.samples == 291 + 108
    assert shares.share("event_loop (loop2.py)") == pytest.approx(1.0)
    assert shares.share("wait (loop2.py)", own=True) == pytest.approx(291 / 399)
    assert shares.share("busy (loop2.py)") == pytest.approx(108 / 399)
    everything = stack_share.load(DATA / "py_spy_raw_threads.txt", thread="")
    assert everything.samples == 399 + 291 + 108
    assert everything.share("watchdog (loop2.py)") == pytest.approx(399 / 798)


def test_a_gzipped_stacks_file_reads_the_same(tmp_path: Path) -> None:
    import gzip

    packed = tmp_path / "stacks.txt.gz"
    packed.write_bytes(gzip.compress((DATA / "py_spy_raw_threads.txt").read_bytes()))
    assert stack_share.load(packed) == stack_share.load(DATA / "py_spy_raw_threads.txt")


def test_frame_keys_drop_lines_and_long_paths() -> None:
    key = stack_share.frame_key("run_batch (/opt/v/lib/sglang/srt/managers/scheduler.py:2301)")
    assert key == "run_batch (managers/scheduler.py)"
    assert stack_share.frame_key("thread-less") == "thread-less"


def test_compare_lists_the_largest_change_first(tmp_path: Path) -> None:
    a = tmp_path / "plain" / "stacks.txt"
    b = tmp_path / "d0" / "stacks.txt"
    for path, waits in ((a, 80), (b, 40)):
        path.parent.mkdir()
        path.write_text(
            f"thread (1): MainThread;loop (s.py:1);wait (s.py:2) {waits}\n"
            f"thread (1): MainThread;loop (s.py:1);work (s.py:3) {100 - waits}\n"
        )
    lines = stack_share.compare(stack_share.load(a), stack_share.load(b), 5, ("plain", "d0"))
    assert "wait (s.py)" in lines[2] and "-40.0%" in lines[2]
    assert "work (s.py)" in lines[3] and "+40.0%" in lines[3]


def test_equal_changes_print_in_name_order() -> None:
    text = "".join(f"thread (1): MainThread;loop (s.py:1);{name} (s.py:2) 10\n"
                   for name in ("zeta", "alpha", "mid"))
    before = stack_share.parse("thread (1): MainThread;loop (s.py:1) 30\n")
    lines = stack_share.compare(before, stack_share.parse(text), 5, ("a", "b"))
    assert [line.split()[-2] for line in lines[2:5]] == ["alpha", "mid", "zeta"]


def test_a_file_without_samples_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "stacks.txt"
    empty.write_text("not py-spy output\n")
    with pytest.raises(SystemExit, match="no py-spy samples"):
        stack_share.load(empty)


def test_busy_shares_leave_the_gpu_waits_out_of_every_function_but_not_the_total() -> None:
    text = (
        "thread (1): MainThread;loop (s.py:1);process (s.py:2);Event.synchronize (c.py:9) 60\n"
        "thread (1): MainThread;loop (s.py:1);process (s.py:2);tolist (s.py:4) 10\n"
        "thread (1): MainThread;loop (s.py:1);launch (s.py:3) 30\n"
    )
    busy = stack_share.parse(text, busy=True)
    assert busy.samples == 100
    assert busy.share("loop (s.py)") == pytest.approx(0.40)
    assert busy.share("process (s.py)") == pytest.approx(0.10)
    assert busy.share("Event.synchronize (c.py)") == 0.0
    waiting = stack_share.parse(text)
    assert waiting.share("process (s.py)") == pytest.approx(0.70)


def test_the_cli_compares_busy_shares(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                      ) -> None:
    for name, wait in (("plain", 50), ("d0", 20)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "stacks.txt").write_text(
            f"thread (1): MainThread;loop (s.py:1);Event.synchronize (c.py:9) {wait}\n"
            f"thread (1): MainThread;loop (s.py:1);work (s.py:3) {100 - wait}\n")
    assert stack_share.main(["compare", "--busy", str(tmp_path / "plain" / "stacks.txt"),
                             str(tmp_path / "d0" / "stacks.txt")]) == 0
    out = capsys.readouterr().out
    assert "+30.0%  loop (s.py)" in out and "+30.0%  work (s.py)" in out
    assert "Event.synchronize" not in out


def _watched(folder: Path, stacks: str, **host: float) -> Path:
    folder.mkdir()
    (folder / "stacks.txt").write_text(stacks)
    (folder / "host.json").write_text(json.dumps(host))
    return folder / "stacks.txt"


def test_per_pass_compares_host_milliseconds_per_decode_iteration(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Two servers over 8 s windows at different rates: the one that spent a smaller share of
    its window in `work` can still have spent more per iteration."""
    stacks = ("thread (1): MainThread;loop (s.py:1);Event.synchronize (c.py:9) {wait}\n"
              "thread (1): MainThread;loop (s.py:1);work (s.py:3) {work}\n")
    plain = _watched(tmp_path / "plain", stacks.format(wait=50, work=50),
                     seconds=8.0, decode_passes=1600, prefill_passes=400)
    d0 = _watched(tmp_path / "d0", stacks.format(wait=60, work=40),
                  seconds=8.0, decode_passes=800, prefill_passes=240)
    assert stack_share.main(["compare", "--busy", "--per-pass", str(plain), str(d0)]) == 0
    out = capsys.readouterr().out
    # plain: 0.5 of 8 s over 1,600 iterations = 2.5 ms; d0: 0.4 of 8 s over 800 = 4.0 ms.
    assert "   2.500        4.000   +1.500  work (s.py)" in out
    assert "1600 decode iterations, 400 prefill batches (0.25 a decode iteration)" in out
    assert "(0.30 a decode iteration)" in out


def test_per_pass_names_what_host_json_lacks(tmp_path: Path) -> None:
    stacks = "thread (1): MainThread;loop (s.py:1) 10\n"
    old = _watched(tmp_path / "old", stacks, seconds=8.0)
    new = _watched(tmp_path / "new", stacks, seconds=8.0, decode_passes=10, prefill_passes=1)
    with pytest.raises(SystemExit, match=r"has no decode_passes, prefill_passes .*without "
                                         r"--per-pass"):
        stack_share.main(["compare", "--per-pass", str(old), str(new)])
    idle = _watched(tmp_path / "idle", stacks, seconds=8.0, decode_passes=0, prefill_passes=0)
    with pytest.raises(SystemExit, match="ran no decode iteration"):
        stack_share.main(["compare", "--per-pass", str(new), str(idle)])
    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "stacks.txt").write_text(stacks)
    with pytest.raises(SystemExit, match=r"host\.json, which host_watch writes"):
        stack_share.main(["compare", "--per-pass", str(new), str(tmp_path / "bare" / "stacks.txt")])


def test_lines_split_a_function_by_its_line_and_callee(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`prepare` on 60 of 100 main-thread samples: 30 in its own line 14 (C code, say), 20 in
    what line 41 called, 10 in its line 33; another thread's samples and a second call of
    `prepare` deeper on the same stack count once, at the outermost."""
    stacks = ("thread (1): MainThread;loop (s.py:1);prepare (/x/sglang/u.py:14) 30\n"
              "thread (1): MainThread;loop (s.py:1);prepare (/x/sglang/u.py:41);"
              "alloc (a.py:7);prepare (/x/sglang/u.py:14) 20\n"
              "thread (1): MainThread;loop (s.py:1);prepare (/x/sglang/u.py:33) 10\n"
              "thread (1): MainThread;loop (s.py:1);other (s.py:5) 40\n"
              "thread (2): Helper;prepare (/x/sglang/u.py:14) 99\n")
    d0 = _watched(tmp_path / "d0", stacks, seconds=8.0, decode_passes=800, prefill_passes=80)
    assert stack_share.main(["lines", str(d0), "prepare"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "prepare: 60.000 (% of samples), 60 of 100 samples"
    assert out[2:] == ["  30.000    14  (own)", "  20.000    41  alloc (a.py)",
                       "  10.000    33  (own)"]
    # per pass: 0.3 of 8 s over 800 iterations = 3 ms; by its file-qualified name
    assert stack_share.main(["lines", "--per-pass", str(d0), "prepare (sglang/u.py)"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("prepare (sglang/u.py): 6.000 (host ms per decode iteration)")
    assert out[3] == "   3.000    14  (own)"
    with pytest.raises(SystemExit, match=r"'missing' is on none of the 100 stacks"):
        stack_share.main(["lines", str(d0), "missing"])
