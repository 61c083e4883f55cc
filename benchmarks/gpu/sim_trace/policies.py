"""Each policy of the GPU trace, run through the trace's scenario in the simulator, as
`specctl sim evaluate` runs its own (controller/evaluation/evaluate.py): the same request
stream per seed for every policy, output tok/s over the scenario after its warm-up, and over
each of the trace's phases (where the simulator and the server part)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

from benchmarks.gpu.seeded.trace import TraceError, table_from
from benchmarks.gpu.sim_trace.inputs import SimTraceError
from controller.daemon.bench_seed import BenchSeedError
from controller.evaluation.evaluate import run_daemon_eval, run_static_windows
from sglang_hooks.contract import PolicyTable, single_depth_table
from sims.profile import Profile
from sims.workload import Scenario

# closed_loop.json's names the simulator has no counterpart for, and why
NOT_SIMULATED = {
    "daemon-warm": "it starts from the store the daemon's GPU run left; the simulated daemon "
    "starts from an empty store or a bench",
}


class NotSimulated(Exception):
    """A policy the simulator cannot run; the message says why."""


@dataclass(frozen=True)
class PolicyRun:
    tok_per_s: float  # over the scenario after its warm-up
    phases: list[float]  # over each of the trace's phases, in order


def phase_bounds(scenario: Scenario) -> list[float]:
    """The phases' start times (the clients' cuts) and the scenario's end."""
    return [*scenario.workload.cut_at, scenario.duration_s]


def run_static(profile: Profile, scenario: Scenario, seed: int, **kwargs: Any) -> PolicyRun:
    """A static policy's run, read at each phase's end too (the first phase starts with the
    scored part, after the daemon's idle lead)."""
    marks = [t for t in scenario.workload.cut_at if t > scenario.warmup_s]
    total, phases = run_static_windows(profile, scenario, seed, marks, **kwargs)
    return PolicyRun(total, phases)


def phase_means(trace: Sequence[tuple[float, float]], bounds: Sequence[float]) -> list[float]:
    """Per phase, the mean of a per-tick tok/s trace over the ticks ending inside it."""
    out = []
    for lo, hi in pairwise(bounds):
        inside = [v for t, v in trace if lo < t <= hi]
        out.append(sum(inside) / len(inside) if inside else 0.0)
    return out


def static_depth(name: str) -> int | None:
    """D of `static:D`, else None."""
    head, _, depth = name.partition(":")
    return int(depth) if head == "static" and depth.isdigit() else None


def _captured(profile: Profile, table: PolicyTable, what: str) -> None:
    missing = sorted(table.depths - set(profile.captured_depths))
    if missing:
        raise NotSimulated(f"{what} runs depth {missing[0]}, which the profile did not "
                           f"capture (captured: {profile.captured_depths})")  # fmt: skip


def run_policy(name: str, profile: Profile, scenario: Scenario, seed: int, bench: Path
               ) -> PolicyRun:  # fmt: skip
    """Output tok/s per simulated second of policy `name` (closed_loop.json's name)."""
    logging.getLogger("specctl").setLevel(logging.ERROR)  # the daemon's lines, not the report
    if name in NOT_SIMULATED:
        raise NotSimulated(NOT_SIMULATED[name])
    if name.endswith("+scrape"):
        raise NotSimulated("it measures what reading /metrics costs the server, which the "
                           "simulator does not model")
    depth = static_depth(name)
    if depth is not None:
        table = single_depth_table(depth)
        _captured(profile, table, name)
        return run_static(profile, scenario, seed, table=table)
    if name == "sglang-adaptive":
        return run_static(profile, scenario, seed)  # SGLang's adaptive steps, no table
    if name == "plain":
        return run_static(profile, scenario, seed, speculative=False)
    if name == "bench-table":
        try:
            table = table_from(bench)
        except TraceError as err:  # e.g. a bench that decided nothing; the trace ran another
            raise NotSimulated(f"{str(err).replace('--table-from ', '')}; or give --bench the "
                               "bench the trace's bench policies started from") from None
        _captured(profile, table, f"the bench's table ({table.describe()})")
        return run_static(profile, scenario, seed, table=table)
    if name in ("daemon", "daemon-from-bench"):
        seed_bench = bench if name == "daemon-from-bench" else None
        try:
            run = run_daemon_eval(profile, scenario, seed, seed_bench=seed_bench)
        except BenchSeedError as err:
            raise SimTraceError(str(err)) from None
        return PolicyRun(run.achieved_tok_per_s,
                         phase_means(run.tok_trace, phase_bounds(scenario)))  # fmt: skip
    raise NotSimulated("not a policy of the trace step this simulator knows")
