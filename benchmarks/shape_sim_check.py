"""The simulator's draft shapes against the measurement: `specctl sim fit --shapes` on run 30's
bench of shapes (SGLang 0.5.17 on an H200: the chain 3x1x4, the trees 3x4x16 and 5x8x32 and the
plain server, prompt families a and b, 1-256 closed-loop streams, 4 s windows), then

1. every level replayed on the fitted profile with the bench's protocol (three seeds): per
   shape x family x load, measured tok/s, simulated tok/s and the error; the median and worst
   error over the levels the bench did not flag;
2. the best shape per family and load: measured (over the unflagged levels, as the shapes
   report decides) against the replays of the same shapes, and against `specctl sim shapes`
   (every shape, steady state, the bench's request shape), the table a policy would use.

    PYTHONPATH=. .venv/bin/python benchmarks/shape_sim_check.py \
        [--shapes DIR] [--base PROFILE] [--profile-out FILE.yaml] [--plot FILE.png]
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from benchmarks.gpu import shape_report
from controller.bench.level_flags import level_flags
from sims.fit.profile_file import with_shape_provenance, write_profile
from sims.fit.shape_check import render, replay_rows
from sims.fit.shape_fit import family_requests, fit_shapes
from sims.fit.shape_folder import load_shapes
from sims.profile import load_profile
from sims.shape_sweep import ShapeSweepSpec, plot, run_shape_sweep

RUN30 = Path("benchmarks/results/gpu/h200-sglang-0.5.17-seeded-8b-run30/shapes")
STEADY_S = 60.0  # simulated seconds per steady-state point, after 10 s of warm-up


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", type=Path, default=RUN30)
    ap.add_argument("--base", default="h200-sglang-llama8b-seeded")
    ap.add_argument("--profile-out", type=Path, default=None)
    ap.add_argument("--plot", type=Path, default=None)
    args = ap.parse_args()
    print(f"# {platform.python_implementation()} {platform.python_version()}, "
          f"{os.cpu_count()} cores visible, load average {os.getloadavg()[0]:.1f} at start")
    bench = load_shapes(args.shapes, level_flags)
    base = load_profile(args.base)
    t0 = time.perf_counter()
    fit = fit_shapes(bench, base, "h200-sglang-llama8b-shapes-run30")
    fit.profile = with_shape_provenance(fit, bench, base)
    print(f"# fitted onto {args.base} from {args.shapes}: {len(fit.fitted)} levels, "
          f"{len(fit.left_out)} left out, {fit.rounds} rounds, "
          f"{time.perf_counter() - t0:.1f} s")
    if args.profile_out is not None:
        write_profile(fit.profile, args.profile_out)
        print(f"# profile written to {args.profile_out}")
    print()
    rows = replay_rows(fit.profile, bench)
    for line in render(rows, fit):
        print(line)
    for note in fit.notes:
        print(f"note: {note}")

    # The steady-state table `specctl sim shapes` prints, on the bench's request shape.
    requests = family_requests(bench)
    first = requests[bench.families[0]]
    streams = sorted({sl.level.concurrency for sl in bench.levels})
    spec = ShapeSweepSpec(shapes=bench.shapes, phases=bench.families, streams=streams,
                          duration_s=STEADY_S, warmup_s=10.0, prompt_tokens=first.prompt_tokens,
                          output_tokens=first.output_range or first.output_tokens)  # fmt: skip
    steady = run_shape_sweep(fit.profile, spec)
    figures = shape_report.load(args.shapes)
    measured = shape_report.analyse(figures, bench.shapes)
    print()
    print(f"best shape per load, bench / `specctl sim shapes` (every shape, {STEADY_S:g} s "
          "steady state; bench: its unflagged levels)")
    agree = total = 0
    for family in bench.families:
        cells = []
        for lv in measured["families"][family]["levels"]:
            s = lv["streams"]
            best = steady.best(family, s)
            sim = "?" if best is None else best.shape
            total += 1
            agree += sim == lv["best"]
            note = ""
            if sim != lv["best"]:
                ran = figures.get(sim, {}).get(family, {}).get(s, {})
                won = figures[lv["best"]][family][s]["output_tok_per_s"]
                note = " (differs)" if ran.get("flags") or not ran else \
                    f" (differs: the bench ran it {won / ran['output_tok_per_s'] - 1:.1%} slower)"
            cells.append(f"c={s} {lv['best']}/{sim}{note}")
        print(f"  {family}: " + ", ".join(cells))
        print(f"  {family}: simulated table {steady.best_line(family)}")
    print(f"  {agree} of {total} agree")
    if args.plot is not None:
        plot(steady, args.plot)
        print(f"# plot written to {args.plot}")


if __name__ == "__main__":
    main()
