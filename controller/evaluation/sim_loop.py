"""The learner in closed loop with the simulator engine, without the daemon in between.

Every `scrape_s` simulated seconds: difference the engine's per-(depth, bucket) counters into
`Sample`s (exactly what the daemon's scraper stores), refit, propose, and install the proposed
table. Used to validate and tune the models on the engine's own counters, and by the
comparison benchmark; `specctl sim evaluate` measures the whole system, daemon included.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from models.learner import Learner, LearnerConfig, Proposal
from models.samples import Sample
from sglang_hooks.contract import PolicyTable, single_depth_table
from sims.engine import Engine
from sims.policies import TablePolicy
from sims.profile import Profile
from sims.workload import Scenario


@dataclass
class LoopResult:
    duration_s: float
    tokens: int  # every output token (prefill first tokens included)
    decode_tokens: int
    decode_gpu_seconds: float
    iterations: int
    explore_iterations: int
    proposals: list[tuple[float, Proposal]] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)

    @property
    def tok_per_s(self) -> float:
        return self.tokens / self.duration_s

    @property
    def explore_share(self) -> float:
        return self.explore_iterations / max(self.iterations, 1)


def counter_samples(
    now: float,
    interval_s: float,
    counters: dict[tuple[int, int], list[float]],
    previous: dict[tuple[int, int], list[float]],
) -> list[Sample]:
    """Samples from two snapshots of the engine's cumulative counters."""
    out = []
    for (depth, bucket), c in sorted(counters.items()):
        p = previous.get((depth, bucket), [0.0] * 5)
        d = [a - b for a, b in zip(c, p, strict=True)]
        if d[0] <= 0:
            continue
        out.append(
            Sample(
                group="sim",
                target="sim-0",
                t_end=now,
                interval_s=interval_s,
                depth=depth,
                bs_bucket=bucket,
                iterations=d[0],
                request_steps=d[1],
                tokens=d[2],
                gpu_seconds=d[3],
                explore_iterations=d[4],
            )
        )
    return out


def run_learner_loop(
    profile: Profile,
    scenario: Scenario,
    *,
    seed: int = 0,
    scrape_s: float = 5.0,
    config: LearnerConfig | None = None,
    initial: PolicyTable | None = None,
    duration_s: float | None = None,
    on_scrape: Callable[[float, Learner, Proposal], None] | None = None,
) -> LoopResult:
    """Run `scenario` with the learner choosing the table every `scrape_s` seconds."""
    table = initial or single_depth_table(profile.full_depth)
    engine = Engine(
        profile, scenario.workload, seed=seed, policy=TablePolicy(table, random.Random(seed))
    )
    learner = Learner(profile.captured_depths, config, seed=seed)
    end = duration_s or scenario.duration_s
    samples: list[Sample] = []
    proposals: list[tuple[float, Proposal]] = []
    previous: dict[tuple[int, int], list[float]] = {}
    t = 0.0
    while t < end:
        t = min(t + scrape_s, end)
        engine.run_until(t)
        now = engine.now
        fresh = counter_samples(now, scrape_s, engine.counters, previous)
        previous = {k: list(v) for k, v in engine.counters.items()}
        samples += fresh
        learner.fit(samples, now)
        hist = {s.bs_bucket: s.iterations for s in fresh}
        proposal = learner.propose(now, table, hist or None)
        if proposal.table.tiers != table.tiers:
            table = proposal.table
            engine.set_policy(TablePolicy(table, engine.policy_rng))
        proposals.append((now, proposal))
        if on_scrape is not None:
            on_scrape(now, learner, proposal)
    return _result(engine, proposals=proposals, samples=samples)


def run_static(
    profile: Profile,
    scenario: Scenario,
    table: PolicyTable,
    *,
    seed: int = 0,
    duration_s: float | None = None,
) -> LoopResult:
    """Run `scenario` under one fixed table (a static policy, or the oracle's table)."""
    engine = Engine(
        profile, scenario.workload, seed=seed, policy=TablePolicy(table, random.Random(seed))
    )
    engine.run_until(duration_s or scenario.duration_s)
    return _result(engine)


def _result(engine: Engine, **extra: Any) -> LoopResult:
    """The engine's totals as a LoopResult (`extra`: proposals and samples of a learning run)."""
    st = engine.stats
    return LoopResult(
        duration_s=engine.now,
        tokens=st.tokens_generated,
        decode_tokens=st.decode_tokens,
        decode_gpu_seconds=st.decode_gpu_seconds,
        iterations=st.decode_iterations,
        explore_iterations=st.explore_iterations,
        **extra,
    )
