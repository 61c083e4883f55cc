"""Can `specctl sim fit` reach a real H200 server? A design check on a stand-in for one.

Not a measurement of the real server: a profile built to show what SGLang 0.5.17 on an H200
showed against the shipped `h200-llama8b-eagle3` profile (an 8B target + EAGLE-3 head, FA3,
random weights so accept length 1, closed loop, 128-token prompts, 256-token outputs): the
plain step 4.74 ms at batch 1 (the profile's is 30% longer) and 11.2 ms at batch 128 (the
profile's 25% shorter), depth 3 at batch 1 5.89 ms (profile 40% longer), each extra depth 3.4%
of the step at low batch (the profile's twice that). Its bench (every depth 0-3 and the plain
server at concurrency 1-128) is replayed in the simulator, then fitted from the shipped
profile; the script prints the replay error of both and the time the fit took.

    .venv/bin/python benchmarks/fit_design_check.py [--seconds 30] [--jobs 1]
"""

from __future__ import annotations

import argparse
import os
import platform
import time

from sims.fit.fitting import fit_profile, frame
from sims.fit.pool import Replayer
from sims.fit.replayed_bench import replayed_bench
from sims.fit.report import replay_rows, summarize
from sims.profile import Profile, load_profile

SHIPPED = "h200-llama8b-eagle3"
CONCURRENCY = (1, 2, 4, 8, 16, 32, 64, 128)
DEPTHS = (0, 1, 2, 3)


def stand_in(shipped: Profile) -> Profile:
    data = shipped.model_dump()
    data["name"] = "h200-sglang-stand-in"
    data["target"].update(fixed_ms=0.7, weight_read_ms=3.3, per_req_us=31.0)
    data["draft"].update(
        step_fixed_ms=0.18, step_us_per_req=1.0, extend_fixed_ms=0.3, extend_us_per_req=1.0
    )
    data["scheduler"].update(
        prefill_fixed_ms=3.0, prefill_us_per_token=25.0, untimed_ms=0.3,
        max_running_requests_spec=128, max_running_requests_nospec=128,
        request_overhead_ms=1.5, request_overhead_cv=0.3, frontend_ms=0.3, ttft_overhead_ms=2.0,
    )  # fmt: skip
    data["acceptance"] = {"phases": {"random": [0.0] * 7}, "default_phase": "random"}
    return Profile.model_validate(data)


def pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="seconds per level")
    parser.add_argument("--jobs", type=int, default=1)
    args = parser.parse_args()
    shipped = load_profile(SHIPPED)
    truth = stand_in(shipped)
    print(
        f"# {platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} "
        f"cores visible, load average {os.getloadavg()[0]:.1f} at start (shared machine)"
    )
    print(f"# stand-in vs {SHIPPED}, decode step in ms at mean context 256:")
    for depth, batch in ((None, 1), (None, 128), (0, 1), (3, 1), (3, 128)):
        name = "plain" if depth is None else f"d{depth}"
        got, was = truth.iteration_ms(depth, batch, 256), shipped.iteration_ms(depth, batch, 256)
        print(f"#   {name} B={batch}: {float(got):.2f} (shipped {float(was):.2f})")
    run = replayed_bench(
        truth, depths=DEPTHS, concurrency=CONCURRENCY, prompt_tokens=128, output_tokens=256,
        seconds=args.seconds, name="stand-in",
    )  # fmt: skip
    with Replayer(args.jobs) as replayer:
        t0 = time.perf_counter()
        result = fit_profile([run], shipped, "fitted", replayer=replayer)
        fit_s = time.perf_counter() - t0
        limits = {run.path: None}
        fitted_rows = replay_rows(result.profile, result.levels, limits, replayer)
        shipped_rows = replay_rows(frame(shipped, [run], result.levels, "shipped"),
                                   result.levels, limits, replayer)  # fmt: skip
    print(f"# {len(result.levels)} levels of {args.seconds:g} s; fit {fit_s:.1f} s with "
          f"--jobs {args.jobs}, {result.evaluations} evaluations")  # fmt: skip
    print("profile   tok/s median  worst (at)             TPOT median  worst (at)")
    for label, rows in (("shipped", shipped_rows), ("fitted", fitted_rows)):
        tok, tpot = summarize(rows, "tok_per_s"), summarize(rows, "tpot_ms")
        assert tok is not None and tpot is not None
        print(f"{label:9s} {pct(tok.median):>12s} {pct(tok.worst):>6s} ({tok.worst_at:12s}) "
              f"{pct(tpot.median):>12s} {pct(tpot.worst):>6s} ({tpot.worst_at})")  # fmt: skip
    worst_step = max(
        abs(float(result.profile.iteration_ms(d, b, 256) / truth.iteration_ms(d, b, 256)) - 1)
        for d in (None, *DEPTHS)
        for b in CONCURRENCY
    )
    print(f"# worst decode-step error of the fit over depths and batches: {pct(worst_step)}; "
          f"untimed_ms {result.profile.scheduler.untimed_ms:.3f} (stand-in 0.3)")  # fmt: skip


if __name__ == "__main__":
    main()
