"""How long must the GPU harness's closed-loop trace be for the daemon to show what it can do?

A planning benchmark in the simulator: the GPU trace step's policies (benchmarks/gpu/steps/
trace.py) replayed through `benchmarks.gpu.sim_trace` on the built-in profile
`h200-sglang-llama8b-seeded`, on one trace shape scaled to several total lengths, to see at
what length the daemon (from a bench, and from an empty store) reaches the best static depth
and the bench's table under the trace daemon's intervals (benchmarks/gpu/daemon_run.py).

    python benchmarks/trace_length.py [--lengths 20,40,80,160,320] [--seeds 0,1] [--jobs 2]

Inputs, and how each is made:
- The profile, with acceptance phases `a` and `b` from the seeded head's accept lengths per
  depth through `sim_trace.profile.with_datasets`, i.e. *accept lengths* (1 + expected accepted
  draft tokens, SGLang's figure) converted to the per-position conditional rates the profile's
  acceptance format holds (`sims.fit.framing.acceptance_rates`), as `specctl sim fit` does.
- The GPU trace's default shape (`DEFAULT_SHAPE` scaled by `default_trace`) through
  `sim_trace.scenario.trace_scenario`: a stepped closed loop, streams cut at each phase's end,
  the daemon's start lead, the trace daemon's schedule and guardrails; 32-token prompts and
  128 output tokens per request.
- The bench: `sims.fit.replayed_bench` replays the profile under the bench protocol (closed-loop
  levels 1/16/64/128/256 at depths 0/1/3 and the plain server, family a); its levels become
  `controller.bench.sweep.LevelResult`s, `controller.bench.report.recommend_table` (what
  `specctl bench` runs) recommends the table, and a bench.json with `results`,
  `flagged_levels` and `recommended_table` is written: the fields the daemon's `seed_bench`
  (controller/daemon/bench_seed.py) and the trace's `table_from` read. No HTTP client, so no
  client-side flags; the replay gives the tok/s, batch, step time and accept length per level.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from statistics import fmean
from typing import Any

from benchmarks.gpu.seeded.trace import DEFAULT_SHAPE, default_trace, phases_text, table_from
from benchmarks.gpu.sim_trace.policies import run_policy
from benchmarks.gpu.sim_trace.profile import with_datasets
from benchmarks.gpu.sim_trace.scenario import harness_daemon, trace_scenario
from controller.bench.report import recommend_table
from controller.bench.sweep import LevelResult
from sims.fit.replayed_bench import replayed_bench
from sims.profile import Profile, load_profile
from sims.workload import FixedLength, Scenario

PROFILE = "h200-sglang-llama8b-seeded"
# The seeded EAGLE-3 head's accept lengths by depth (1 + accepted draft tokens per step) on
# the two prompt families; SGLang measured 3.07 (a) and 1.90 (b) at depth 3 on the GPU.
ACCEPT = {"a": {1: 1.83, 2: 2.52, 3: 3.09}, "b": {1: 1.53, 2: 1.80, 3: 1.94}}
PROMPT_TOKENS, OUTPUT_TOKENS = 32, 128  # the seeded prompt files' request shape
BENCH_DEPTHS, BENCH_LEVELS = (0, 1, 3), (1, 16, 64, 128, 256)
BENCH_SECONDS, BENCH_WARMUP_S = 10.0, 2.0
STATICS = ("static:0", "static:1", "static:3")
POLICIES = (*STATICS, "bench-table", "daemon-from-bench", "daemon", "sglang-adaptive", "plain")


def the_profile() -> Profile:
    return with_datasets(load_profile(PROFILE), ACCEPT, "benchmarks/trace_length.py ACCEPT")


def write_bench(profile: Profile, folder: Path) -> dict[str, Any]:
    """A bench of `profile` on family a, written as `specctl bench --out folder` would hold
    it for the daemon and the trace (see the module docstring); returns the document."""
    run = replayed_bench(
        profile,
        depths=BENCH_DEPTHS,
        concurrency=BENCH_LEVELS,
        prompt_tokens=PROMPT_TOKENS,
        output_tokens=OUTPUT_TOKENS,
        seconds=BENCH_SECONDS,
        warmup_s=BENCH_WARMUP_S,
        phase="a",
        name="replayed",
    )
    results = [
        LevelResult(
            series=lv.series,
            depth=lv.depth,
            concurrency=lv.concurrency,
            requests=lv.requests,
            errors=lv.errors,
            elapsed_s=lv.elapsed_s,
            output_tok_per_s=lv.tok_per_s,
            ttft_p50_ms=lv.ttft_p50_ms,
            ttft_p90_ms=None,
            tpot_p50_ms=lv.tpot_p50_ms,
            tpot_p90_ms=None,
            mean_batch=lv.mean_batch,
            accept_length=lv.accept_length,
            client_cpu_share=0.0,
            warmup_s=lv.warmup_s,
            step_ms=lv.step_ms,
            prompt_tokens=lv.prompt_tokens,
            output_tokens=lv.output_tokens,
        )
        for lv in run.levels
    ]
    table = recommend_table(results, profile.captured_depths, depths=BENCH_DEPTHS)
    doc: dict[str, Any] = {
        "source": f"sims.fit.replayed_bench of {profile.name}, acceptance phase a",
        "depths": list(BENCH_DEPTHS),
        "concurrencies": list(BENCH_LEVELS),
        "results": [r.to_json() for r in results],
        "flagged_levels": [
            {"series": r.series, "level": r.level, "flags": r.flags} for r in results if r.flags
        ],
        "recommended_table": None if table is None else table.to_json(),
        "recommended_table_text": None if table is None else table.describe(),
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "bench.json").write_text(json.dumps(doc, indent=2) + "\n")
    return doc


def scenario_of(total_s: float) -> Scenario:
    return trace_scenario(
        default_trace(total_s),
        prompt_tokens=FixedLength(value=PROMPT_TOKENS),
        output_tokens=FixedLength(value=OUTPUT_TOKENS),
        daemon=harness_daemon(),
        name=f"trace-{total_s:g}s",
    )


def _one(job: tuple[float, str, int, str]) -> tuple[float, str, int, float, float]:
    total_s, policy, seed, bench = job
    t0 = time.perf_counter()
    tok = run_policy(policy, the_profile(), scenario_of(total_s), seed, Path(bench))
    return total_s, policy, seed, tok, time.perf_counter() - t0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", default="20,40,80,160,320", help="trace lengths, seconds")
    ap.add_argument("--seeds", default="0,1")
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args(argv)
    lengths = [float(x) for x in args.lengths.split(",")]
    seeds = [int(x) for x in args.seeds.split(",")]
    started = time.perf_counter()
    profile = the_profile()
    print(
        f"# profile {PROFILE}; accept lengths a {ACCEPT['a']}, b {ACCEPT['b']} (as per-position "
        f"rates: a {[round(r, 3) for r in profile.acceptance.phases['a']]}, "
        f"b {[round(r, 3) for r in profile.acceptance.phases['b']]})"
    )
    daemon = harness_daemon()
    print(
        "# trace daemon (daemon_config): "
        + ", ".join(f"{k} {v:g}" for k, v in sorted(daemon.schedule.items()))
    )
    print(
        f"# requests: {PROMPT_TOKENS} prompt tokens, {OUTPUT_TOKENS} output tokens; seeds "
        f"{seeds}; shape " + ", ".join(f"{n} {s:g} x{c} {d}" for n, s, c, d in DEFAULT_SHAPE)
    )
    with tempfile.TemporaryDirectory() as tmp:
        bench = Path(tmp) / "bench"
        doc = write_bench(profile, bench)
        print(
            f"# bench (replayed, family a, {BENCH_SECONDS:g} s levels): table "
            f"{doc['recommended_table_text']}; flagged {len(doc['flagged_levels'])}"
        )
        table_from(bench)  # the trace's own reader takes it
        for lv in doc["results"]:
            print(
                f"#   {lv['series']:>7} c={lv['concurrency']:<4} {lv['output_tok_per_s']:8.0f} "
                f"tok/s  batch {lv['mean_batch'] or 0:6.1f}  step {lv['step_ms'] or 0:6.2f} ms"
            )
        jobs = [(t, p, s, str(bench)) for t in lengths for s in seeds for p in POLICIES]
        tok: dict[tuple[float, str], list[float]] = {}
        wall: dict[float, float] = {}
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            for t, p, _s, v, w in pool.map(_one, jobs):
                tok.setdefault((t, p), []).append(v)
                wall[t] = wall.get(t, 0.0) + w
    print()
    for t in lengths:
        print(f"# {t:g} s: --trace-phases {phases_text(default_trace(t))}")
    print()
    mean = {k: fmean(v) for k, v in tok.items()}
    head = f"{'policy':<18}" + "".join(f"{f'{t:g} s':>16}" for t in lengths)
    print("output tok/s, mean over seeds (ratio to the best static policy of that length)")
    print(head)
    best = {t: max(mean[(t, p)] for p in STATICS) for t in lengths}
    for p in POLICIES:
        print(
            f"{p:<18}"
            + "".join(f"{mean[(t, p)]:>9.0f} ({mean[(t, p)] / best[t]:.3f})" for t in lengths)
        )
    best_name = {t: max((mean[(t, p)], p) for p in STATICS)[1] for t in lengths}
    print(f"{'best static':<18}" + "".join(f"{best_name[t]:>16}" for t in lengths))
    print()
    print("ratio to bench-table")
    print(head)
    for p in ("daemon-from-bench", "daemon"):
        print(
            f"{p:<18}"
            + "".join(f"{mean[(t, p)] / mean[(t, 'bench-table')]:>16.3f}" for t in lengths)
        )
    print()
    for t in lengths:
        d = mean[(t, "daemon-from-bench")]
        e = mean[(t, "daemon")]
        yes = {True: "yes", False: "no"}
        print(
            f"{t:>5g} s: daemon-from-bench >= best static: {yes[d >= best[t]]} "
            f"({d / best[t]:.3f}), >= bench-table: {yes[d >= mean[(t, 'bench-table')]]} "
            f"({d / mean[(t, 'bench-table')]:.3f}); daemon (empty store) "
            f"{e / best[t]:.3f} / {e / mean[(t, 'bench-table')]:.3f}"
        )
    print()
    print(
        "# seconds of simulation per length (all policies and seeds): "
        + ", ".join(f"{t:g} s {wall[t]:.0f}" for t in lengths)
    )
    print(
        f"# total wall {time.perf_counter() - started:.0f} s, {args.jobs} processes, "
        f"{os.cpu_count()} CPUs visible"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
