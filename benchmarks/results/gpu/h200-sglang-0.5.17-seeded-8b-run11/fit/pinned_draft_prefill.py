"""The eleventh run's pooled fit with `draft.prefill_ms` (a speculative server's extra per
prefill) kept at the base's 0 instead of fitted: what the plain server's misfit at 4-64 streams
owes to that term. From the repository root (about 300 s on 2 CPUs):

    COLUMNS=200 python benchmarks/results/gpu/h200-sglang-0.5.17-seeded-8b-run11/fit/\
pinned_draft_prefill.py
"""

from collections.abc import Sequence
from pathlib import Path

from rich.console import Console

import sims.fit.fitting as fitting
from sims.fit.bench_file import Level, load_bench
from sims.fit.pool import Replayer
from sims.fit.report import Report, render, replay_rows
from sims.profile import load_profile

RUN = Path(__file__).resolve().parent.parent
PINNED = "draft.prefill_ms"


def main() -> None:
    fitted_keys = fitting.active_keys

    def keys_without_pinned(
        levels: Sequence[Level], extend_at_depth0: bool = True
    ) -> tuple[list[str], dict[str, str]]:
        keys, kept = fitted_keys(levels, extend_at_depth0)
        kept[PINNED] = "kept at the base's value for this comparison"
        return [k for k in keys if k != PINNED], kept

    fitting.active_keys = keys_without_pinned  # the one field the CLI cannot hold
    runs = [
        load_bench(RUN / name / "bench.json")
        for name in ("bench_family", "bench_family_2", "bench_family_3")
    ]
    base = load_profile("h200-llama8b-eagle3")
    with Replayer(jobs=2) as replayer:
        result = fitting.fit_profile(runs, base, "pinned", replayer=replayer, pool=True)
        limits = {run.path: run.request_limit for run in runs}
        outliers = [o.level for o in result.outliers]
        rows = replay_rows(result.profile, result.levels, limits, replayer, outliers)
    print(
        f"{PINNED} {result.profile.draft.prefill_ms:.3f} (kept), "
        f"scheduler.prefill_fixed_ms {result.profile.scheduler.prefill_fixed_ms:.3f}"
    )
    console = Console()
    for line in render(Report(result, base, rows, "pinned.yaml")):
        console.print(line)


if __name__ == "__main__":
    main()
