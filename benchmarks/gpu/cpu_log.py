"""The machine's CPUs while benches run, cut by level: busy cores per group, busiest processes.

    python -m benchmarks.gpu.cpu_log record --out cpus.jsonl [--interval 1]   # until stopped
    python -m benchmarks.gpu.cpu_log levels cpus.jsonl DIR/series_1 ... \
        [--cores spec=0-5 --cores plain=6-11] [--json OUT]

`record` reads /proc every `--interval` seconds and writes a JSON line per interval: its end
(Unix seconds), its length, each CPU's busy share and the busiest processes' CPU shares.
`levels` takes the intervals whose middle falls inside each level's measured window
(bench.json's `window_start_unix`, `window_end_unix`) and gives the busy cores of each
`--cores` group and the busiest processes over the window.

Why: on the H200, depth 0's 128-stream level ran at 0.6-0.67 of the plain server's tok/s in
some benches and at 0.96-1.16 in others, on the same servers, with its pass slower both inside
and outside the GPU's timer. Each server is pinned to its own cores, so a busy neighbour on
the speculative server's cores would show here and nowhere in the bench.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.gpu.level_windows import WindowError, level_windows
from benchmarks.gpu.procs import all_cpu_seconds, cmdline, command_name

TOP = 6  # processes kept per interval


class CpuLogError(ValueError):
    """The log or an option cannot be read; the message names it and the fix."""


def cpu_jiffies() -> dict[int, tuple[int, int]]:
    """cpu -> (busy, total) jiffies since boot, from /proc/stat."""
    out = {}
    for line in Path("/proc/stat").read_text().splitlines():
        name, *values = line.split()
        if not name.startswith("cpu") or name == "cpu":
            continue
        ticks = [int(v) for v in values]
        idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)  # idle + iowait
        out[int(name[3:])] = (sum(ticks) - idle, sum(ticks))
    return out


def record(out: Path, interval: float, stop: threading.Event) -> int:
    """Append a line per interval to `out` until `stop` is set; returns the lines written."""
    written = 0
    cpus0, procs0, t0 = cpu_jiffies(), all_cpu_seconds(), time.time()
    with out.open("a") as f:
        while not stop.wait(interval):
            cpus1, procs1, t1 = cpu_jiffies(), all_cpu_seconds(), time.time()
            seconds = t1 - t0
            busy = {
                cpu: round((b1 - cpus0[cpu][0]) / max(total1 - cpus0[cpu][1], 1), 3)
                for cpu, (b1, total1) in cpus1.items() if cpu in cpus0
            }  # fmt: skip
            used = {pid: s - procs0.get(pid, 0.0) for pid, s in procs1.items()}
            busiest = sorted(used.items(), key=lambda kv: -kv[1])[:TOP]
            top = [[short_label(pid), round(s / seconds, 3)] for pid, s in busiest if s > 0]
            f.write(json.dumps({"unix": round(t1, 3), "seconds": round(seconds, 3),
                                "cpu_busy": busy, "top": top}) + "\n")  # fmt: skip
            f.flush()
            written += 1
            cpus0, procs0, t0 = cpus1, procs1, t1
    return written


def short_label(pid: int, width: int = 80) -> str:
    """The process's name and command line, the middle cut out where it is long: an
    interpreter's path and the script it runs both stay."""
    line, name = " ".join(cmdline(pid).split()), command_name(pid)
    label = f"{name}: {line}" if line and not line.startswith(name) else line or name
    if len(label) <= width:
        return label
    head = width // 3
    return label[:head] + "..." + label[-(width - head - 3):]


@dataclass(frozen=True)
class LevelCpus:
    bench: str
    series: str
    concurrency: int
    intervals: int
    busy: dict[str, float]  # group -> busy cores, mean over the intervals
    top: list[tuple[str, float]]  # (process, CPU share) over the window, busiest first


def read_log(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text().splitlines()
    except OSError as err:
        raise CpuLogError(f"{path}: cannot read the CPU log ({err})") from None
    entries = []
    for n, line in enumerate(lines, 1):
        try:
            entry = json.loads(line)
            entries.append({"unix": float(entry["unix"]), "seconds": float(entry["seconds"]),
                            "cpu_busy": {int(k): float(v) for k, v in entry["cpu_busy"].items()},
                            "top": [(str(a), float(b)) for a, b in entry["top"]]})  # fmt: skip
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            raise CpuLogError(
                f"{path}, line {n}: not a line `cpu_log record` writes; record the log again"
            ) from None
    if not entries:
        raise CpuLogError(f"{path}: no intervals in it; was `cpu_log record` running?")
    return entries


def core_groups(specs: list[str]) -> dict[str, set[int]]:
    """`name=0-5,8` -> {name: {0, 1, 2, 3, 4, 5, 8}}."""
    groups: dict[str, set[int]] = {}
    for spec in specs:
        name, sep, cores = spec.partition("=")
        try:
            if not sep or not name:
                raise ValueError
            found: set[int] = set()
            for part in cores.split(","):
                lo, _, hi = part.partition("-")
                found |= set(range(int(lo), int(hi or lo) + 1))
        except ValueError:
            raise CpuLogError(f"--cores {spec!r}: give NAME=CORES, e.g. spec=0-5") from None
        groups[name] = found
    return groups


def levels(entries: list[dict[str, Any]], bench_dir: Path,
           groups: dict[str, set[int]]) -> list[LevelCpus]:  # fmt: skip
    out = []
    for w in level_windows(bench_dir):
        # An interval counts for the window that holds its middle: one level's at most.
        inside = [e for e in entries if w.holds(e["unix"] - e["seconds"] / 2)]
        busy = {
            name: round(sum(sum(e["cpu_busy"].get(c, 0.0) for c in cores) for e in inside)
                        / len(inside), 2) if inside else 0.0
            for name, cores in groups.items()
        }  # fmt: skip
        seconds = sum(e["seconds"] for e in inside)
        by_process: dict[str, float] = defaultdict(float)
        for e in inside:
            for label, share in e["top"]:
                by_process[label] += share * e["seconds"]
        top = sorted(((k, round(v / seconds, 2)) for k, v in by_process.items()),
                     key=lambda kv: -kv[1])[:3] if seconds else []  # fmt: skip
        out.append(LevelCpus(w.bench, w.series, w.concurrency, len(inside), busy, top))
    return out


def render(rows: list[LevelCpus], groups: dict[str, set[int]]) -> str:
    names = list(groups)
    head = ["bench", "series", "streams", "intervals", *(f"{n} busy" for n in names),
            "busiest processes (CPUs)"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        top = "; ".join(f"{label} {share:g}" for label, share in r.top)
        cells = [r.bench, r.series, str(r.concurrency), str(r.intervals),
                 *(f"{r.busy[n]:g}" for n in names), top]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="append CPU intervals to a log until stopped")
    rec.add_argument("--out", type=Path, required=True)
    rec.add_argument("--interval", type=float, default=1.0, help="seconds an interval")
    lev = sub.add_parser("levels", help="cut a log by the levels of bench folders")
    lev.add_argument("log", type=Path)
    lev.add_argument("benches", type=Path, nargs="+", help="bench folders (with bench.json)")
    lev.add_argument("--cores", action="append", default=[], metavar="NAME=CORES",
                     help="a group of cores to sum, e.g. spec=0-5 (repeatable)")  # fmt: skip
    lev.add_argument("--json", type=Path, default=None, help="also write the rows as JSON")
    args = parser.parse_args(argv)
    if args.command == "record":
        if args.interval <= 0:
            parser.error(f"--interval {args.interval}: give a positive number of seconds")
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        record(args.out, args.interval, stop)
        return 0
    try:
        groups = core_groups(args.cores)
        entries = read_log(args.log)
        rows = [row for bench in args.benches for row in levels(entries, bench, groups)]
    except (CpuLogError, WindowError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(render(rows, groups))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
