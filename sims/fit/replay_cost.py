"""The second pass's measure of a profile: every level replayed with the bench's protocol, and
how far its figures land from the measured ones (log ratios, weighted, under a soft-L1 loss)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from sims.fit.bench_file import Level
from sims.fit.closed_form import TTFT_WEIGHT
from sims.fit.framing import shape_of
from sims.fit.pool import Replayer
from sims.fit.replay import Replayed
from sims.profile import Profile

ROBUST_SCALE = 0.05  # misfits beyond 5% count linearly, not squared (soft L1): outliers
MISSING = 3.0  # residual of a figure the replay could not produce (nothing finished)
# What the bench reports for its user (tok/s, TPOT) weighs most; the server's own figures
# (its GPU step, mean batch, mean time per token) tell the loop's parts apart at half that.
SERVER_WEIGHT = 0.5


def replay_all(
    profile: Profile,
    levels: Sequence[Level],
    limits: dict[str, int | None],
    *,
    seeds: Sequence[int] = (0,),
    replayer: Replayer | None = None,
) -> list[list[Replayed]]:
    """Each level replayed once per seed: result[seed index][level index]."""
    shapes = [shape_of(lv, limits[lv.source]) for lv in levels]
    runs = (replayer or Replayer()).run(
        profile, shapes * len(seeds), [s for s in seeds for _ in shapes]
    )
    return [runs[i * len(shapes) : (i + 1) * len(shapes)] for i in range(len(seeds))]


def _log_ratio(sim: float | None, measured: float | None) -> float | None:
    if measured is None or measured <= 0:
        return None
    if sim is None or sim <= 0:
        return MISSING
    return math.log(sim / measured)


def ttft_weights(level: Level) -> tuple[float, float]:
    """(client TTFT, server TTFT) weights. One stream's TTFT is its prefill plus fixed
    overheads, a direct measurement; with several, it also depends on how arrivals bunched
    into prefill batches, which the client's and the network's timing shape and a replay
    follows only on average. The client's TTFT, beside the server's own, mostly tells the
    client's extra time."""
    alone = level.concurrency == 1
    server = 1.0 if alone else 0.25
    if level.server_ttft_ms is None:
        return (TTFT_WEIGHT if alone else TTFT_WEIGHT / 2), 0.0
    return (0.25 if alone else 0.1), server


def replay_residuals(levels: Sequence[Level], sims: Sequence[Replayed]) -> list[float]:
    out: list[float] = []
    for lv, sim in zip(levels, sims, strict=True):
        client_w, server_w = ttft_weights(lv)
        spec = lv.depth is not None
        for r, w in (
            (_log_ratio(sim.tok_per_s, lv.tok_per_s), 1.0),
            (_log_ratio(sim.tpot_p50_ms, lv.tpot_p50_ms), 1.0),
            (_log_ratio(sim.step_ms, lv.step_ms if spec else None), SERVER_WEIGHT),
            (_log_ratio(sim.mean_batch, lv.mean_batch if spec else None), SERVER_WEIGHT),
            (_log_ratio(sim.server_itl_ms, lv.server_itl_ms), SERVER_WEIGHT),
            (_log_ratio(sim.ttft_p50_ms, lv.ttft_p50_ms), client_w),
            (_log_ratio(sim.server_ttft_ms, lv.server_ttft_ms), server_w),
        ):
            if r is not None:
                out.append(w * r)
    return out


def robust_cost(residuals: Sequence[float]) -> float:
    """The soft-L1 cost of `residuals` at ROBUST_SCALE (what least_squares minimises)."""
    z = (np.asarray(residuals, float) / ROBUST_SCALE) ** 2
    return float(np.sum(2.0 * (np.sqrt(1.0 + z) - 1.0)))


def replay_cost(
    profile: Profile,
    levels: Sequence[Level],
    limits: dict[str, int | None],
    seeds: Sequence[int],
    replayer: Replayer | None = None,
) -> float:
    """The mean over `seeds` of the levels' robust cost: with real acceptance a closed loop's
    figures vary between seeds (how requests bunch up), and a search must not follow one
    seed's luck."""
    per_seed = replay_all(profile, levels, limits, seeds=seeds, replayer=replayer)
    return float(np.mean([robust_cost(replay_residuals(levels, sims)) for sims in per_seed]))
