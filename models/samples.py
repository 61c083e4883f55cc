"""The unit of evidence: counter deltas of one (depth, batch-size bucket) over one interval.

Produced by the daemon's scraper from the contract's per-depth counters, stored in SQLite,
consumed by the learners. Every rate the models use is an exact ratio of these deltas:

    step time      = gpu_seconds / iterations
    mean batch     = request_steps / iterations
    accept length  = tokens / request_steps          (tokens per request per iteration)
    decode tok/s   = tokens / gpu_seconds

A shape server's draft trees are counted by shape (`specctl_tree_*`): their samples carry the
tree's label and its steps as the depth. The learners model chain depths and off only and
read `chain_samples`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Sample:
    group: str  # targets declared as the same hardware+model share a group and one model
    target: str
    t_end: float  # seconds (wall clock, or the simulator's clock) at the end of the interval
    interval_s: float
    depth: int
    bs_bucket: int  # lower edge, see sglang_hooks.contract.BS_BUCKET_EDGES
    iterations: float
    request_steps: float
    tokens: float
    gpu_seconds: float
    explore_iterations: float = 0.0
    tree: str = ""  # a draft tree's label (`3x4x16`); empty for a chain depth or off

    @property
    def mean_batch(self) -> float:
        return self.request_steps / self.iterations

    @property
    def step_s(self) -> float:
        return self.gpu_seconds / self.iterations

    @property
    def accept_length(self) -> float:
        return self.tokens / self.request_steps

    @property
    def tok_per_s(self) -> float:
        return self.tokens / self.gpu_seconds


def chain_samples(samples: Iterable[Sample]) -> list[Sample]:
    """The samples of chain depths and off: what a depth model may learn from."""
    return [s for s in samples if not s.tree]
