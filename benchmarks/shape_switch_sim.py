"""A shape server switching by load against every static shape, on the profile fitted to run
30's bench of shapes (`benchmarks/shape_sim_check.py`: SGLang 0.5.17 on an H200, the chain
3x1x4, the trees 3x4x16 and 5x8x32, the plain server, families a and b, 1-256 streams):

1. per load, the best shape per load as a table, run on a server that captured the four
   shapes (plain as its off), over the best single shape there;
2. a closed loop stepping 1, 4, 16, 64, 128, 256 and back down: every static shape and the
   table over the same trace, whole-trace tok/s and the per-step geometric mean.

What `specctl sim shapes --closed-loop` prints, with its JSON and plot beside it:

    PYTHONPATH=. .venv/bin/python benchmarks/shape_switch_sim.py \
        [--profile FILE.yaml] [--step-s 60] [--out-prefix benchmarks/results/shape_switch_run30]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

from rich.console import Console

from sims.profile import load_profile
from sims.shape_sweep import ShapeSweepSpec, plot, render_tables, run_shape_sweep

HERE = Path(__file__).resolve().parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default=str(HERE / "results" / "shape_sim_run30.yaml"))
    parser.add_argument("--step-s", type=float, default=60.0)
    parser.add_argument("--duration-s", type=float, default=120.0)
    parser.add_argument("--out-prefix", default=str(HERE / "results" / "shape_switch_run30"))
    args = parser.parse_args()
    profile = load_profile(args.profile)
    assert profile.shapes is not None, "the profile describes no shapes"
    spec = ShapeSweepSpec(
        shapes=list(profile.shapes), phases=profile.shape_phases,
        streams=[1, 4, 16, 64, 128, 256], duration_s=args.duration_s, warmup_s=20.0,
        prompt_tokens=profile.reference_workload.prompt_tokens, output_tokens=(128, 384),
        seed=0, closed_loop_step_s=args.step_s,
    )  # fmt: skip
    start = time.perf_counter()
    result = run_shape_sweep(profile, spec)
    seconds = time.perf_counter() - start
    prefix = Path(args.out_prefix)
    console = Console(width=110, record=True)
    root = HERE.parent
    command = " ".join(os.path.relpath(a, root) if Path(a).exists() else a for a in sys.argv)
    console.print(f"$ PYTHONPATH=. .venv/bin/python {command}", highlight=False)
    console.print(f"# CPython {platform.python_version()}, {os.cpu_count()} cores visible, "
                  f"{seconds:.0f} s; profile {os.path.relpath(args.profile, root)}",
                  highlight=False)  # fmt: skip
    for table in render_tables(result):
        console.print(table)
    prefix.with_suffix(".txt").write_text(console.export_text())
    prefix.with_suffix(".json").write_text(json.dumps(result.to_json(), indent=1) + "\n")
    plot(result, prefix.with_suffix(".png"))


if __name__ == "__main__":
    main()
