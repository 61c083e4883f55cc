"""Per-(depth, batch-size bucket) decode counts, accumulated on the scheduler's hot path.

Plain Python lists in a dict: one `record` costs well under a microsecond, where a
multiprocess prometheus `inc()` costs several (it writes an mmap'd file). The exporter
drains the deltas into prometheus at a coarse cadence (see `exporter.py`).
"""

from __future__ import annotations

from typing import Any

from sglang_hooks.contract import BS_BUCKET_EDGES, COUNTER_FAMILIES, bs_bucket

# Index of each counter family inside a cell (same order as contract.COUNTER_FAMILIES).
ITERATIONS, REQUEST_STEPS, TOKENS, GPU_SECONDS, EXPLORE = range(len(COUNTER_FAMILIES))

# Batch size -> bucket lower edge, precomputed so the hot path does one list index.
_BUCKET_OF = [bs_bucket(max(b, 1)) for b in range(BS_BUCKET_EDGES[-1] + 1)]
_LAST_BUCKET = BS_BUCKET_EDGES[-1]


class DepthCounters:
    """Running totals and not-yet-exported deltas per (depth, bucket); a server that switches
    draft shapes keeps a second set keyed by a tree's label (`3x4x16`) in place of a depth."""

    __slots__ = ("pending", "totals")

    def __init__(self) -> None:
        self.pending: dict[tuple[Any, int], list[float]] = {}
        self.totals: dict[tuple[Any, int], list[float]] = {}

    def record(
        self, depth: int | str, batch_size: int, tokens: int, gpu_seconds: float, explore: bool
    ) -> None:
        bucket = _BUCKET_OF[batch_size] if batch_size <= _LAST_BUCKET else _LAST_BUCKET
        cell = self.pending.get((depth, bucket))
        if cell is None:
            cell = self.pending[(depth, bucket)] = [0.0, 0.0, 0.0, 0.0, 0.0]
        cell[0] += 1
        cell[1] += batch_size
        cell[2] += tokens
        cell[3] += gpu_seconds
        if explore:
            cell[4] += 1

    def drain(self) -> dict[tuple[Any, int], list[float]]:
        """Hand over the deltas since the last drain and fold them into `totals`."""
        out, self.pending = self.pending, {}
        for key, cell in out.items():
            total = self.totals.setdefault(key, [0.0] * len(cell))
            for i, v in enumerate(cell):
                total[i] += v
        return out
