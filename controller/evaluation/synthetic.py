"""Counter samples straight from a profile's cost model: a fast test bed for the learners.

`SyntheticServer` runs decode iterations against `sims.profile.Profile.iteration_ms`, padded to
the CUDA-graph batch size as the engine charges it, with the profile's lognormal step noise and
chain acceptance sampled per request. It picks each iteration's depth with the contract's
`TierSelector` (so tables, hysteresis and exploration behave exactly as on a server) and returns
`Sample`s per (depth, bucket) per scrape interval. The batch size is imposed from outside (no
queueing, no prefill): that is the simulator engine's job; here the point is to test what the
models learn from a known ground truth, quickly."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from models.samples import Sample
from sglang_hooks.contract import PolicyTable, TierSelector, bs_bucket, single_depth_table
from sims.policies import graph_batch_sizes, pad_batches
from sims.profile import Profile

_MAX_BATCH = 1024


@dataclass
class SyntheticServer:
    profile: Profile
    table: PolicyTable
    seed: int = 0
    phase: str | None = None
    group: str = "synthetic"
    target: str = "synthetic-0"
    now: float = 0.0
    _rng: np.random.Generator = field(init=False, repr=False)
    _selector: TierSelector = field(init=False, repr=False)
    _cost: dict[int, np.ndarray] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.seed)
        self._selector = TierSelector(self.table, random.Random(self.seed))
        batch = np.arange(_MAX_BATCH + 1, dtype=float)
        batch[0] = 1.0
        padded = batch
        if self.profile.scheduler.cuda_graph_padding:
            # As the engine charges it: at the next CUDA-graph batch size, padding rows no KV.
            graphs = graph_batch_sizes(True, self.profile.max_running(True))
            padded = pad_batches(batch, graphs)
        ctx = self.profile.context_tokens * batch / padded
        self._cost = {
            d: np.asarray(self.profile.iteration_ms(d, padded, ctx))
            for d in self.profile.captured_depths
        }
        self.phase = self.phase or self.profile.acceptance.default_phase

    def set_table(self, table: PolicyTable) -> None:
        self.table = table
        self._selector.replace_table(table)

    def run(self, seconds: float, batch_at: Callable[[float], int]) -> list[Sample]:
        """Decode for `seconds` of simulated time; one Sample per (depth, bucket) touched."""
        assert self.phase is not None
        probs = self.profile.acceptance.phases[self.phase]
        sigma = math.sqrt(math.log1p(self.profile.step_time_cv**2))
        acc: dict[tuple[int, int], list[float]] = {}
        end = self.now + seconds
        while self.now < end:
            b = int(min(max(batch_at(self.now), 1), _MAX_BATCH))
            depth, probe = self._selector.select(b)
            step_s = (
                self._cost[depth][b] / 1000.0 * float(self._rng.lognormal(-(sigma**2) / 2, sigma))
            )
            alive, tokens = b, b
            for j in range(depth):
                alive = int(self._rng.binomial(alive, probs[j]))
                if alive == 0:
                    break
                tokens += alive
            row = acc.setdefault((depth, bs_bucket(b)), [0.0, 0.0, 0.0, 0.0, 0.0])
            row[0] += 1
            row[1] += b
            row[2] += tokens
            row[3] += step_s
            row[4] += 1.0 if probe else 0.0
            self.now += step_s
        return [
            Sample(
                group=self.group,
                target=self.target,
                t_end=float(self.now),
                interval_s=seconds,
                depth=d,
                bs_bucket=bucket,
                iterations=r[0],
                request_steps=r[1],
                tokens=r[2],
                gpu_seconds=float(r[3]),
                explore_iterations=r[4],
            )
            for (d, bucket), r in sorted(acc.items())
        ]


def sweep_samples(
    profile: Profile,
    batches: list[int],
    seconds_per_point: float,
    depths: list[int] | None = None,
    seed: int = 0,
    phase: str | None = None,
) -> list[Sample]:
    """Every depth at every batch size for `seconds_per_point` each: an offline sweep."""
    out: list[Sample] = []
    now = 0.0
    for i, d in enumerate(depths if depths is not None else profile.captured_depths):
        server = SyntheticServer(profile, single_depth_table(d), seed=seed + i, phase=phase)
        server.now = now
        for b in batches:
            out += server.run(seconds_per_point, _constant(b))
        now = server.now
    return out


def _constant(batch: int) -> Callable[[float], int]:
    return lambda _t: batch


def true_crossovers(
    profile: Profile, depths: list[int], top: int, phase: str | None = None
) -> list[tuple[int, int, float]]:
    """The cost model's own crossovers among `depths` over batch sizes 1..top (interpolated)."""
    from models.tiers import crossovers, runs_of

    grid = np.arange(1, top + 1, dtype=float)
    tok = {d: np.asarray(profile.decode_tok_per_s(d, grid, phase)) for d in depths}
    best = np.asarray(depths)[np.argmax(np.stack([tok[d] for d in depths]), axis=0)]
    return crossovers(runs_of(best), tok)
