"""Run a command on a set of CPU cores: `python -m benchmarks.gpu.cpus 0-5 -- CMD ARGS...`.

The GPU harness starts each server through this (`--spec-cpus`, `--plain-cpus`) and its bench
client (`--bench-cpus`), so that the two servers' host loops and the client's load processes
do not take turns on the same cores. Every process the command starts inherits the set. At
64-128 streams both servers spent 1-3 ms per forward pass outside the decode forward, varying
from level to level (the fourteenth run); pinning takes shared cores out of that.
"""

from __future__ import annotations

import os
import sys


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


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) < 3 or args[1] != "--":
        print("usage: python -m benchmarks.gpu.cpus CPUS -- COMMAND [ARGS...]", file=sys.stderr)
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
