"""Run a command on a set of CPU cores: `python -m benchmarks.gpu.cpus 0-5 -- CMD ARGS...`.

`python -m benchmarks.gpu.cpus repin SESSION 6-11` moves a running server, every thread of
every process in its session (the harness starts each server as a session leader, so SESSION
is its pid in state.json), to other cores without a restart: a paired series can then swap
the two servers' cores, to tell whether a slow level follows the server or the cores.

The GPU harness starts each server through this (`--spec-cpus`, `--plain-cpus`) and the
session script its bench client (`BENCH_CPUS`), so that the two servers' host loops and the
client's load processes do not take turns on the same cores. Every process the command starts
inherits the set. At 64-128 streams both servers on the H200 spent 1-3 ms per forward pass
outside the decode forward, varying from level to level (the fourteenth run); pinning is the
test of whether sharing cores is what varies.
"""

from __future__ import annotations

import os
import sys

from benchmarks.gpu.procs import pid_alive, session_pids


class CpuListError(ValueError):
    """A CPU list that cannot be used; the message names it and the fix."""


def parse_cpu_list(text: str, option: str = "cpus") -> frozenset[int]:
    """`0-5,8,10-11` as a set of core numbers, each one this process may run on."""
    cpus: set[int] = set()
    for part in (p.strip() for p in text.split(",")):
        low, sep, high = part.partition("-")
        try:
            first, last = int(low), int(high) if sep else int(low)
        except ValueError:
            raise CpuListError(f"--{option}: expected core numbers and ranges like 0-5,8, got "
                               f"{text!r}") from None
        if first < 0 or last < first:
            raise CpuListError(f"--{option}: {part!r} is not a range of cores (low-high, "
                               f"both >= 0)")
        cpus.update(range(first, last + 1))
    allowed = os.sched_getaffinity(0)
    missing = sorted(cpus - allowed)
    if missing:
        raise CpuListError(f"--{option}: core {missing[0]} is not available here; this "
                           f"machine allows {_ranges(allowed)}")
    return frozenset(cpus)


def _ranges(cpus: set[int] | frozenset[int]) -> str:
    """{0, 1, 2, 5} as 0-2,5."""
    out: list[str] = []
    for cpu in sorted(cpus):
        if out and out[-1].split("-")[-1] == str(cpu - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{cpu}"
        else:
            out.append(str(cpu))
    return ",".join(out)


def pinned_argv(cpus: str, argv: list[str], python: str = sys.executable) -> list[str]:
    """`argv` started on `cpus` through this module (unchanged when `cpus` is empty)."""
    if not cpus:
        return argv
    return [python, "-m", "benchmarks.gpu.cpus", cpus, "--", *argv]


def repin_session(session: int, cpus: frozenset[int]) -> tuple[int, int]:
    """Every thread of every live process in `session` on `cpus`: (processes, threads) moved.
    A thread or process that ends meanwhile is passed over."""
    processes = threads = 0
    for pid in sorted(session_pids(session)):
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            continue  # ended since the scan
        moved = 0
        for tid in tids:
            try:
                os.sched_setaffinity(tid, cpus)
                moved += 1
            except (ProcessLookupError, FileNotFoundError):
                continue
        processes += moved > 0
        threads += moved
    return processes, threads


def _repin(args: list[str]) -> int:
    usage = "usage: python -m benchmarks.gpu.cpus repin SESSION CPUS"
    if len(args) != 2 or not args[0].isdigit():
        print(f"{usage} (SESSION: a session leader's pid, e.g. a server's pid in the "
              f"harness's state.json)", file=sys.stderr)
        return 2
    session = int(args[0])
    try:
        cpus = parse_cpu_list(args[1])
    except CpuListError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if not pid_alive(session):
        print(f"error: no process {session}; give a running server's pid (state.json)",
              file=sys.stderr)
        return 2
    processes, threads = repin_session(session, cpus)
    if not threads:
        print(f"error: session {session} has no live process to move (is {session} a session "
              f"leader? the harness starts each server as one)", file=sys.stderr)
        return 1
    print(f"moved {threads} threads of {processes} processes (session {session}) to cores "
          f"{_ranges(cpus)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["repin"]:
        return _repin(args[1:])
    if len(args) < 3 or args[1] != "--":
        print("usage: python -m benchmarks.gpu.cpus CPUS -- COMMAND [ARGS...]\n"
              "       python -m benchmarks.gpu.cpus repin SESSION CPUS", file=sys.stderr)
        return 2
    try:
        cpus = parse_cpu_list(args[0])
    except CpuListError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    os.sched_setaffinity(0, cpus)
    try:
        os.execvp(args[2], args[2:])  # the same pid: the harness's records stay right
    except OSError as err:
        print(f"error: cannot run {args[2]!r}: {err}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
