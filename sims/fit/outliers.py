"""Levels a fit cannot reproduce: how far it misses each, and the reason an outlier is given.

A reason states what the bench measured against what the model, fitted to the other levels,
makes of it: the time per iteration between tokens beside the GPU step (the part outside the
timer is what the model puts in prefill stalls and the host floor), the step itself, and the
same series at more streams when this level was slower per iteration than they were (the
model's iteration grows with the batch, so no fit of it can be slower at fewer requests).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from sims.fit.bench_file import Level
from sims.fit.pool import Replayer
from sims.fit.replay_cost import replay_all
from sims.profile import Profile

OUTLIER_ERROR = 0.25  # a level the fit of the others misses by more than this is an outlier
TREND_BATCH = 1.5  # a level of this many times the requests ...
TREND_SLACK = 1.05  # ... that iterated in at most this times the time: not the model's trend


@dataclass(frozen=True)
class Outlier:
    level: Level
    reason: str


@dataclass(frozen=True)
class LevelError:
    level: Level
    tok_per_s: float  # simulated / measured - 1
    tpot: float | None
    sim_step_ms: float | None  # the replay's mean GPU step
    sim_per_token_ms: float | None  # the replay's mean time per token after the first

    @property
    def worst(self) -> float:
        return max(abs(self.tok_per_s), abs(self.tpot or 0.0))


def mean_of_known(values: Sequence[float | None]) -> float | None:
    """The mean of the values a replay produced (None where a seed produced none)."""
    got = [v for v in values if v is not None]
    return statistics.fmean(got) if got else None


def level_errors(
    profile: Profile,
    levels: Sequence[Level],
    limits: dict[str, int | None],
    replayer: Replayer,
    seeds: Sequence[int],
) -> list[LevelError]:
    """Each level replayed as the fit replays it (no step noise; the mean over `seeds`)."""
    quiet = profile.model_copy(update={"step_time_cv": 0.0})
    per_seed = replay_all(quiet, levels, limits, seeds=seeds, replayer=replayer)
    out = []
    for i, lv in enumerate(levels):
        runs = [sims[i] for sims in per_seed]
        tok = statistics.fmean(r.tok_per_s for r in runs)
        tpot = mean_of_known([r.tpot_p50_ms for r in runs])
        out.append(
            LevelError(
                lv,
                tok / lv.tok_per_s - 1.0,
                None if tpot is None or not lv.tpot_p50_ms else tpot / lv.tpot_p50_ms - 1.0,
                mean_of_known([r.step_ms for r in runs]),
                mean_of_known([r.server_itl_ms for r in runs]),
            )
        )
    return out


def per_iteration_ms(level: Level) -> float | None:
    """The server's time per iteration between tokens: its inter-token latency times the
    tokens an iteration emits per request."""
    per_token = level.server_itl_ms or level.tpot_p50_ms
    return None if per_token is None else per_token * (level.accept_length or 1.0)


def slower_than_more_streams(level: Level, others: Sequence[Level]) -> str | None:
    """The same series at `TREND_BATCH` times the requests or more that ran an iteration in
    at most `TREND_SLACK` times this one's time."""
    mine = per_iteration_ms(level)
    if mine is None:
        return None
    batch = level.mean_batch or level.concurrency
    for other in sorted(others, key=lambda o: -o.concurrency):
        theirs = per_iteration_ms(other)
        more = other.mean_batch or other.concurrency
        if (
            other.source == level.source
            and other.series == level.series
            and more >= TREND_BATCH * batch
            and theirs is not None
            and theirs <= TREND_SLACK * mine
        ):
            return (
                f"its time per iteration between tokens, {mine:.2f} ms at {batch:.0f} requests, "
                f"is about as long as at {other.concurrency} streams ({theirs:.2f} ms at "
                f"{more:.0f} requests), where the model's iteration grows with the batch"
            )
    return None


def outlier_reason(err: LevelError, levels: Sequence[Level]) -> str:
    """Why a level is set aside; `levels` are the bench's others (for the series' trend)."""
    lv = err.level
    parts = [
        f"the fit of the other levels misses it by {100 * err.tok_per_s:+.0f}% tok/s"
        + ("" if err.tpot is None else f" and {100 * err.tpot:+.0f}% TPOT")
    ]
    per_iteration = per_iteration_ms(lv)
    if lv.step_ms and lv.server_itl_ms and per_iteration is not None:
        text = (
            f"the server took {per_iteration:.2f} ms per iteration between tokens at a GPU step "
            f"of {lv.step_ms:.2f} ms ({per_iteration - lv.step_ms:.2f} ms outside the timer)"
        )
        if err.sim_step_ms is not None and err.sim_per_token_ms is not None:
            modelled = err.sim_per_token_ms * (lv.accept_length or 1.0)
            text += (
                f", where the model, fitted to the rest, has {modelled:.2f} ms at a step of "
                f"{err.sim_step_ms:.2f} ms ({modelled - err.sim_step_ms:.2f} ms outside)"
            )
        parts.append(text)
    trend = slower_than_more_streams(lv, levels)
    if trend is not None:
        parts.append(trend)
    return "; ".join(parts)
