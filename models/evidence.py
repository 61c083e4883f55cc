"""Turn `Sample`s into decayed per-(depth, bucket) cells: the sufficient statistics of the models.

Every estimator in `models/` reads the same cells, so a fit over ~10^4 samples costs one
vectorised pass plus a regression on at most (depths x buckets) rows. Each sample enters with
weight 2 ** (-(now - t_end) / half_life): the step-cost model uses a long half-life (hardware is
stable), the acceptance model a short one (the workload drifts).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from models.samples import Sample


@dataclass(frozen=True)
class Cells:
    """Decayed counter sums, one row per (depth, bs_bucket) that has evidence."""

    depth: np.ndarray  # int
    bucket: np.ndarray  # int, lower edge
    iterations: np.ndarray
    request_steps: np.ndarray
    tokens: np.ndarray
    gpu_seconds: np.ndarray

    @property
    def mean_batch(self) -> np.ndarray:
        return self.request_steps / self.iterations

    @property
    def step_ms(self) -> np.ndarray:
        return 1000.0 * self.gpu_seconds / self.iterations

    def __len__(self) -> int:
        return int(self.depth.size)


def _valid(s: Sample) -> bool:
    if s.tree:  # a draft tree's counts say nothing of the chain depth of the same steps
        return False
    numbers = (s.t_end, s.iterations, s.request_steps, s.tokens, s.gpu_seconds)
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in numbers):
        return False
    if s.iterations <= 0 or s.request_steps < s.iterations or s.gpu_seconds <= 0:
        return False
    # A request emits at least its bonus token per iteration and at most depth + 1 tokens.
    return s.request_steps * 0.999 <= s.tokens <= s.request_steps * (s.depth + 1) * 1.001


def sample_arrays(samples: Sequence[Sample]) -> dict[str, np.ndarray]:
    """Column arrays of the usable samples (garbage rows dropped, see `_valid`)."""
    good = [s for s in samples if _valid(s)]
    return {
        "t_end": np.fromiter((s.t_end for s in good), float, len(good)),
        "depth": np.fromiter((s.depth for s in good), np.int64, len(good)),
        "bucket": np.fromiter((s.bs_bucket for s in good), np.int64, len(good)),
        "iterations": np.fromiter((s.iterations for s in good), float, len(good)),
        "request_steps": np.fromiter((s.request_steps for s in good), float, len(good)),
        "tokens": np.fromiter((s.tokens for s in good), float, len(good)),
        "gpu_seconds": np.fromiter((s.gpu_seconds for s in good), float, len(good)),
    }


def decay_weights(t_end: np.ndarray, now: float, half_life_s: float) -> np.ndarray:
    age = np.maximum(now - t_end, 0.0)  # samples from the "future" (clock skew) count as fresh
    return np.asarray(np.exp2(-age / half_life_s))


def aggregate(arrays: dict[str, np.ndarray], now: float, half_life_s: float) -> Cells:
    """Sum decayed counters per (depth, bucket)."""
    depth, bucket = arrays["depth"], arrays["bucket"]
    if depth.size == 0:
        empty_i = np.zeros(0, np.int64)
        empty = np.zeros(0)
        return Cells(empty_i, empty_i, empty, empty, empty, empty)
    w = decay_weights(arrays["t_end"], now, half_life_s)
    key = depth * 10_000 + bucket
    uniq, inv = np.unique(key, return_inverse=True)

    def total(values: np.ndarray) -> np.ndarray:
        return np.bincount(inv, weights=values, minlength=uniq.size)

    return Cells(
        depth=uniq // 10_000,
        bucket=uniq % 10_000,
        iterations=total(w * arrays["iterations"]),
        request_steps=total(w * arrays["request_steps"]),
        tokens=total(w * arrays["tokens"]),
        gpu_seconds=total(w * arrays["gpu_seconds"]),
    )
