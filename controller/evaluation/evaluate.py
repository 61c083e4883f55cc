"""`specctl sim evaluate`: the daemon against the simulator, scored against the oracle and statics.

The daemon under test is the real one: it reads the simulator's Prometheus text with the real
parser, stores samples in a (temporary) SQLite file, fits the real learner and pushes through
`/set_internal_state` payloads (in-process calls by default, loopback HTTP with `--http`).
Only the clock is simulated: each tick advances the simulator by one scrape interval (with
`--http`, the served simulator's clock runs on its own at a speedup instead; the report says
how far it got ahead of the daemon's ticks).

Scores
- achieved tok/s: output tokens per simulated second after the scenario's warm-up, for the
  daemon, the oracle and each static policy, all on the same seed (same request stream).
- table quality: the live table's plain decisions scored with the profile's cost model against
  the best depth per batch size, over the load the daemon has seen (decode-time share per
  batch bucket) and the acceptance phase mix of the moment. "Good" means >= 0.95.
- thresholds: the live table's boundaries against the oracle's crossovers after 10 minutes.
"""

from __future__ import annotations

import itertools
import logging
import math
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from controller.daemon.config import ControllerConfig, parse_config
from controller.daemon.guardrails import decision_runs
from controller.daemon.loop import Controller
from controller.daemon.own_metrics import DaemonMetrics
from controller.daemon.runner import TickInfo, run_simulated
from controller.daemon.store import Store
from controller.daemon.transport import HttpTransport, InProcessTransport, ServerTransport
from controller.evaluation.table_lag import LagTracker, decision_score
from models.samples import Sample
from sglang_hooks.contract import PolicyTable, Tier, parse_table
from sims.oracle import OraclePolicy, decode_curves
from sims.policies import FixedDepthPolicy
from sims.profile import Profile, load_profile
from sims.server import SimulatedServer
from sims.workload import Scenario, Workload, load_scenario

GOOD_FRACTION = 0.95
THRESHOLD_CHECK_S = 600.0
MATERIAL_LOSS = 0.01
TWO_TIER_GRID = (2, 3, 4, 6, 8, 12, 16, 20, 24, 32, 40, 48, 64, 96, 128, 192, 256)


# ----------------------------------------------------------------------------- oracle math


def typical_context(workload: Workload) -> float:
    """Mean context of a running request: its prompt plus, on average, half its output.

    The simulator charges KV reads at the running requests' real contexts, so tables are scored
    at the scenario's context, not at the profile's `context_tokens` (which describes the
    profile's reference workload: 32k tokens for the long-context profile).
    """
    return workload.prompt_tokens.mean + workload.output_tokens.mean / 2


class OracleCurves:
    """Steady decode tok/s per captured depth at batch 1..cap, per acceptance phase (cached).

    Same numbers the simulator charges (`sims.oracle.decode_curves`: CUDA-graph padding
    included); a phase mixture is the mixture of the per-phase curves (tokens add, the
    iteration time does not depend on the phase).
    """

    def __init__(self, profile: Profile, context: float | None = None) -> None:
        self.profile = profile
        self.cap = profile.max_running(True)
        self.context = context  # None: the profile's context_tokens
        self._by_phase: dict[str, dict[int, np.ndarray]] = {}

    def _phase(self, phase: str) -> dict[int, np.ndarray]:
        if phase not in self._by_phase:
            _batch, curves, _nospec = decode_curves(
                self.profile, phase, self.cap, context=self.context
            )
            self._by_phase[phase] = curves
        return self._by_phase[phase]

    def tok(self, mix: dict[str, float], batch: int) -> dict[int, float]:
        """Decode tok/s of each depth at `batch` (clipped to the running cap)."""
        i = min(max(batch, 1), self.cap) - 1
        out: dict[int, float] = {}
        for phase, w in mix.items():
            for d, curve in self._phase(phase).items():
                out[d] = out.get(d, 0.0) + w * float(curve[i])
        return out

    def crossovers(self, mix: dict[str, float]) -> list[tuple[int, int, int]]:
        """(from depth, to depth, first batch where `to` is best) over batch 1..cap."""
        best = [self.best_depth(mix, b) for b in range(1, self.cap + 1)]
        return [
            (best[i - 1], best[i], i + 1) for i in range(1, len(best)) if best[i] != best[i - 1]
        ]

    def best_depth(self, mix: dict[str, float], batch: int) -> int:
        tok = self.tok(mix, batch)
        return max(tok, key=lambda d: (tok[d], -d))


@dataclass
class LoadSeen:
    """Decode-time share and mean batch per bucket, from the daemon's own stored samples."""

    share: dict[int, float]
    mean_batch: dict[int, float]

    @staticmethod
    def from_samples(samples: list[Sample]) -> LoadSeen:
        gpu: dict[int, float] = {}
        it: dict[int, float] = {}
        steps: dict[int, float] = {}
        for s in samples:
            gpu[s.bs_bucket] = gpu.get(s.bs_bucket, 0.0) + s.gpu_seconds
            it[s.bs_bucket] = it.get(s.bs_bucket, 0.0) + s.iterations
            steps[s.bs_bucket] = steps.get(s.bs_bucket, 0.0) + s.request_steps
        total = sum(gpu.values())
        if total <= 0:
            return LoadSeen({}, {})
        return LoadSeen({b: v / total for b, v in gpu.items()}, {b: steps[b] / it[b] for b in gpu})


def table_score(
    oracle: OracleCurves, table: PolicyTable | None, load: LoadSeen, mix: dict[str, float]
) -> float | None:
    """Decode tok/s of the table's decisions over `load`, as a fraction of the best depths'."""
    if table is None or not load.share:
        return None
    got = best = 0.0
    for b, w in load.share.items():
        batch = max(round(load.mean_batch[b]), 1)
        tok = oracle.tok(mix, batch)
        got += w * tok[table.depth_for(batch)]
        best += w * max(tok.values())
    return got / best if best > 0 else None


def threshold_errors(
    table: PolicyTable | None,
    crossovers: list[tuple[int, int, int]],
    oracle: OracleCurves,
    mix: dict[str, float],
) -> list[dict[str, Any]]:
    """For each oracle crossover: the nearest table boundary with the same change of depth
    (else the nearest change of any kind), the relative distance, and whether the crossover
    is material (the wrong side of it costs >= 1% tok/s 15% away from it; where depths tie
    that closely, no threshold is "right")."""
    out: list[dict[str, Any]] = []
    runs = [] if table is None else decision_runs(table)
    # (boundary, depth below, depth above) for every change of depth in the table
    edges = [(runs[i][0], runs[i - 1][1], runs[i][1]) for i in range(1, len(runs))]
    for a, b, x in crossovers:
        below, above = max(1, math.floor(x / 1.15)), min(oracle.cap, math.ceil(x * 1.15))
        lo, hi = oracle.tok(mix, below), oracle.tok(mix, above)
        cost = max(1 - lo[b] / lo[a], 1 - hi[a] / hi[b])
        row: dict[str, Any] = {
            "from": a,
            "to": b,
            "oracle": x,
            "material": bool(cost >= MATERIAL_LOSS),
            "wrong_side_cost": round(float(cost), 4),
            "table": None,
            "rel_error": None,
        }
        # The same change of depth if the table has it, else the nearest change of any kind.
        same = [m for m, lo_d, hi_d in edges if (lo_d, hi_d) == (a, b)]
        candidates = same or [m for m, _, _ in edges]
        if candidates:
            nearest = min(candidates, key=lambda m: abs(m - x))
            row["table"] = nearest
            row["same_change"] = bool(same)
            row["rel_error"] = round(abs(nearest - x) / x, 4)
            # The same error in batch sizes, and what it costs: the worst tok/s share lost by
            # the table's decision at the batch sizes between its boundary and the crossover
            # (15% of a crossover at batch 3-4 is under one request; bs_buckets resolve one).
            row["batch_error"] = int(nearest - x)
            between = range(min(nearest, x), max(nearest, x))
            lost = [_loss_at(oracle, mix, table, b) for b in between] if table else []
            row["tok_lost_between"] = round(max(lost, default=0.0), 4)
        out.append(row)
    return out


def _loss_at(oracle: OracleCurves, mix: dict[str, float], table: PolicyTable, batch: int) -> float:
    """Share of the best depth's decode tok/s lost by the table's depth at `batch`."""
    tok = oracle.tok(mix, batch)
    return 1.0 - tok[table.depth_for(batch)] / max(tok.values())


# ----------------------------------------------------------------------------- static runs


def achieved_tok_per_s(
    server: SimulatedServer, scenario: Scenario, marks: Sequence[float] = ()
) -> tuple[float, list[float]]:
    """Run a server through the scenario; output tok/s after the warm-up, and over each window
    between the warm-up, each of `marks` (times inside the run, rising) and the run's end."""
    server.advance_to(scenario.warmup_s)
    start = last = server.stats()
    windows = []
    for end in [*marks, scenario.duration_s]:
        server.advance_to(end)  # advancing in parts serves the same requests
        now = server.stats()
        windows.append(now.tok_per_s_since(last))
        last = now
    return last.tok_per_s_since(start), windows


def static_policies(profile: Profile) -> dict[str, Callable[[], dict[str, Any]]]:
    """Name -> a maker of the SimulatedServer keyword arguments of each static baseline
    (a maker: policies hold state, every run needs fresh ones)."""
    out: dict[str, Callable[[], dict[str, Any]]] = {
        f"always full depth (d{profile.full_depth})": lambda: {
            "policy": FixedDepthPolicy(profile.full_depth)
        },
        "always off (depth 0)": lambda: {"policy": FixedDepthPolicy(0)},
        "sglang default adaptive": lambda: {},
    }
    for d in profile.captured_depths:
        if d not in (0, profile.full_depth):
            out[f"always d{d}"] = partial(_fixed, d)
    return out


def _fixed(depth: int) -> dict[str, Any]:
    return {"policy": FixedDepthPolicy(depth)}


def two_tier_table(full_depth: int, threshold: int) -> PolicyTable:
    return PolicyTable.build([Tier(1, full_depth), Tier(threshold, 0)])


def run_static(profile: Profile, scenario: Scenario, seed: int, **kwargs: Any) -> float:
    return run_static_windows(profile, scenario, seed, (), **kwargs)[0]


def run_static_windows(
    profile: Profile, scenario: Scenario, seed: int, marks: Sequence[float], **kwargs: Any
) -> tuple[float, list[float]]:
    """`run_static`, and the tok/s of each window `achieved_tok_per_s` cuts at `marks`."""
    server = SimulatedServer(profile, scenario.workload, seed=seed, **kwargs)
    return achieved_tok_per_s(server, scenario, marks)


def oracle_tok_per_s(profile: Profile, scenario: Scenario, seed: int) -> float:
    """The oracle's achieved tok/s: `sims.oracle.OraclePolicy` run through the scenario."""
    return run_static(profile, scenario, seed, policy=OraclePolicy(profile))


# ----------------------------------------------------------------------------- daemon run


@dataclass
class DaemonRun:
    achieved_tok_per_s: float
    exploration_share: float
    pushes: int
    rollbacks: int
    time_to_good_table_s: float | None
    drift_recovery_s: float | None
    table_at_10min: PolicyTable | None
    final_table: PolicyTable | None
    score_trace: list[tuple[float, float | None]] = field(default_factory=list)
    recent_score_trace: list[tuple[float, float | None]] = field(default_factory=list)
    tok_trace: list[tuple[float, float]] = field(default_factory=list)
    push_log: list[dict[str, Any]] = field(default_factory=list)
    samples: int = 0
    lag: dict[str, Any] = field(default_factory=dict)
    lag_trace: list[tuple[float, float | None]] = field(default_factory=list)
    served_clock_lead_s: float = 0.0  # the most a free-running served clock was ahead


def eval_config(
    scenario: Scenario, store_path: Path, seed: int, seed_bench: Path | None = None
) -> ControllerConfig:
    """The evaluated daemon's config; `seed_bench`: its target's bench to start from."""
    tick = scenario.sample_interval_s
    overrides = scenario.daemon
    target: dict[str, Any] = {"name": "sim", "group": "eval", "simulated": {"seed": seed}}
    if seed_bench is not None:
        target["seed_bench"] = str(seed_bench)
    config: dict[str, Any] = {
        "targets": [target],
        "schedule": {
            "clock": "simulated",
            "scrape_interval_s": tick,
            "fit_interval_s": max(30.0, tick),
            "decide_interval_s": max(30.0, tick),
            **overrides.schedule,
        },
        "store": {"path": str(store_path)},
        "metrics": {"enabled": False},
        "seed": seed,
    }
    if overrides.guardrails:
        config["guardrails"] = dict(overrides.guardrails)
    return parse_config(config, f"scenario {scenario.name}: daemon")


def drift_time(scenario: Scenario) -> float | None:
    """When the acceptance phase mix first changes (None: the scenario does not drift)."""
    for prev, step in itertools.pairwise(scenario.workload.phases):
        if step.weights() != prev.weights():
            return step.at
    return None


class NominalClock:
    """Advances an in-process simulator to each nominal tick time.

    `SimulatedServer.advance(seconds)` runs `seconds` past where its last iteration ended, so
    the overshoot of every tick (up to one iteration or prefill: ~0.5 s on the Kimi profile)
    accumulates: after 120 ticks the engine is a minute ahead of the daemon's clock and the
    score window runs past the scenario's end, into its low-load tail. The static runs stop at
    the first iteration past `duration_s`; so does this.
    """

    def __init__(self, server: SimulatedServer) -> None:
        self.server = server
        self._target = server.now

    @property
    def now(self) -> float:
        return self._target

    def advance(self, seconds: float) -> None:
        self._target += seconds
        self.server.advance_to(self._target)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.server, name)


class FollowClock:
    """A served simulator's clock runs on its own thread: `advance` waits for it instead.

    It never waits for the daemon: while a fit or a slow HTTP answer holds the daemon up, the
    served clock runs on, and the next tick finds it ahead (`lead_s`, the most seen). A lead of
    more than a scrape interval means the daemon saw longer intervals than it scheduled."""

    def __init__(self, server: SimulatedServer, poll_s: float = 0.005) -> None:
        self.server = server
        self.poll_s = poll_s
        self._target = server.now
        self.lead_s = 0.0

    @property
    def now(self) -> float:
        return self.server.now

    def advance(self, seconds: float) -> None:
        self.lead_s = max(self.lead_s, self.server.now - self._target)
        self._target += seconds
        while self.server.now < self._target:
            time.sleep(self.poll_s)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.server, name)


def live_table_of(server: SimulatedServer) -> PolicyTable | None:
    """The table the server runs, from its public /server_info state (None: not ours)."""
    state = server.specctl_state()
    if state["source"] == "none" or state["table"] is None:
        return None
    return parse_table(state["table"])


def run_daemon_eval(
    profile: Profile,
    scenario: Scenario,
    seed: int,
    *,
    base_url: str | None = None,
    server: SimulatedServer | None = None,
    follow_clock: bool = False,
    on_progress: Callable[[float], None] | None = None,
    seed_bench: Path | None = None,
) -> DaemonRun:
    """The daemon through the scenario; in-process calls, or HTTP to `base_url` (a served
    simulator: then `server` must be the one it serves). `follow_clock`: the served clock runs
    on its own and the ticks wait for it; otherwise each tick advances the simulator.
    `seed_bench`: a `specctl bench` of the server the daemon's store starts from, as
    `targets[].seed_bench` does (BenchSeedError if it is not a bench)."""
    if base_url is not None and server is None:
        raise ValueError("base_url needs the served SimulatedServer (to read and drive its clock)")
    server = server or SimulatedServer(profile, scenario.workload, seed=seed)
    transport: ServerTransport = (
        InProcessTransport(server) if base_url is None else HttpTransport(base_url, 10.0)
    )
    clocked: Any = FollowClock(server) if follow_clock else NominalClock(server)
    with tempfile.TemporaryDirectory(prefix="specctl-eval-") as tmp:
        cfg = eval_config(scenario, Path(tmp) / "eval.sqlite", seed, seed_bench)
        store = Store(cfg.store.resolved_path())
        controller = Controller(cfg, store, {"sim": transport}, metrics=DaemonMetrics())
        controller.seed_from_benches(server.now)  # nothing without a seed_bench
        tracker = _Tracker(profile, scenario, controller, drift_time(scenario))
        start_stats: list[Any] = []

        def on_tick(info: TickInfo) -> None:
            if not start_stats and info.now >= scenario.warmup_s:
                start_stats.append(server.stats())
            tracker.observe(info.now, server)
            if on_progress is not None:
                on_progress(info.now)

        run_simulated(
            controller,
            {"sim": clocked},
            until_s=scenario.duration_s,
            speedup=None,
            on_tick=on_tick,
        )
        end = server.stats()
        achieved = end.tok_per_s_since(start_stats[0]) if start_stats else 0.0
        explore = end.explore_iterations / end.decode_iterations if end.decode_iterations else 0.0
        pushes = store.pushes("sim")
        run = DaemonRun(
            achieved_tok_per_s=achieved,
            exploration_share=explore,
            pushes=sum(1 for p in pushes if p.outcome not in ("refused", "unauthorized", "error")),
            rollbacks=store.count_rollbacks("sim"),
            time_to_good_table_s=tracker.first_good,
            drift_recovery_s=tracker.drift_recovery(),
            table_at_10min=tracker.table_at_10min,
            final_table=tracker.live_table,
            score_trace=tracker.scores,
            recent_score_trace=tracker.recent_scores,
            tok_trace=tracker.tok_trace,
            push_log=[
                {
                    "t": p.t,
                    "kind": p.kind,
                    "outcome": p.outcome,
                    "table": p.table,
                    "label": None if p.table is None else parse_table(p.table).label(),
                    "reason": p.reason,
                }
                for p in pushes
            ],
            samples=store.count_samples(),
            lag=tracker.lag.report(scenario.duration_s),
            lag_trace=tracker.lag.trace,
            served_clock_lead_s=clocked.lead_s if follow_clock else 0.0,
        )
        controller.close()
        store.close()
    return run


class _Tracker:
    """Follows the live table and scores it against the oracle on every tick."""

    RECENT_S = 300.0

    def __init__(
        self,
        profile: Profile,
        scenario: Scenario,
        controller: Controller,
        t_drift: float | None,
    ) -> None:
        self.profile = profile
        self.oracle = OracleCurves(profile, typical_context(scenario.workload))
        self.scenario = scenario
        self.controller = controller
        self.t_drift = t_drift
        self.live_table: PolicyTable | None = None
        self.table_at_10min: PolicyTable | None = None
        self.first_good: float | None = None
        self.scores: list[tuple[float, float | None]] = []
        self.recent_scores: list[tuple[float, float | None]] = []
        self.tok_trace: list[tuple[float, float]] = []
        self.lag = LagTracker()
        self._mix_ema: dict[str, float] = {}
        self._last_stats: Any = None

    def observe(self, now: float, server: SimulatedServer) -> None:
        self.live_table = live_table_of(server)
        if self.table_at_10min is None and now >= THRESHOLD_CHECK_S:
            self.table_at_10min = self.live_table
        stats = server.stats()
        if self._last_stats is not None:
            self.tok_trace.append((now, stats.tok_per_s_since(self._last_stats)))
        self._last_stats = stats
        samples = self.controller.groups["eval"].samples
        mix = self.scenario.workload.phase_mix(now, self.profile.acceptance.default_phase)
        score = table_score(self.oracle, self.live_table, LoadSeen.from_samples(samples), mix)
        self.scores.append((now, score))
        if self.first_good is None and score is not None and score >= GOOD_FRACTION:
            self.first_good = now
        recent = LoadSeen.from_samples([s for s in samples if s.t_end > now - self.RECENT_S])
        self.recent_scores.append((now, table_score(self.oracle, self.live_table, recent, mix)))
        # The load of the moment: the last scrape interval only, so a change shows at once.
        last = [s for s in samples if s.t_end > now - self.scenario.sample_interval_s + 1e-6]
        table = self.live_table
        running = self._running_mix(server, mix)
        self.lag.observe(
            now,
            decision_score(
                last,
                lambda batch: self.oracle.tok(running, batch),
                None if table is None else table.depth_for,
            ),
        )

    def _running_mix(self, server: SimulatedServer, arrival: dict[str, float]) -> dict[str, float]:
        """Acceptance phases of the requests the server is running (what its decisions are
        worth now: a request keeps the phase it arrived with), smoothed over ~30 s of ticks;
        the arrival mix while nothing runs."""
        counts = server.engine.phase_counts()
        names = list(self.profile.acceptance.phases)
        total = sum(counts)
        now_mix = (
            {n: c / total for n, c in zip(names, counts, strict=True) if c}
            if total
            else dict(arrival)
        )
        alpha = min(1.0, self.scenario.sample_interval_s / 30.0)
        prev = self._mix_ema or now_mix
        keys = set(prev) | set(now_mix)
        self._mix_ema = {
            k: (1 - alpha) * prev.get(k, 0.0) + alpha * now_mix.get(k, 0.0) for k in keys
        }
        return {k: v for k, v in self._mix_ema.items() if v > 0}

    def drift_recovery(self) -> float | None:
        """Seconds from the drift's start until the live table scores >= 0.95 on the recent
        load and stays there to the end of the run (None: no drift in the scenario; inf: it
        does not settle within the run; 0: it never fell below)."""
        if self.t_drift is None:
            return None
        after = [(t, s) for t, s in self.recent_scores if t >= self.t_drift]
        settled: float | None = None
        for t, score in after:
            if score is None or score < GOOD_FRACTION:
                settled = None
            elif settled is None:
                settled = t
        if settled is None:
            return math.inf
        return settled - after[0][0] if after else math.inf


# ----------------------------------------------------------------------------- the report


def baselines(
    profile: Profile,
    scenario: Scenario,
    seed: int,
    say: Callable[[str], None] = lambda _msg: None,
) -> dict[str, Any]:
    """Everything the daemon is compared with on this seed, none of which depends on the
    daemon: the static policies, the two-tier grid, a server without speculation, the oracle.
    JSON-ready, so a benchmark can keep it between runs of an unchanged simulator."""
    say("static policies")
    static: dict[str, float] = {}
    for name, make_kwargs in static_policies(profile).items():
        static[name] = run_static(profile, scenario, seed, **make_kwargs())
    max_batch = profile.max_running(True)
    two_tier: dict[str, float] = {}
    for thr in (t for t in TWO_TIER_GRID if t <= max_batch):
        two_tier[str(thr)] = run_static(
            profile, scenario, seed, table=two_tier_table(profile.full_depth, thr)
        )
    best_thr = max(two_tier, key=lambda k: two_tier[k])
    static[f"best two-tier in hindsight (d{profile.full_depth} below {best_thr}, off above)"] = (
        two_tier[best_thr]
    )
    # A server started without speculation is another deployment, not a policy the daemon can
    # choose: SGLang also gives it a larger running-request cap. Reported beside the statics.
    nospec = run_static(profile, scenario, seed, speculative=False)
    say("oracle")
    oracle = oracle_tok_per_s(profile, scenario, seed)
    return {"static": static, "two_tier": two_tier, "nospec": nospec, "oracle": oracle}


def evaluate(
    profile_name: str,
    scenario_name: str,
    seed: int = 0,
    *,
    http_speedup: float | None = None,
    http_stepped: bool = False,
    on_progress: Callable[[str], None] | None = None,
    precomputed: dict[str, Any] | None = None,
    seed_bench: Path | None = None,
) -> dict[str, Any]:
    """One JSON-ready report for a profile x scenario. `seed_bench`: the daemon starts from
    this bench of the server (`targets[].seed_bench`). `http_speedup`: run the daemon over
    loopback HTTP against a served simulator whose clock runs that many times wall time.
    `http_stepped`: over loopback HTTP too, but each tick advances the served simulator (as
    in-process), so the run does not depend on how fast this machine answers.
    `precomputed`: `baselines(...)` of the same profile, scenario and seed (else run here)."""
    if http_stepped and http_speedup is not None:
        raise ValueError("http_stepped drives the served clock itself: give no http_speedup")
    t0 = time.monotonic()
    say = on_progress or (lambda _msg: None)
    # The daemon's own log lines would interleave with the report; keep only errors.
    logging.getLogger("specctl").setLevel(logging.ERROR)
    profile = load_profile(profile_name)
    scenario = load_scenario(scenario_name)
    base = precomputed or baselines(profile, scenario, seed, say)
    static: dict[str, float] = dict(base["static"])
    two_tier: dict[str, float] = dict(base["two_tier"])
    nospec, oracle = float(base["nospec"]), float(base["oracle"])
    say("daemon")
    over_http = http_stepped or http_speedup is not None
    if not over_http:
        run = run_daemon_eval(profile, scenario, seed, seed_bench=seed_bench)
    else:
        from sims.http import ServedSimulation

        server = SimulatedServer(profile, scenario.workload, seed=seed)
        with ServedSimulation(server, speedup=http_speedup) as served:
            run = run_daemon_eval(
                profile,
                scenario,
                seed,
                base_url=served.base_url,
                server=server,
                follow_clock=http_speedup is not None,
                seed_bench=seed_bench,
            )
    best_static_name = max(static, key=lambda k: static[k])
    curves = OracleCurves(profile, typical_context(scenario.workload))
    default = profile.acceptance.default_phase
    mix_10 = scenario.workload.phase_mix(THRESHOLD_CHECK_S, default)
    cross_10 = curves.crossovers(mix_10)
    final_mix = scenario.workload.phase_mix(scenario.duration_s, default)
    ratio = run.achieved_tok_per_s / oracle if oracle > 0 else None
    report: dict[str, Any] = {
        "profile": profile.name,
        "scenario": scenario.name,
        "seed": seed,
        "transport": "http" if over_http else "in-process",
        "seed_bench": None if seed_bench is None else str(seed_bench),
        "duration_s": scenario.duration_s,
        "warmup_s": scenario.warmup_s,
        "achieved_tok_per_s": round(run.achieved_tok_per_s, 2),
        "oracle_tok_per_s": round(oracle, 2),
        "ratio_to_oracle": None if ratio is None else round(ratio, 4),
        "static": {k: round(v, 2) for k, v in static.items()},
        "static_ratio_to_oracle": {k: round(v / oracle, 4) for k, v in static.items()},
        "best_static": best_static_name,
        "best_static_tok_per_s": round(static[best_static_name], 2),
        "beats_every_static": all(run.achieved_tok_per_s > v for v in static.values()),
        "vs_best_static": round(run.achieved_tok_per_s / static[best_static_name] - 1.0, 5),
        "two_tier_grid": {k: round(v, 2) for k, v in two_tier.items()},
        "nospec_server": {
            "tok_per_s": round(nospec, 2),
            "ratio_to_oracle": round(nospec / oracle, 4) if oracle > 0 else None,
            "max_running_requests": profile.max_running(False),
            "speculative_max_running_requests": profile.max_running(True),
        },
        "exploration_share": round(run.exploration_share, 4),
        "time_to_good_table_s": run.time_to_good_table_s,
        "pushes": run.pushes,
        "rollbacks": run.rollbacks,
        "samples_stored": run.samples,
        "table_at_10min": _table_json(run.table_at_10min),
        "table_at_10min_text": _table_text(run.table_at_10min),
        "final_table": _table_json(run.final_table),
        "final_table_text": _table_text(run.final_table),
        "oracle_crossovers_at_10min": [list(c) for c in cross_10],
        "oracle_crossovers_final": [list(c) for c in curves.crossovers(final_mix)],
        "thresholds_vs_oracle_at_10min": threshold_errors(
            run.table_at_10min, cross_10, curves, mix_10
        ),
        "score_trace": [[t, None if v is None else round(v, 4)] for t, v in run.score_trace],
        "recent_score_trace": [
            [t, None if v is None else round(v, 4)] for t, v in run.recent_score_trace
        ],
        "tok_trace": [[t, round(v, 2)] for t, v in run.tok_trace],
        "table_lag": run.lag,
        "lag_score_trace": [[t, None if v is None else round(v, 4)] for t, v in run.lag_trace],
        "push_log": run.push_log,
        "wall_s": round(time.monotonic() - t0, 2),
    }
    if http_speedup is not None:
        report["served_clock_speedup"] = http_speedup
        report["served_clock_lead_s"] = round(run.served_clock_lead_s, 1)
        report["scrape_interval_s"] = scenario.sample_interval_s
    t_drift = drift_time(scenario)
    if t_drift is not None:
        rec = run.drift_recovery_s
        report["drift_at_s"] = t_drift
        report["drift_recovery_s"] = None if rec is None or math.isinf(rec) else rec
    return report


def _table_json(table: PolicyTable | None) -> dict[str, Any] | None:
    return None if table is None else table.to_json()


def _table_text(table: PolicyTable | None) -> str:
    return "SGLang's own adaptive choice (no table)" if table is None else table.describe()
