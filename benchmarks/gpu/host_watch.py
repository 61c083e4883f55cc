"""Where a server's host time goes under load: CPU per process, the container's CPU
throttling, and (optional) the scheduler's Python stacks sampled by py-spy.

    python -m benchmarks.gpu.host_watch --run-dir /tmp/gpu-run --server spec --depth 0 \
        --streams 1,4 --dataset family_a.jsonl --out /tmp/gpu-run/host --py-spy PATH
    python -m benchmarks.gpu.host_watch --run-dir /tmp/gpu-run --server plain --streams 1,4 ...

For each level it keeps N closed-loop streams on the server (a depth forced first on the
speculative server through the admin RPC, its table restored after), and over the measured
window it writes OUT/<label>-c<N>/host.json (CPU seconds per process of the machine, the
busiest first, which of them belong to the server, the cgroup's throttling counters, the CPU
count and quota, the level's tok/s, and the server's prefill batches and decode iterations in
the window from its /metrics) and, with --py-spy, stacks.txt: py-spy's collapsed stacks
of the server's scheduler (`--nonblocking`, so the scheduler is never paused; `--idle`, so
time spent waiting counts; `--threads`). `python -m benchmarks.gpu.stack_share` reads them
(`--per-pass`: host milliseconds per decode iteration, from the window and the passes in
host.json).

Why: at 64-128 streams both servers are host-bound and their tok/s moves 25-50% between
benches of one start, and at one stream a depth-0 iteration pays host time a plain decode
does not. Throttling by a CPU quota, a busy neighbour, or a wait inside the scheduler loop
each leave a different mark here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from benchmarks.gpu.kernel_profile import streams_option
from benchmarks.gpu.procs import all_cpu_seconds, cmdline, command_name, label_of, session_pids
from benchmarks.gpu.state import RunState
from controller.bench.loadgen import (
    ClosedLoop,
    LevelLoad,
    StopRule,
    WindowHooks,
    make_client,
    run_level,
)
from controller.bench.metrics import ForwardPasses, Scrape, passes_between
from controller.bench.prompts import DatasetError, read_dataset
from controller.bench.server_client import ServerClient, ServerError
from sglang_hooks.contract import single_depth_table

T = TypeVar("T")
CGROUP_FILES = (Path("/sys/fs/cgroup/cpu.stat"), Path("/sys/fs/cgroup/cpu,cpuacct/cpu.stat"))
CPU_MAX = (Path("/sys/fs/cgroup/cpu.max"), Path("/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us"))


def cgroup_stat() -> dict[str, int]:
    for path in CGROUP_FILES:
        try:
            lines = path.read_text().split("\n")
        except OSError:
            continue
        out = {}
        for line in lines:
            parts = line.split()
            if len(parts) == 2 and parts[1].lstrip("-").isdigit():
                out[parts[0]] = int(parts[1])
        return out
    return {}


def cpu_quota() -> str | None:
    for path in CPU_MAX:
        try:
            return path.read_text().strip()
        except OSError:
            continue
    return None


@dataclass
class Window:
    seconds: float
    cpu: dict[int, float]  # pid -> CPU seconds in the window
    cgroup: dict[str, int]  # counter -> change over the window


def measure(seconds: float) -> Window:
    before, cg0, t0 = all_cpu_seconds(), cgroup_stat(), time.monotonic()
    time.sleep(seconds)
    after, cg1, t1 = all_cpu_seconds(), cgroup_stat(), time.monotonic()
    cpu = {pid: after[pid] - before.get(pid, 0.0) for pid in after}
    change = {k: cg1[k] - cg0.get(k, 0) for k in cg1}
    return Window(t1 - t0, cpu, change)


_SCHED_COMM = "sglang::scheduler"[:15]  # the kernel keeps 15 characters of a name


def scheduler_pid(pids: set[int]) -> int | None:
    """The server's scheduler: SGLang titles it `sglang::scheduler...` (its command line, and
    its command name cut to 15 characters). The title, not a substring: the launcher's own
    command line holds `--scheduler-recv-interval` when that flag is set."""
    found = [
        p for p in pids
        if cmdline(p).startswith("sglang::scheduler") or command_name(p).startswith(_SCHED_COMM)
    ]  # fmt: skip
    return min(found) if found else None


def summarise(win: Window, mine: set[int], top: int) -> dict[str, Any]:
    busiest = sorted(win.cpu.items(), key=lambda kv: -kv[1])[:top]
    return {
        "seconds": round(win.seconds, 3),
        "cpus": os.cpu_count(),
        "cpu_quota": cpu_quota(),
        "cgroup_change": win.cgroup,
        "machine_cpu_share": round(sum(win.cpu.values()) / win.seconds, 3),
        "server_cpu_share": round(sum(win.cpu.get(p, 0.0) for p in mine) / win.seconds, 3),
        "processes": [
            {
                "pid": pid,
                "server": pid in mine,
                "cpu_share": round(sec / win.seconds, 3),
                "what": label_of(pid),
            }
            for pid, sec in busiest
            if sec > 0
        ],
    }


def passes_in(scrape: Callable[[], Scrape | None], window: Callable[[], T]
              ) -> tuple[T, ForwardPasses | None]:
    """`window()` between two scrapes of the server: what it returned, and the prefill batches
    and decode iterations the server counted across it (None where a scrape failed or the
    server exports no pass counter)."""
    before = scrape()
    win = window()
    after = scrape()
    if before is None or after is None:
        return win, None
    return win, passes_between(before, after)


class _WatchWindow(WindowHooks):
    """Measures the host (and runs py-spy) over the level's measured window."""

    def __init__(self, out: Path, mine: set[int], sched: int | None, args: argparse.Namespace,
                 scrape: Callable[[], Scrape | None]):
        self.out, self.mine, self.sched, self.args = out, mine, sched, args
        self.scrape = scrape
        self.summary: dict[str, Any] = {}
        self._thread: threading.Thread | None = None

    async def window_started(self) -> None:
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    async def window_ended(self) -> None:
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)

    def _summary(self) -> dict[str, Any]:
        win, passes = passes_in(self.scrape, lambda: measure(self.args.seconds))
        return {**summarise(win, self.mine, self.args.top),
                "prefill_passes": None if passes is None else passes.prefill,
                "decode_passes": None if passes is None else passes.decode}

    def _watch(self) -> None:
        if not (self.args.py_spy and self.sched is not None):
            self.summary = self._summary()
            return
        with open(self.out / "py-spy.log", "w") as log:
            spy = subprocess.Popen(
                [self.args.py_spy, "record", "--pid", str(self.sched), "--rate",
                 str(self.args.rate), "--duration", str(max(1, round(self.args.seconds))),
                 "--format", "raw", "--idle", "--threads", "--nonblocking",
                 "--output", str(self.out / "stacks.txt")],
                stdout=subprocess.DEVNULL, stderr=log,
            )  # fmt: skip
            self.summary = self._summary()
            try:
                self.summary["py_spy_rc"] = spy.wait(timeout=self.args.seconds + 30)
            except subprocess.TimeoutExpired:
                spy.kill()
                self.summary["py_spy_rc"] = "timed out"


async def _watched_level(
    url: str, prompts: list[Any], streams: int, hooks: _WatchWindow, args: argparse.Namespace,
    model: str,
) -> LevelLoad:  # fmt: skip
    async with make_client(url, streams) as http:
        # The window outlasts the watch a little, so the load never thins inside it.
        stop = StopRule(duration_s=args.seconds + 1.0, warmup_s=args.warmup)
        return await run_level(http, prompts, ClosedLoop(streams), stop, model=model, hooks=hooks)


def watch(args: argparse.Namespace) -> list[Path]:
    state = RunState.load(args.run_dir).data
    info = state["servers"].get(args.server)
    if not info:
        raise SystemExit(f"error: no server {args.server!r} in {args.run_dir}/state.json")
    if args.depth is not None and args.server != "spec":
        raise SystemExit("error: --depth needs --server spec (the plain server has no depths)")
    mine = session_pids(int(info["pid"]))
    sched = scheduler_pid(mine)
    key = state.get("admin_key")
    prompts = read_dataset(args.dataset, args.output_tokens or 128, args.output_tokens).prompts
    label = (
        "plain" if args.server != "spec" else f"d{args.depth}" if args.depth is not None else "spec"
    )
    written = []
    with ServerClient(info["url"], key) as server:
        model = server.model_id() or "default"
        before = server.state() if args.depth is not None else None
        try:
            if before is not None:
                server.push(single_depth_table(args.depth, version=before.version + 1))
            for streams in args.streams:
                out = args.out / f"{label}-c{streams}"
                out.mkdir(parents=True, exist_ok=True)
                hooks = _WatchWindow(out, mine, sched, args, server.scrape_or_none)
                load = asyncio.run(
                    _watched_level(info["url"], prompts, streams, hooks, args, model)
                )
                tok_per_s = round(load.tokens / max(load.elapsed_s, 1e-9), 1)
                summary = {**hooks.summary, "server": args.server, "label": label,
                           "streams": streams, "scheduler_pid": sched,
                           "tok_per_s": tok_per_s}  # fmt: skip
                (out / "host.json").write_text(json.dumps(summary, indent=1) + "\n")
                print(
                    f"{label} c={streams}: {summary['tok_per_s']:.0f} tok/s; machine "
                    f"{summary['machine_cpu_share']:.2f} CPUs busy, server "
                    f"{summary['server_cpu_share']:.2f}; {passes_line(summary)}; "
                    f"cgroup {summary['cgroup_change'] or 'n/a'}"
                )
                for row in summary["processes"][:6]:
                    flag = "*" if row["server"] else " "
                    print(f"  {flag} {row['cpu_share']:5.2f} {row['pid']:>7} {row['what'][:80]}")
                written.append(out)
        finally:
            if before is not None:
                server.push(before.table)
    return written


def passes_line(summary: dict[str, Any]) -> str:
    decode, prefill = summary.get("decode_passes"), summary.get("prefill_passes")
    if decode is None or prefill is None:
        return "passes unknown (no pass counter on /metrics)"
    return f"{decode} decode / {prefill} prefill passes"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu.host_watch",
                                 description=__doc__.split("\n\n")[0])  # fmt: skip
    ap.add_argument("--run-dir", type=Path, required=True, help="the harness run (state.json)")
    ap.add_argument("--server", default="spec", help="spec or plain (state.json's servers)")
    ap.add_argument("--depth", type=int, help="force this depth first (the spec server)")
    ap.add_argument("--streams", type=streams_option, default=[1, 4])
    ap.add_argument("--seconds", type=float, default=8.0, help="the watched window")
    ap.add_argument("--warmup", type=float, default=2.0, help="load before the window")
    ap.add_argument("--dataset", type=Path, required=True, help="prompts (JSONL)")
    ap.add_argument(
        "--output-tokens",
        type=int,
        default=None,
        help="fix every output length (default: the dataset's, else 128)",
    )
    ap.add_argument("--out", type=Path, required=True, help="folder for <label>-c<N>/")
    ap.add_argument("--py-spy", default=None, help="py-spy binary: sample the scheduler's stacks")
    ap.add_argument("--rate", type=int, default=400, help="py-spy samples per second")
    ap.add_argument("--top", type=int, default=15, help="processes listed, busiest first")
    args = ap.parse_args(argv)
    try:
        watch(args)
    except (ServerError, DatasetError, OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
