"""Compare step-cost model families on the simulator's profiles, then run the learner closed-loop.

Run:  .venv/bin/python benchmarks/model_comparison.py > benchmarks/results/model_comparison.txt

Part 1 (offline): counter samples generated from each built-in profile's cost model with its
step noise (controller/evaluation/synthetic.py), in two regimes:
  sweep  every captured depth at 14 batch sizes, 2 simulated seconds each (a calibration sweep)
  probe  10 simulated minutes of production: the full depth runs, every other depth only as
         interleaved probes at 3% of iterations, batch size wandering over 1..running cap
Each step-model family is fitted on the same cells and judged against the simulator's own cost
table (CUDA-graph padding included, sims/oracle.py): step-time error over every (depth, batch
size), the crossover batch sizes of the resulting best-depth map against the oracle's, and the
regret of picking the model's best depth (share of oracle decode tok/s lost, mean over batch
sizes). Acceptance is the learner's posterior in every case; only the step model changes.

Part 2 (closed loop): the learner drives the simulator engine through `ramp` and through
`ramp-drift` (ramp with the workload switching chat -> code at 10 minutes), refitting and
installing a table every 5 s, against the per-iteration oracle and every static depth.

Part 3: fit + propose wall time on 10^4 samples.
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from controller.evaluation.sim_loop import run_learner_loop, run_static
from controller.evaluation.synthetic import SyntheticServer, sweep_samples
from models.acceptance import AcceptanceModel
from models.evidence import aggregate, sample_arrays
from models.learner import Learner, LearnerConfig
from models.samples import Sample
from models.step_model import (
    IsotonicStepModel,
    PerDepthLinearStepModel,
    RooflineStepModel,
    StepModel,
)
from models.tiers import Run, crossovers, merge_small_gain_runs, runs_of
from sglang_hooks.contract import PolicyTable, Tier, single_depth_table
from sims.engine import Engine
from sims.oracle import OraclePolicy, decode_curves
from sims.profile import Profile, builtin_profiles, load_profile
from sims.workload import Scenario, load_scenario

SWEEP_BATCHES = [1, 2, 3, 4, 6, 8, 12, 16, 20, 24, 32, 40, 48, 64]
FAMILIES: list[type] = [RooflineStepModel, PerDepthLinearStepModel, IsotonicStepModel]
RESOLUTION = 0.01  # runs that win by less are ties (the learner's explore_margin)


def learner_acceptance(depths: list[int]) -> AcceptanceModel:
    """An acceptance model with the learner's default prior, as the daemon fits it."""
    c = LearnerConfig()
    return AcceptanceModel(depths, prior_rate=c.acceptance_prior_rate,
                           prior_decay=c.acceptance_prior_decay,
                           prior_strength=c.acceptance_prior_strength,
                           dispersion=c.acceptance_dispersion)


def resolved_crossovers(
    depths: list[int], tok: dict[int, np.ndarray]
) -> tuple[list[Run], list[tuple[int, int, float]]]:
    best = np.asarray(depths)[np.nanargmax(np.stack([tok[d] for d in depths]), axis=0)]
    runs = merge_small_gain_runs(runs_of(best), tok, RESOLUTION)
    return runs, crossovers(runs, tok)


def probe_samples(profile: Profile, seed: int, minutes: float = 10.0) -> list[Sample]:
    cap = profile.max_running(True)
    others = tuple(d for d in profile.captured_depths if d != profile.full_depth)
    table = PolicyTable.build(
        [Tier(1, profile.full_depth, explore_share=0.03, explore_depths=others)]
    )
    server = SyntheticServer(profile, table, seed=seed)
    rng = random.Random(seed)
    level = [cap / 4.0]

    def batch_at(_t: float) -> int:
        level[0] = min(max(level[0] * np.exp(rng.gauss(0.0, 0.01)), 1.0), float(cap))
        return round(level[0])

    out: list[Sample] = []
    for _ in range(int(minutes * 12)):
        out += server.run(5.0, batch_at)
    return out


def judge(
    profile: Profile, phase: str, model: StepModel, acceptance: AcceptanceModel, cap: int
) -> dict[str, float]:
    batch, true_curves, _ = decode_curves(profile, phase, cap)
    b = batch.astype(float)
    depths = list(profile.captured_depths)
    errors, tok = [], {}
    for d in depths:
        true_ms = b * profile.acceptance.expected_length(phase, d) / true_curves[d] * 1000.0
        pred_ms, _ = model.predict(np.full(b.shape, d), b)
        errors.append(np.abs(pred_ms / true_ms - 1.0))
        tok[d] = b * acceptance.mean_length(d) / (pred_ms / 1000.0)
        tok[d] = np.where(np.isnan(tok[d]), -np.inf, tok[d])
    err = np.concatenate(errors)
    known = np.isfinite(err)
    _, want = resolved_crossovers(depths, true_curves)
    runs, got = resolved_crossovers(depths, tok)
    best_true = np.nanmax(np.stack([true_curves[d] for d in depths]), axis=0)
    chosen = np.asarray([true_curves[r.depth][r.lo - 1 : r.hi] for r in runs], dtype=object)
    achieved = np.concatenate(list(chosen))
    return {
        "mape": float(np.mean(err[known])) if known.any() else float("nan"),
        "max": float(np.max(err[known])) if known.any() else float("nan"),
        "coverage": float(known.mean()),
        "regret": float(np.mean(1.0 - achieved / best_true)),
        "xover": crossover_error(got, want),
    }


def crossover_error(
    got: list[tuple[int, int, float]], want: list[tuple[int, int, float]]
) -> float:
    """Worst relative error over the oracle's crossovers (matched by depth pair); inf if one
    is missing. NaN when the oracle has none."""
    if not want:
        return float("nan") if not got else float("inf")
    worst = 0.0
    for a, b, x in want:
        cands = [g for f, t, g in got if (f, t) == (a, b)]
        if not cands:
            return float("inf")
        worst = max(worst, min(abs(g - x) / x for g in cands))
    return worst


def part1(out: list[str]) -> None:
    out.append("== Part 1: step-model families (offline, samples from each profile's cost model)")
    out.append(
        f"{'profile':32} {'regime':6} {'family':26} {'step MAPE':>9} {'max err':>8} "
        f"{'cover':>6} {'regret':>7} {'xover err':>9}"
    )
    totals: dict[tuple[str, str], list[dict[str, float]]] = {}
    for name in builtin_profiles():
        profile = load_profile(name)
        phase = profile.acceptance.default_phase
        cap = profile.max_running(True)
        for regime in ("sweep", "probe"):
            rows = []
            for seed in range(3):
                samples = (
                    sweep_samples(profile, SWEEP_BATCHES, 2.0, seed=seed)
                    if regime == "sweep"
                    else probe_samples(profile, seed)
                )
                arrays = sample_arrays(samples)
                now = float(arrays["t_end"].max())
                cells = aggregate(arrays, now, 86400.0)
                acc = learner_acceptance(profile.captured_depths)
                acc.fit(aggregate(arrays, now, 1e9))
                for family in FAMILIES:
                    model = family()
                    model.fit(cells, 0.05, 0.01)
                    rows.append((family.name, judge(profile, phase, model, acc, cap)))
            for family in FAMILIES:
                res = [r for f, r in rows if f == family.name]
                totals.setdefault((regime, family.name), []).extend(res)
                m = {k: float(np.mean([r[k] for r in res])) for k in res[0]}
                out.append(
                    f"{name:32} {regime:6} {family.name:26} {m['mape']:9.2%} {m['max']:8.2%} "
                    f"{m['coverage']:6.0%} {m['regret']:7.3%} {fmt_err(res)}"
                )
    out.append("")
    out.append("mean over profiles and seeds:")
    for (regime, family), res in totals.items():
        m = {k: float(np.mean([r[k] for r in res])) for k in res[0]}
        out.append(
            f"  {regime:6} {family:26} step MAPE {m['mape']:.2%}  regret {m['regret']:.3%}  "
            f"crossovers within 15%: {hits(res)}"
        )
    out.append("")


def fmt_err(res: list[dict[str, float]]) -> str:
    errs = [r["xover"] for r in res]
    if all(np.isnan(e) for e in errs):
        return f"{'(none)':>9}"
    return f"{float(np.median(errs)):9.1%}"


def hits(res: list[dict[str, float]]) -> str:
    errs = [r["xover"] for r in res if not np.isnan(r["xover"])]
    return f"{sum(e <= 0.15 for e in errs)}/{len(errs)} runs" if errs else "no crossovers"


def drift_scenario(base: Scenario) -> Scenario:
    data = base.model_dump()
    data["name"] = "ramp-drift"
    data["workload"]["phases"] = [{"at": 0, "phase": "chat"}, {"at": 600, "phase": "code"}]
    return Scenario.model_validate(data)


def oracle_run(profile: Profile, scenario: Scenario, seed: int) -> float:
    engine = Engine(profile, scenario.workload, seed=seed, policy=OraclePolicy(profile))
    engine.run_until(scenario.duration_s)
    return engine.stats.tokens_generated / engine.now


def part2(out: list[str]) -> None:
    out.append("== Part 2: closed loop on the simulator engine (refit + table every 5 s)")
    out.append(
        f"{'profile':32} {'scenario':10} {'oracle':>8} {'best static':>14} {'learner':>8} "
        f"{'/oracle':>8} {'/best static':>12} {'probes':>7} {'tables':>6}"
    )
    base = load_scenario("ramp")
    for name in builtin_profiles():
        profile = load_profile(name)
        for scenario in (base, drift_scenario(base)):
            phases = {p for step in scenario.workload.phases for p in step.weights()}
            if not phases <= set(profile.acceptance.phases):
                continue
            oracle = oracle_run(profile, scenario, 0)
            statics = {
                d: run_static(profile, scenario, single_depth_table(d)).tok_per_s
                for d in profile.captured_depths
            }
            best_d = max(statics, key=lambda d: statics[d])
            res = run_learner_loop(profile, scenario, seed=0)
            tables = len({str(p.table.tiers) for _, p in res.proposals})
            out.append(
                f"{name:32} {scenario.name:10} {oracle:8.1f} "
                f"{f'd{best_d} {statics[best_d]:.1f}':>14} {res.tok_per_s:8.1f} "
                f"{res.tok_per_s / oracle:8.3f} {res.tok_per_s / statics[best_d]:12.3f} "
                f"{res.explore_share:7.2%} {tables:6d}"
            )
    out.append("")


def part3(out: list[str]) -> None:
    out.append("== Part 3: fit + propose wall time, one core")
    profile = load_profile("kimi-k25-8x-rtxpro6000-pcie")
    samples: list[Sample] = []
    seed = 0
    while len(samples) < 10_000:
        samples += probe_samples(profile, seed, minutes=30.0)
        seed += 1
    samples = samples[:10_000]
    now = max(s.t_end for s in samples)
    learner = Learner(profile.captured_depths)
    fits, props = [], []
    for _ in range(5):
        t0 = time.perf_counter()
        learner.fit(samples, now)
        t1 = time.perf_counter()
        learner.propose(now, None)
        t2 = time.perf_counter()
        fits.append(t1 - t0)
        props.append(t2 - t1)
    out.append(
        f"{len(samples)} samples: fit median {np.median(fits) * 1000:.0f} ms, "
        f"propose median {np.median(props) * 1000:.0f} ms (5 runs)"
    )


def main() -> None:
    out = [f"$ .venv/bin/python {' '.join(sys.argv)}", ""]
    t0 = time.time()
    part1(out)
    print("\n".join(out), flush=True)
    out = []
    part2(out)
    part3(out)
    out.append(f"\n(total {time.time() - t0:.0f} s)")
    print("\n".join(out), flush=True)


if __name__ == "__main__":
    main()
