"""Memory of a server while it runs: GPU memory through nvidia-smi, host RSS through /proc.

nvidia-smi runs as a separate process (no CUDA context in the harness). Per-process GPU
memory is matched to the server's session by pid; inside a container the pids nvidia-smi
reports may not be ours, so the device's total used memory is recorded too (the other server
on the GPU is idle while the stress runs, so a growth there is the speculative server's).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from benchmarks.gpu import gpu_info
from benchmarks.gpu.procs import session_pids, session_rss

MIB = 1024 * 1024


def gpu_used_mib() -> float | None:
    """Used memory summed over the visible GPUs."""
    rows = gpu_info.query("memory.used")
    if not rows:
        return None
    try:
        return sum(float(r[0]) for r in rows)
    except ValueError:
        return None


def gpu_process_mib(pids: set[int]) -> float | None:
    """GPU memory of the given pids, or None when nvidia-smi shows none of them."""
    rows = gpu_info.query("pid,used_memory", "compute-apps")
    if rows is None:
        return None
    total, seen = 0.0, False
    for row in rows:
        try:
            if int(row[0]) in pids:
                total += float(row[1])
                seen = True
        except (ValueError, IndexError):
            continue
    return total if seen else None


@dataclass
class MemorySample:
    t: float
    label: str
    gpu_used_mib: float | None
    gpu_server_mib: float | None
    rss_mib: float | None
    rss_by_process: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def sample(server_pid: int | None, label: str) -> MemorySample:
    rss: dict[int, tuple[str, int]] = {} if server_pid is None else session_rss(server_pid)
    pids = set(rss) if rss else (set() if server_pid is None else session_pids(server_pid))
    return MemorySample(
        t=time.time(),
        label=label,
        gpu_used_mib=gpu_used_mib(),
        gpu_server_mib=gpu_process_mib(pids) if pids else None,
        rss_mib=sum(b for _, b in rss.values()) / MIB if rss else None,
        rss_by_process={f"{pid} {name}": round(b / MIB, 1) for pid, (name, b) in rss.items()},
    )


@dataclass(frozen=True)
class Growth:
    metric: str
    first: float | None
    last: float | None
    peak: float | None
    limit: float

    @property
    def grew(self) -> float | None:
        return None if self.first is None or self.last is None else self.last - self.first

    @property
    def ok(self) -> bool | None:
        return None if self.grew is None else self.grew <= self.limit

    def describe(self) -> str:
        if self.grew is None:
            return f"{self.metric}: not measured"
        return (f"{self.metric}: {self.first:.0f} -> {self.last:.0f} MiB (peak {self.peak:.0f}, "
                f"{self.grew:+.0f} MiB; limit +{self.limit:g})")


def growth(samples: list[MemorySample], metric: str, limit_mib: float) -> Growth:
    """First vs last of the samples that measured `metric` (attribute name of MemorySample)."""
    values = [v for s in samples if (v := getattr(s, metric)) is not None]
    if not values:
        return Growth(metric, None, None, None, limit_mib)
    return Growth(metric, values[0], values[-1], max(values), limit_mib)
