"""Evaluate the daemon on every built-in profile x scenario and seed; write docs/results/.

    .venv/bin/python benchmarks/evaluate_all.py [--seeds 0 1] [--jobs 2] [--out docs/results]
        [--profiles NAME ...] [--scenarios NAME ...] [--keep-others]

Per run: `<profile>__<scenario>__seed<k>.json` (what `specctl sim evaluate --json --traces`
prints), then `summary.json`, `summary.md` (the tables in docs/daemon.md) and `evaluation.png`
(achieved tok/s as a fraction of the oracle's, the daemon's against the best static policy of
the same run, and the worst change lag against its target). With `--keep-others`, a rerun of
some profiles or scenarios keeps the other runs' files already in `--out`, and the summary and
the plot cover them all (after a change that moves only those profiles' figures).

The baselines (static policies, two-tier grid, no-speculation server, oracle) do not depend on
the daemon: they are kept in `--cache` (default .cache/evaluate), keyed by a hash of the
profile, the scenario, the seed and the simulator's sources, so rerunning after a learner or
daemon change only reruns the daemon. A refitted profile or a changed simulator misses the
cache and recomputes them; `--no-cache` ignores it.

Targets (checked and printed, never enforced here), over every run:
- ratio to the oracle >= 0.985;
- better than every static policy on >= 80% of runs, and never more than 0.5% below one;
- a good table (within 2% of the oracle on the load of the moment) within 60 simulated seconds
  of any change of load or acceptance: the longest bad episode after the cold start
  (`table_lag.worst_change_lag_s`, controller/evaluation/table_lag.py) <= 60 s;
- exploration share <= 3%.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from controller.evaluation.evaluate import TWO_TIER_GRID, baselines, evaluate  # noqa: E402
from sims.profile import builtin_profiles, load_profile  # noqa: E402
from sims.workload import builtin_scenarios, load_scenario  # noqa: E402

RATIO_TARGET = 0.985
BEATS_SHARE_TARGET = 0.8
WORST_BELOW_STATIC = -0.005
LAG_TARGET_S = 60.0
EXPLORE_TARGET = 0.03


def baseline_key(profile: str, scenario: str, seed: int) -> str:
    """Hash of everything the baselines depend on (not the daemon, not the learner)."""
    h = hashlib.sha256()
    h.update(load_profile(profile).model_dump_json().encode())
    h.update(load_scenario(scenario).model_dump_json().encode())
    h.update(f"seed={seed};grid={TWO_TIER_GRID}".encode())
    for path in sorted([*(ROOT / "sims").rglob("*.py"), ROOT / "sglang_hooks" / "contract.py"]):
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _one(args: tuple[str, str, int, str | None]) -> dict[str, Any]:
    profile, scenario, seed, cache = args
    pre = None
    path = None
    if cache is not None:
        path = (
            Path(cache)
            / f"{profile}__{scenario}__{seed}__{baseline_key(profile, scenario, seed)}.json"
        )
        if path.exists():
            pre = json.loads(path.read_text())
    if pre is None:
        pre = baselines(load_profile(profile), load_scenario(scenario), seed)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(pre))
    return evaluate(profile, scenario, seed, precomputed=pre)


def targets_met(r: dict[str, Any]) -> dict[str, bool]:
    lag = r["table_lag"]
    return {
        "ratio": r["ratio_to_oracle"] is not None and r["ratio_to_oracle"] >= RATIO_TARGET,
        "beats_every_static": bool(r["beats_every_static"]),
        "within_0.5pct_of_best_static": r["vs_best_static"] >= WORST_BELOW_STATIC,
        "change_lag": lag["worst_change_lag_s"] <= LAG_TARGET_S,
        "exploration": r["exploration_share"] <= EXPLORE_TARGET,
    }


def summary_row(r: dict[str, Any]) -> dict[str, Any]:
    best = r["best_static"]
    lag = r["table_lag"]
    return {
        "profile": r["profile"],
        "scenario": r["scenario"],
        "seed": r["seed"],
        "achieved_tok_per_s": r["achieved_tok_per_s"],
        "oracle_tok_per_s": r["oracle_tok_per_s"],
        "ratio_to_oracle": r["ratio_to_oracle"],
        "best_static": best,
        "best_static_ratio": r["static_ratio_to_oracle"][best],
        "vs_best_static": r["vs_best_static"],
        "exploration_share": r["exploration_share"],
        "cold_start_s": lag["cold_start_s"],
        "worst_change_lag_s": lag["worst_change_lag_s"],
        "bad_time_share": lag["bad_time_share"],
        "pushes": r["pushes"],
        "time_to_good_table_s": r["time_to_good_table_s"],
        "drift_recovery_s": r.get("drift_recovery_s"),
        "final_table": r["final_table_text"],
        "thresholds_vs_oracle": r["thresholds_vs_oracle_at_10min"],
        "wall_s": r["wall_s"],
        "targets": targets_met(r),
    }


def overall(rows: list[dict[str, Any]]) -> dict[str, Any]:
    n = len(rows)
    beats = sum(r["targets"]["beats_every_static"] for r in rows)
    return {
        "runs": n,
        "ratio_min": min(r["ratio_to_oracle"] for r in rows),
        "ratio_ok": all(r["targets"]["ratio"] for r in rows),
        "beats_every_static_runs": beats,
        "beats_share": round(beats / n, 3) if n else 0.0,
        "beats_ok": n > 0 and beats / n >= BEATS_SHARE_TARGET,
        "worst_vs_best_static": min(r["vs_best_static"] for r in rows),
        "never_0.5pct_below_ok": all(r["targets"]["within_0.5pct_of_best_static"] for r in rows),
        "worst_change_lag_s": max(r["worst_change_lag_s"] for r in rows),
        "change_lag_runs_ok": sum(r["targets"]["change_lag"] for r in rows),
        "change_lag_ok": all(r["targets"]["change_lag"] for r in rows),
        "exploration_max": max(r["exploration_share"] for r in rows),
        "exploration_ok": all(r["targets"]["exploration"] for r in rows),
    }


def _mark(ok: bool) -> str:
    return "yes" if ok else "NO"


def markdown(rows: list[dict[str, Any]], total: dict[str, Any], command: str, wall: float,
             kept: int = 0) -> str:
    made = f"{total['runs']} runs" + (f", {kept} of them kept from the folder" if kept else "")
    lines = [
        f"Made by `{command}` in {wall / 60:.0f} minutes ({made}).",
        "",
        f"- ratio to the oracle >= {RATIO_TARGET}: {_mark(total['ratio_ok'])} "
        f"(lowest {total['ratio_min']:.4f})",
        f"- better than every static policy: {total['beats_every_static_runs']} of "
        f"{total['runs']} runs ({total['beats_share']:.0%}; target 80%): "
        f"{_mark(total['beats_ok'])}; never more than 0.5% below one: "
        f"{_mark(total['never_0.5pct_below_ok'])} (worst {total['worst_vs_best_static']:+.2%})",
        f"- good table within {LAG_TARGET_S:.0f} s of a change: {total['change_lag_runs_ok']} of "
        f"{total['runs']} runs: {_mark(total['change_lag_ok'])} "
        f"(worst {total['worst_change_lag_s']:.0f} s)",
        f"- exploration <= 3%: {_mark(total['exploration_ok'])} "
        f"(highest {total['exploration_max']:.2%})",
        "",
        "| profile | scenario | seed | daemon / oracle | best static (/ oracle) | vs best static "
        "| explore | cold start | worst change lag | bad time | pushes |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        t = r["targets"]
        lines.append(
            f"| {r['profile']} | {r['scenario']} | {r['seed']} | {r['ratio_to_oracle']:.4f}"
            f"{'' if t['ratio'] else ' (NO)'} | "
            f"{r['best_static']} ({r['best_static_ratio']:.4f}) | "
            f"{r['vs_best_static']:+.2%}{'' if t['beats_every_static'] else ' (NO)'} | "
            f"{r['exploration_share']:.2%} | {r['cold_start_s']:.0f} s | "
            f"{r['worst_change_lag_s']:.0f} s{'' if t['change_lag'] else ' (NO)'} | "
            f"{r['bad_time_share']:.1%} | {r['pushes']} |"
        )
    return "\n".join(lines) + "\n"


def plot(reports: list[dict[str, Any]], path: Path) -> None:
    """Two panels over the profile x scenario pairs (seeds as markers): tok/s against the
    oracle's for the daemon and the best static policy of the same run, and the worst change
    lag against its 60 s target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pairs = sorted({(r["profile"], r["scenario"]) for r in reports})
    x = {pair: i for i, pair in enumerate(pairs)}
    seeds = sorted({r["seed"] for r in reports})
    marks = ["o", "s", "^", "v"]
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(max(8, 0.34 * len(pairs) + 2), 7), sharex=True, height_ratios=[3, 2]
    )
    for r in reports:
        j, m = x[(r["profile"], r["scenario"])], marks[seeds.index(r["seed"]) % len(marks)]
        best = r["static_ratio_to_oracle"][r["best_static"]]
        top.scatter(j, best, color="0.55", marker=m, s=18, zorder=2)
        top.scatter(j, r["ratio_to_oracle"], color="tab:red", marker=m, s=26, zorder=3)
        bottom.scatter(j, r["table_lag"]["worst_change_lag_s"], color="tab:blue", marker=m, s=20)
    top.axhline(1.0, color="black", lw=0.8)
    top.axhline(RATIO_TARGET, color="tab:red", lw=0.8, ls="--")
    top.set_ylim(0.98, 1.006)
    top.set_ylabel("tok/s / oracle's")
    top.set_title(
        "daemon (red) and the best static policy of the same run (grey); seeds: "
        + ", ".join(f"{s} {marks[i % len(marks)]}" for i, s in enumerate(seeds))
    )
    bottom.axhline(LAG_TARGET_S, color="tab:blue", lw=0.8, ls="--")
    bottom.set_ylabel("worst change lag (s)")
    bottom.set_xticks(range(len(pairs)))
    bottom.set_xticklabels([f"{p} {s}" for p, s in pairs], rotation=90, fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "results")
    ap.add_argument("--profiles", nargs="*", default=None)
    ap.add_argument("--scenarios", nargs="*", default=None)
    ap.add_argument("--cache", type=Path, default=ROOT / ".cache" / "evaluate")
    ap.add_argument("--no-cache", action="store_true", help="recompute every baseline")
    ap.add_argument("--keep-others", action="store_true",
                    help="keep the other runs' files in --out; the summary covers them too")
    args = ap.parse_args()
    cache = None if args.no_cache else str(args.cache)
    runs = [
        (p, s, seed, cache)
        for p in (args.profiles or builtin_profiles())
        for s in (args.scenarios or builtin_scenarios())
        for seed in args.seeds
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        reports = list(pool.map(_one, runs))
    wall = time.monotonic() - t0
    for r in reports:
        (args.out / run_file(r)).write_text(json.dumps(r, indent=1))
    reports, kept = with_kept_runs(reports, args.out) if args.keep_others else (reports, [])
    rows = [summary_row(r) for r in reports]
    total = overall(rows)
    command = ("python benchmarks/evaluate_all.py " + " ".join(sys.argv[1:])).strip()
    (args.out / "summary.json").write_text(
        json.dumps(
            {
                "command": command,
                "seeds": args.seeds,
                "wall_s": round(wall),
                "overall": total,
                "rows": rows,
            },
            indent=1,
        )
    )
    text = markdown(rows, total, command, wall, kept=len(kept))
    (args.out / "summary.md").write_text(text)
    plot(reports, args.out / "evaluation.png")
    print(text)
    print(f"{len(reports) - len(kept)} evaluations in {wall:.0f} s -> {args.out}")


def run_file(report: dict[str, Any]) -> str:
    return f"{report['profile']}__{report['scenario']}__seed{report['seed']}.json"


def with_kept_runs(
    reports: list[dict[str, Any]], folder: Path
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(every run, the kept ones): `reports` with the other runs' files in `folder`, in
    profile, scenario and seed order."""
    fresh = {run_file(r) for r in reports}
    kept = [json.loads(path.read_text()) for path in sorted(folder.glob("*__*__seed*.json"))
            if path.name not in fresh]
    every = sorted([*reports, *kept], key=lambda r: (r["profile"], r["scenario"], r["seed"]))
    return every, kept


if __name__ == "__main__":
    main()
