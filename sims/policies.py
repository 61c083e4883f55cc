"""Per-iteration depth policies a simulated speculative server can run.

- `TablePolicy`: the contract's `TierSelector` over a pushed `PolicyTable` (what the plugin
  runs once the daemon has pushed a table), exploration draws included.
- `SGLangAdaptivePolicy`: our emulation of SGLang 0.5.23's own adaptive choice (per batch-size
  slots, each picking among candidate step counts by an EMA of accepted drafts with
  hysteresis). This is what a server runs before any table is pushed.
- `FixedDepthPolicy`: one depth always (a server started with a fixed `--speculative-num-steps`).

The oracle's policy lives in `sims.oracle`. A policy only sees the batch size (and, for the
adaptive one, the accepted drafts it gets back), exactly like the real scheduler.
"""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from sglang_hooks.contract import PolicyTable, TierSelector
from sglang_hooks.draft_shape import label


class DepthPolicy(Protocol):
    name: str
    # True when `observe` must be called after every iteration (it is skipped otherwise).
    wants_feedback: bool

    def select(self, batch_size: int) -> tuple[int, bool]:
        """(depth to run, whether this iteration is an exploration probe)."""
        ...

    def observe(self, batch_size: int, depth: int, accepted_drafts_sum: int) -> None:
        """Accepted drafts summed over the batch of the iteration just run."""
        ...


class FixedDepthPolicy:
    wants_feedback = False

    def __init__(self, depth: int) -> None:
        self.depth = depth
        self.name = f"fixed-d{depth}"

    def select(self, batch_size: int) -> tuple[int, bool]:
        return self.depth, False

    def observe(self, batch_size: int, depth: int, accepted_drafts_sum: int) -> None:
        return None


class TablePolicy:
    wants_feedback = False

    def __init__(self, table: PolicyTable, rng: random.Random) -> None:
        self.table = table
        self.selector = TierSelector(table, rng=rng)
        self.select = self.selector.select  # bound method: one call per iteration
        self.name = f"table-v{table.version}"

    def observe(self, batch_size: int, depth: int, accepted_drafts_sum: int) -> None:
        return None


# ----------------------------------------------------------------------------- SGLang adaptive


@dataclass(frozen=True)
class AdaptiveSlotConfig:
    candidate_steps: tuple[int, ...]
    up_hysteresis: float = 0.0
    down_hysteresis: float = -0.25
    ema_alpha: float = 0.2
    update_interval: int = 5
    warmup_batches: int = 10


# SGLang 0.5.23's default slots (srt/speculative/adaptive_spec_params.py), keyed by the lowest
# batch size a slot serves. Restated here as data; `ceiling_coeff` is 0 in every default slot.
SGLANG_DEFAULT_SLOTS: dict[int, AdaptiveSlotConfig] = {
    1: AdaptiveSlotConfig((1, 3, 5, 7), up_hysteresis=0.0, down_hysteresis=-0.25),
    8: AdaptiveSlotConfig((0, 1, 3), up_hysteresis=0.0, down_hysteresis=0.0),
    32: AdaptiveSlotConfig((0, 1), up_hysteresis=0.0, down_hysteresis=0.0),
    64: AdaptiveSlotConfig((0,), up_hysteresis=0.0, down_hysteresis=0.0),
}


def spec_cuda_graph_batch_sizes(max_bs: int) -> list[int]:
    """SGLang's default decode CUDA-graph batch sizes with speculation on (0.5.23)."""
    sizes = (
        list(range(1, 9))
        + list(range(10, 33, 2))
        + list(range(40, 65, 4))
        + list(range(72, 257, 8))
        + list(range(272, max_bs + 1, 16))
    )
    sizes = [s for s in sizes if s <= max_bs]
    if max_bs not in sizes:
        sizes.append(max_bs)
    return sorted(sizes)


def nospec_cuda_graph_batch_sizes(max_bs: int) -> list[int]:
    """SGLang's default decode CUDA-graph batch sizes without speculation (0.5.23)."""
    sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, max_bs + 1, 32)]
    sizes = [s for s in sizes if s <= max_bs]
    if max_bs not in sizes:
        sizes.append(max_bs)
    return sorted(sizes)


def pad_batches(batch: np.ndarray, graph_bs: list[int]) -> np.ndarray:
    """Each batch size padded up to the next CUDA-graph batch size (beyond the last: itself)."""
    b = np.asarray(batch, dtype=float)
    idx = np.searchsorted(graph_bs, b, side="left")
    top = np.asarray([*graph_bs, 0], dtype=float)[np.minimum(idx, len(graph_bs))]
    return np.where(idx < len(graph_bs), top, b)


def graph_batch_sizes(speculative: bool, max_bs: int) -> list[int]:
    if speculative:
        return spec_cuda_graph_batch_sizes(max_bs)
    return nospec_cuda_graph_batch_sizes(max_bs)


@dataclass
class _Slot:
    cfg: AdaptiveSlotConfig
    steps: int
    ema: float
    batches: int = 0

    def update(self, batch_size: int, accepted_sum: int) -> None:
        # EMA of accepted drafts per request, frozen while drafting is off.
        if self.steps > 0:
            a = self.cfg.ema_alpha
            self.ema = (1 - a) * self.ema + a * accepted_sum / batch_size
        self.batches += 1
        after_warmup = self.batches - self.cfg.warmup_batches
        if after_warmup > 0 and after_warmup % self.cfg.update_interval == 0:
            self._recompute()

    def _recompute(self) -> None:
        cands = self.cfg.candidate_steps
        idx = cands.index(self.steps)
        if self.steps == 0:
            # After an interval with drafting off, probe the smallest positive candidate.
            idx = min(idx + 1, len(cands) - 1)
            if cands[idx] > 0 and self.ema < 0:
                self.ema = float(cands[idx] - 1)
            self.steps = cands[idx]
            return
        start = idx
        while idx > 0:
            below = cands[idx - 1]
            threshold = (0.5 if below == 0 else below - 0.5) + self.cfg.down_hysteresis
            if self.ema <= threshold:
                idx -= 1
            else:
                break
        if idx == start:
            while idx < len(cands) - 1 and self.ema > cands[idx] - 0.5 + self.cfg.up_hysteresis:
                idx += 1
        self.steps = cands[idx]


@dataclass
class SGLangAdaptivePolicy:
    """SGLang's adaptive step choice, restricted to the depths the server captured.

    A default slot candidate the profile did not capture is replaced by the deepest captured
    depth below it (SGLang captures exactly the union of candidate steps; an operator capping
    depth at, say, 3 gets slot "1" = [1, 3]). The batch size is padded up to a CUDA-graph
    batch size before routing, as SGLang does.
    """

    initial_steps: int
    captured_depths: tuple[int, ...]
    max_batch: int
    slots_config: dict[int, AdaptiveSlotConfig] = field(
        default_factory=lambda: dict(SGLANG_DEFAULT_SLOTS)
    )
    name: str = "sglang-adaptive"
    wants_feedback: bool = True
    _slots: dict[int, _Slot] = field(init=False)
    _keys: list[int] = field(init=False)
    _route: list[int] = field(init=False)

    def __post_init__(self) -> None:
        captured = sorted(self.captured_depths)
        self._slots = {}
        for key, cfg in sorted(self.slots_config.items()):
            cands = sorted(
                {
                    max((d for d in captured if d <= s), default=captured[0])
                    for s in cfg.candidate_steps
                }
            )
            cfg = AdaptiveSlotConfig(
                tuple(cands),
                cfg.up_hysteresis,
                cfg.down_hysteresis,
                cfg.ema_alpha,
                cfg.update_interval,
                cfg.warmup_batches,
            )
            steps = self.initial_steps if self.initial_steps in cands else cands[len(cands) // 2]
            self._slots[key] = _Slot(cfg=cfg, steps=steps, ema=float(steps - 1))
        self._keys = sorted(self._slots)
        graph_bs = spec_cuda_graph_batch_sizes(self.max_batch)
        # Precomputed routing: batch size -> slot key (pad to graph bs, then largest key <=).
        self._route = [self._keys[0]]
        for bs in range(1, self.max_batch + 1):
            i = bisect.bisect_left(graph_bs, bs)
            padded = graph_bs[i] if i < len(graph_bs) else bs
            k = bisect.bisect_right(self._keys, padded) - 1
            self._route.append(self._keys[max(k, 0)])

    def _slot(self, batch_size: int) -> _Slot:
        key = self._route[batch_size] if batch_size < len(self._route) else self._keys[-1]
        return self._slots[key]

    def select(self, batch_size: int) -> tuple[int, bool]:
        return self._slot(batch_size).steps, False

    def observe(self, batch_size: int, depth: int, accepted_drafts_sum: int) -> None:
        self._slot(batch_size).update(batch_size, accepted_drafts_sum)

    def slot_steps(self) -> dict[int, int]:
        """Current depth of every slot (for /server_info and tests)."""
        return {k: s.steps for k, s in self._slots.items()}


class ShapeTablePolicy:
    """A pushed table on a shape server that switches among captured shapes (the plugin's
    `choose_shape`): the tier's shape, mapped to the engine lane that runs it."""

    wants_feedback = False

    def __init__(self, table: PolicyTable, rng: random.Random, lanes: dict[str, int]) -> None:
        missing = sorted({label(s) for t in table.tiers for s in (t.shape, *t.explore_shapes)}
                         - set(lanes))  # fmt: skip
        if missing:
            raise ValueError(f"table {table.describe()} runs {', '.join(missing)}, which the "
                             f"server did not capture (it has {', '.join(lanes)})")
        self.table = table
        self.selector = TierSelector(table, rng=rng)
        self._lane = {shape: lanes[label(shape)] for t in table.tiers
                      for shape in (t.shape, *t.explore_shapes)}  # fmt: skip
        self.name = f"table-v{table.version}"

    def select(self, batch_size: int) -> tuple[int, bool]:
        shape, explore = self.selector.select_shape(batch_size)
        return self._lane[shape], explore

    def observe(self, batch_size: int, depth: int, accepted_drafts_sum: int) -> None:
        return None
