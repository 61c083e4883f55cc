"""Per-iteration CPU work the SGLang plugin adds, measured in CPython.

One decode iteration costs the plugin: the depth choice (tier lookup with hysteresis and the
exploration draw, `SchedulerRuntime.choose`), and the result accounting (`record_result`:
batch-size bucket and five counter additions into plain lists; the prometheus export runs
once a second, not per iteration, and is timed separately here). The GPU-timing events are
not included: they are CUDA driver calls that cannot run on this machine (see docs/sglang.md).
Also timed, separately because it grows with the batch: the emitted-token count
(`hooks.emitted`), one pass over the batch's requests per result (stand-in requests with the
two members of SGLang's `Req` it reads, `is_retracted` and `finished_reason`).

Run: python benchmarks/plugin_overhead.py  (target: < 5 us per iteration)
"""

from __future__ import annotations

import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sglang_hooks.contract import PolicyTable, Tier
from sglang_hooks.gpu_timer import HostIntervalTimer
from sglang_hooks.runtime import SchedulerRuntime

TARGET_US = 5.0
N = 200_000


class _NoTimer(HostIntervalTimer):
    def seconds(self, token: Any) -> float | None:
        return 0.01


def _table() -> PolicyTable:
    return PolicyTable.build(
        [
            Tier(1, 3, explore_share=0.1, explore_depths=(1, 5)),
            Tier(8, 2, hysteresis=2, explore_share=0.1, explore_depths=(1, 3)),
            Tier(24, 1, hysteresis=4, explore_share=0.05, explore_depths=(0, 2)),
            Tier(64, 0, hysteresis=8, explore_share=0.05, explore_depths=(1,)),
        ],
        version=1,
    )


def _batch_sizes(n: int) -> list[int]:
    rng = random.Random(0)
    bs, out = 16, []
    for _ in range(n):  # a random walk over 1..256, like a server under changing load
        bs = min(256, max(1, bs + rng.choice((-2, -1, 0, 0, 1, 2))))
        out.append(bs)
    return out


def _per_iteration_us(rt: SchedulerRuntime, sizes: list[int]) -> float:
    choose, record = rt.choose, rt.record_result
    launch = (False, None)
    t0 = time.perf_counter()
    for bs in sizes:
        depth = choose(bs)
        record(depth if depth is not None else 3, bs, bs * 2, launch, 0.0)
    return (time.perf_counter() - t0) / len(sizes) * 1e6


class _Req:
    __slots__ = ("finished_reason", "is_retracted")

    def __init__(self) -> None:
        self.finished_reason = None
        self.is_retracted = False



def _emitted_us(batch_size: int, repeats: int = 20_000) -> float:
    from sglang_hooks.hooks import emitted

    reqs = [_Req() for _ in range(batch_size)]
    runs = [[1, 2, 3]] * batch_size
    t0 = time.perf_counter()
    for _ in range(repeats):
        emitted(reqs, runs)
    return (time.perf_counter() - t0) / repeats * 1e6


def main() -> None:
    sizes = _batch_sizes(N)
    rt = SchedulerRuntime(timer=_NoTimer())
    rt.activate({0, 1, 2, 3, 5}, _table())
    _per_iteration_us(rt, sizes[:20_000])  # warm-up
    runs = [_per_iteration_us(rt, sizes) for _ in range(5)]
    best, median = min(runs), sorted(runs)[len(runs) // 2]

    no_table = SchedulerRuntime(timer=_NoTimer())
    no_table.activate({0, 1, 2, 3, 5}, None)
    base = min(_per_iteration_us(no_table, sizes) for _ in range(3))

    from prometheus_client import CollectorRegistry

    from sglang_hooks.exporter import PrometheusExporter

    labels = {"model_name": "m", "engine_type": "unified", "tp_rank": 0, "pp_rank": 0,
              "moe_ep_rank": 0}
    exporter = PrometheusExporter(labels, registry=CollectorRegistry())
    exporter.export(rt)  # first export creates the label children
    _per_iteration_us(rt, sizes[:5000])
    t0 = time.perf_counter()
    exporter.export(rt)
    export_ms = (time.perf_counter() - t0) * 1e3
    cells = len(rt.counters.totals)

    print(f"python {platform.python_version()} on {platform.machine()}, "
          f"{N} iterations, batch sizes random-walking over 1..256")
    print(f"with a 4-tier table and exploration: median {median:.2f} us/iteration, "
          f"best {best:.2f} (target < {TARGET_US:.0f} us)")
    print(f"no table (SGLang's own choice, counting only): {base:.2f} us/iteration")
    print(f"prometheus export of {cells} (depth, bucket) cells, once a second: "
          f"{export_ms:.2f} ms (not in the per-iteration figure)")
    counts = ", ".join(f"{_emitted_us(b):.1f} us at batch {b}" for b in (1, 32, 128, 256))
    print(f"emitted-token count per result (grows with the batch): {counts}")
    print("result:", "PASS" if median < TARGET_US else "FAIL")


if __name__ == "__main__":
    main()
