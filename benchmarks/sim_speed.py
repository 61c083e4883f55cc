"""How fast the simulator runs: wall seconds for one simulated hour at 256 concurrent clients.

Target: under 5 s on one core for a simulated hour at 256 concurrent requests. Each case runs
`--repeats` times in this one process (single-threaded); the machine may be shared, so the
script prints the best and the median of the repeats, plus the decode/prefill iterations the
hour took (the work the engine did) and the achieved simulated throughput.

    .venv/bin/python benchmarks/sim_speed.py [--repeats 5] [--hours 1] [--concurrency 256]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from sims.engine import Engine
from sims.policies import FixedDepthPolicy
from sims.profile import builtin_profiles, load_profile
from sims.workload import Workload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--hours", type=float, default=1.0)
    parser.add_argument("--concurrency", type=int, default=256)
    args = parser.parse_args()
    sim_s = 3600 * args.hours
    print(
        f"# {platform.python_implementation()} {platform.python_version()}, "
        f"{platform.machine()}, {os.cpu_count()} cores visible, load average "
        f"{os.getloadavg()[0]:.1f} at start (other work shares this machine)"
    )
    print(
        f"# {args.hours:g} simulated hour(s), closed loop of {args.concurrency} clients, "
        f"{args.repeats} repeats per case; wall seconds best / median"
    )
    header = (
        f"{'profile':30s} {'server':22s} {'best_s':>7s} {'median_s':>8s} "
        f"{'decode_it':>9s} {'prefill_it':>10s} {'it/s (best)':>11s} {'sim tok/s':>9s}"
    )
    print(header)
    for name in builtin_profiles():
        profile = load_profile(name)
        cases = [
            ("eagle3 sglang-adaptive", True, None),
            (f"eagle3 fixed d{profile.full_depth}", True, profile.full_depth),
            ("no speculation", False, None),
        ]
        for label, speculative, depth in cases:
            walls = []
            engine = None
            for _ in range(args.repeats):
                policy = FixedDepthPolicy(depth) if depth is not None else None
                engine = Engine(
                    profile,
                    Workload.closed(args.concurrency),
                    seed=0,
                    speculative=speculative,
                    policy=policy,
                )
                t0 = time.perf_counter()
                engine.run_until(sim_s)
                walls.append(time.perf_counter() - t0)
            assert engine is not None
            st = engine.stats
            iters = st.decode_iterations + st.prefill_iterations
            best = min(walls)
            print(
                f"{name:30s} {label:22s} {best:7.2f} {statistics.median(walls):8.2f} "
                f"{st.decode_iterations:9d} {st.prefill_iterations:10d} "
                f"{iters / best:11.0f} {st.tokens_generated / st.now:9.1f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
