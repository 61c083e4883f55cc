"""The machine's CPUs while benches run, cut by level: busy cores per group, busiest processes.

    python -m benchmarks.gpu.cpu_log record --out cpus.jsonl [--interval 1]   # until stopped
    python -m benchmarks.gpu.cpu_log levels cpus.jsonl DIR/series_1 ... \
        [--cores spec=0-5 --cores plain=6-11] [--json OUT]

`record` reads /proc every `--interval` seconds and writes a JSON line per interval: its end
(Unix seconds), its length, each CPU's busy share, the part of it spent in interrupts and the
part the hypervisor took for other guests (steal), each CPU's clock at the interval's end (the
kernel's cpufreq reading, else /proc/cpuinfo's, which a virtual machine may hold at the
nominal clock) and the busiest processes' CPU shares. `levels` takes the intervals whose
middle falls inside each level's measured window (bench.json's `window_start_unix`,
`window_end_unix`) and gives the busy cores of each `--cores` group, with their interrupt and
steal time and their mean clock, the group's busiest core (where a server's scheduler, its
one thread that runs flat out, sat) and the busiest processes over the window.

Why: on the H200, depth 0's 128-stream level ran at 0.6-0.67 of the plain server's tok/s in
some benches and at 0.96-1.16 in others, on the same servers, with its pass slower both inside
and outside the GPU's timer. Each server is pinned to its own cores, so a busy neighbour on
the speculative server's cores would show here and nowhere in the bench; and over a long run
both servers' host work slowed, which cores that clock down would explain.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from benchmarks.gpu.level_windows import WindowError, level_windows
from benchmarks.gpu.procs import all_cpu_seconds, cmdline, command_name

TOP = 6  # processes kept per interval
SHARE_KEYS = ("cpu_busy", "cpu_irq", "cpu_steal")


class CpuLogError(ValueError):
    """The log or an option cannot be read; the message names it and the fix."""


class Ticks(NamedTuple):
    """One CPU's jiffies since boot (/proc/stat)."""

    busy: int  # everything but idle and iowait
    total: int
    irq: int  # hard and soft interrupts: a device's work landing on this core
    steal: int  # time the hypervisor gave this virtual CPU's turn to another guest


def parse_stat(text: str) -> dict[int, Ticks]:
    """cpu -> Ticks from /proc/stat's text. Guest time is already inside user and nice, so only
    the first eight fields count (user nice system idle iowait irq softirq steal)."""
    out = {}
    for line in text.splitlines():
        name, *values = line.split()
        if not name.startswith("cpu") or name == "cpu":
            continue
        ticks = ([int(v) for v in values[:8]] + [0] * 8)[:8]
        total = sum(ticks)
        out[int(name[3:])] = Ticks(total - ticks[3] - ticks[4], total, ticks[5] + ticks[6],
                                   ticks[7])  # fmt: skip
    return out


def cpu_jiffies() -> dict[int, Ticks]:
    return parse_stat(Path("/proc/stat").read_text())


def parse_cpuinfo_mhz(text: str) -> dict[int, float]:
    """cpu -> MHz from /proc/cpuinfo's text (a `processor` line, then its `cpu MHz`)."""
    out: dict[int, float] = {}
    cpu: int | None = None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        try:
            if key == "processor":
                cpu = int(value)
            elif key == "cpu MHz" and cpu is not None:
                out[cpu] = round(float(value), 1)
        except ValueError:
            continue
    return out


CPUFREQ = Path("/sys/devices/system/cpu")


def cpu_mhz(root: Path = CPUFREQ, cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[int, float]:
    """Each CPU's clock now: the kernel's cpufreq reading (`scaling_cur_freq`, kHz) where the
    machine exposes one, else /proc/cpuinfo's; {} where neither reads."""
    out: dict[int, float] = {}
    for path in root.glob("cpu[0-9]*/cpufreq/scaling_cur_freq"):
        try:
            out[int(path.parent.parent.name[3:])] = round(int(path.read_text()) / 1000, 1)
        except (OSError, ValueError):
            continue
    if out:
        return out
    try:
        return parse_cpuinfo_mhz(cpuinfo.read_text())
    except OSError:
        return {}


def shares(before: dict[int, Ticks], after: dict[int, Ticks]) -> dict[str, dict[int, float]]:
    """Each CPU's busy, interrupt and steal share of the interval between two readings."""
    out: dict[str, dict[int, float]] = {key: {} for key in SHARE_KEYS}
    for cpu, b in after.items():
        a = before.get(cpu)
        if a is None:
            continue
        total = max(b.total - a.total, 1)
        for key, now, then in zip(SHARE_KEYS, (b.busy, b.irq, b.steal), (a.busy, a.irq, a.steal),
                                  strict=True):  # fmt: skip
            out[key][cpu] = round((now - then) / total, 3)
    return out


def record(out: Path, interval: float, stop: threading.Event) -> int:
    """Append a line per interval to `out` until `stop` is set; returns the lines written."""
    written = 0
    cpus0, procs0, t0 = cpu_jiffies(), all_cpu_seconds(), time.time()
    with out.open("a") as f:
        while not stop.wait(interval):
            cpus1, procs1, t1 = cpu_jiffies(), all_cpu_seconds(), time.time()
            seconds = t1 - t0
            used = {pid: s - procs0.get(pid, 0.0) for pid, s in procs1.items()}
            busiest = sorted(used.items(), key=lambda kv: -kv[1])[:TOP]
            top = [[short_label(pid), round(s / seconds, 3)] for pid, s in busiest if s > 0]
            f.write(json.dumps({"unix": round(t1, 3), "seconds": round(seconds, 3),
                                **shares(cpus0, cpus1), "cpu_mhz": cpu_mhz(),
                                "top": top}) + "\n")  # fmt: skip
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
    irq: dict[str, float]  # group -> cores' worth of interrupt handling (in busy)
    steal: dict[str, float]  # group -> cores' worth of time the hypervisor took (in busy)
    top: list[tuple[str, float]]  # (process, CPU share) over the window, busiest first
    mhz: dict[str, float | None] = field(default_factory=dict)  # group -> mean clock (None: unread)
    # group -> (core, its busy share): where a server's one pegged thread, its scheduler, ran
    # (in the twenty-sixth run every 128-stream level with depth 0's on core 3 was slow);
    # None: no interval
    busiest_core: dict[str, tuple[int, float] | None] = field(default_factory=dict)


def read_log(path: Path) -> list[dict[str, Any]]:
    try:
        lines = path.read_text().splitlines()
    except OSError as err:
        raise CpuLogError(f"{path}: cannot read the CPU log ({err})") from None
    entries = []
    for n, line in enumerate(lines, 1):
        try:
            entry = json.loads(line)
            if not entry["cpu_busy"]:
                raise KeyError("cpu_busy")
            entries.append({
                "unix": float(entry["unix"]), "seconds": float(entry["seconds"]),
                # Logs recorded before the interrupt and steal shares lack them: zeros.
                **{key: {int(k): float(v) for k, v in entry.get(key, {}).items()}
                   for key in SHARE_KEYS},
                # Logs recorded before clocks were read lack them: none.
                "cpu_mhz": {int(k): float(v) for k, v in entry.get("cpu_mhz", {}).items()},
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


def _group_cores(inside: list[dict[str, Any]], key: str,
                 groups: dict[str, set[int]]) -> dict[str, float]:
    """Per group, its cores' `key` shares summed, the mean over the intervals."""
    return {
        name: round(sum(sum(e[key].get(c, 0.0) for c in members) for e in inside)
                    / len(inside), 2) if inside else 0.0
        for name, members in groups.items()
    }  # fmt: skip


def _group_mhz(inside: list[dict[str, Any]], groups: dict[str, set[int]]
               ) -> dict[str, float | None]:
    """Per group, the mean clock of its cores over the intervals (None: no reading)."""
    out: dict[str, float | None] = {}
    for name, members in groups.items():
        seen = [e["cpu_mhz"][c] for e in inside for c in members if c in e["cpu_mhz"]]
        out[name] = round(sum(seen) / len(seen)) if seen else None
    return out


def _busiest_core(inside: list[dict[str, Any]], groups: dict[str, set[int]]
                  ) -> dict[str, tuple[int, float] | None]:
    """Per group, the core busiest over the intervals, with its mean busy share."""
    out: dict[str, tuple[int, float] | None] = {}
    for name, members in groups.items():
        means = {c: sum(e["cpu_busy"].get(c, 0.0) for e in inside) / len(inside)
                 for c in members} if inside else {}  # fmt: skip
        core = max(sorted(means), key=lambda c: means[c], default=None)
        out[name] = None if core is None else (core, round(means[core], 2))
    return out


def levels(entries: list[dict[str, Any]], bench_dir: Path,
           groups: dict[str, set[int]]) -> list[LevelCpus]:  # fmt: skip
    out = []
    for w in level_windows(bench_dir):
        # An interval counts for the window that holds its middle: one level's at most.
        inside = [e for e in entries if w.holds(e["unix"] - e["seconds"] / 2)]
        seconds = sum(e["seconds"] for e in inside)
        by_process: dict[str, float] = defaultdict(float)
        for e in inside:
            for label, share in e["top"]:
                by_process[label] += share * e["seconds"]
        top = sorted(((k, round(v / seconds, 2)) for k, v in by_process.items()),
                     key=lambda kv: -kv[1])[:3] if seconds else []  # fmt: skip
        busy, irq, steal = (_group_cores(inside, key, groups) for key in SHARE_KEYS)
        out.append(LevelCpus(w.bench, w.series, w.concurrency, len(inside), busy, irq, steal,
                             top, _group_mhz(inside, groups), _busiest_core(inside, groups)))
    return out


def _core_cell(busiest: tuple[int, float] | None) -> str:
    return "-" if busiest is None else f"{busiest[0]} ({busiest[1]:g})"


def render(rows: list[LevelCpus], groups: dict[str, set[int]]) -> str:
    names = list(groups)
    clocked = [n for n in names if any(r.mhz.get(n) is not None for r in rows)]
    head = ["bench", "series", "streams", "intervals",
            *(f"{n} busy (irq, steal)" for n in names), *(f"{n} MHz" for n in clocked),
            *(f"{n} busiest core" for n in names), "busiest processes (CPUs)"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        top = "; ".join(f"{label} {share:g}" for label, share in r.top)
        cells = [r.bench, r.series, str(r.concurrency), str(r.intervals),
                 *(f"{r.busy[n]:g} ({r.irq[n]:g}, {r.steal[n]:g})" for n in names),
                 *(str(r.mhz.get(n) or "-") for n in clocked),
                 *(_core_cell(r.busiest_core.get(n)) for n in names), top]  # fmt: skip
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
