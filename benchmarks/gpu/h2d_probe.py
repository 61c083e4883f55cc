"""Does a small host-to-device copy from pageable memory block the host behind its stream?

SGLang 0.5.17's speculative decode preparation (`eagle_prepare_for_decode`) copies two lists
of per-request KV lengths to the GPU with `non_blocking=True` from ordinary (pageable) CPU
tensors, on the schedule stream, which the scheduler's write-after-read barrier has made wait
for the last forward. In the twentieth H200 run's stacks the first of the two copies took
30 samples at 4 streams and the second 5 (docs/h200-runs.md): as if the
first waited. A plain server's decode preparation has no such copy. This probe times the call
itself, the way the scheduler meets it:

    python -m benchmarks.gpu.h2d_probe [--wait-ms 3] [--sizes 4,128] [--repeats 40] [--json F]

For each size it times two like copies in a row, as SGLang makes them, from pageable and from
pinned memory, each on an idle stream and on a stream that waits (an event) for a busy side
stream, as the schedule stream waits for the forward. A copy that blocks the host behind its
stream shows the wait in the first copy's time, and the second then finds the stream clear.
It needs CUDA (exit status 2 without); what it prints is the median host microseconds per
copy, the first and (in brackets) the second.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

MODES = ("pageable", "pinned")


class Device(Protocol):
    """What the probe needs of a GPU; `CudaDevice` on a real one."""

    def hold_current_stream(self, ms: float) -> None:
        """Keep a side stream busy for about `ms` and make the current stream wait for it."""

    def copy(self, values: list[int], pinned: bool) -> None:
        """The copy as SGLang makes it: a CPU int32 tensor of `values`, `.to(device,
        non_blocking=True)` (from pinned memory when `pinned`)."""

    def synchronize(self) -> None: ...


class CudaDevice:
    def __init__(self) -> None:
        import torch

        self._torch = torch
        self._side = torch.cuda.Stream()
        self._cycles_per_ms = self._calibrate()

    def _calibrate(self) -> float:
        torch = self._torch
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        cycles = 10_000_000
        start.record()
        torch.cuda._sleep(cycles)
        stop.record()
        stop.synchronize()
        return cycles / max(start.elapsed_time(stop), 1e-3)

    def hold_current_stream(self, ms: float) -> None:
        torch = self._torch
        with torch.cuda.stream(self._side):
            torch.cuda._sleep(int(ms * self._cycles_per_ms))
            done = torch.cuda.Event()
            done.record()
        torch.cuda.current_stream().wait_event(done)

    def copy(self, values: list[int], pinned: bool) -> None:
        torch = self._torch
        host = torch.tensor(values, dtype=torch.int32, device="cpu")
        if pinned:
            host = host.pin_memory()
        host.to(device="cuda", non_blocking=True)

    def synchronize(self) -> None:
        self._torch.cuda.synchronize()


@dataclass(frozen=True)
class Cell:
    size: int
    mode: str  # pageable | pinned
    behind_wait: bool
    host_us: float  # median host time of the first copy call
    second_us: float  # of the like copy right after it
    samples: int


def probe(device: Device, sizes: Sequence[int], wait_ms: float, repeats: int,
          clock: Callable[[], float] = time.perf_counter) -> list[Cell]:
    cells = []
    for size in sizes:
        values = list(range(size))
        for mode in MODES:
            for behind in (False, True):
                firsts: list[float] = []
                seconds: list[float] = []
                for _ in range(repeats):
                    device.synchronize()
                    if behind:
                        device.hold_current_stream(wait_ms)
                    for times in (firsts, seconds):
                        tic = clock()
                        device.copy(values, pinned=mode == "pinned")
                        times.append(1e6 * (clock() - tic))
                device.synchronize()
                cells.append(Cell(size, mode, behind, statistics.median(firsts),
                                  statistics.median(seconds), repeats))
    return cells


def render(cells: Sequence[Cell], wait_ms: float) -> list[str]:
    lines = [f"host us per copy (median; the second copy in brackets), idle stream / stream "
             f"waiting {wait_ms:g} ms for another"]
    by = {(c.size, c.mode, c.behind_wait): c for c in cells}

    def cell(c: Cell) -> str:
        return f"{c.host_us:.0f} ({c.second_us:.0f})"

    for size in sorted({c.size for c in cells}):
        row = ", ".join(f"{mode} {cell(by[(size, mode, False)])} / {cell(by[(size, mode, True)])}"
                        for mode in MODES if (size, mode, False) in by)
        lines.append(f"  {size:5d} values: {row}")
    blocked = [c for c in cells if c.behind_wait and c.host_us > 500.0 * wait_ms]
    lines.append(
        "a copy waited for its stream: " + ", ".join(f"{c.mode} ({c.size} values)"
                                                      for c in blocked)
        if blocked else "no copy waited for its stream (each under half the wait)")
    return lines


def main(argv: list[str] | None = None, device: Device | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--wait-ms", type=float, default=3.0,
                    help="how long the side stream keeps the copy's stream waiting")
    ap.add_argument("--sizes", default="4,128", help="values per copy (requests), comma-separated")
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument("--json", type=Path, default=None, help="also write the cells as JSON")
    args = ap.parse_args(argv)
    try:
        sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        print(f"error: --sizes {args.sizes!r}: give counts such as 4,128", file=sys.stderr)
        return 2
    if not sizes or min(sizes) < 1 or args.repeats < 1 or args.wait_ms <= 0:
        print("error: --sizes, --repeats and --wait-ms must be positive", file=sys.stderr)
        return 2
    if device is None:
        try:
            import torch
        except ImportError:
            torch = None  # type: ignore[assignment]
        if torch is None or not torch.cuda.is_available():
            print("error: the probe needs a CUDA GPU (torch with CUDA); run it on the GPU "
                  "machine", file=sys.stderr)
            return 2
        device = CudaDevice()
    cells = probe(device, sizes, args.wait_ms, args.repeats)
    print("\n".join(render(cells, args.wait_ms)))
    if args.json:
        payload: dict[str, Any] = {"wait_ms": args.wait_ms,
                                   "cells": [asdict(c) for c in cells]}
        args.json.write_text(json.dumps(payload, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
