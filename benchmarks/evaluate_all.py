"""Evaluate the daemon on every built-in profile x scenario; write docs/results/.

    .venv/bin/python benchmarks/evaluate_all.py [--seed 0] [--jobs 2] [--out docs/results]

Per pair: `<profile>__<scenario>.json` (what `specctl sim evaluate --json --traces` prints),
then `summary.json` and `summary.md` (the table in docs/daemon.md) and `evaluation.png`
(achieved tok/s as a fraction of the oracle's: the daemon against every static policy).
Targets (checked, printed, never enforced here): ratio >= 0.97, better than every static
policy, thresholds within 15% of the oracle's material crossovers (where the wrong side costs
>= 1% tok/s) at 10 simulated minutes, and after a drift back to >= 0.95 of the oracle within 3
simulated minutes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from controller.evaluation.evaluate import evaluate  # noqa: E402
from sims.profile import builtin_profiles  # noqa: E402
from sims.workload import builtin_scenarios  # noqa: E402


def _one(args: tuple[str, str, int]) -> dict[str, Any]:
    profile, scenario, seed = args
    return evaluate(profile, scenario, seed)


def targets_met(r: dict[str, Any]) -> dict[str, bool | None]:
    material = [e for e in r["thresholds_vs_oracle_at_10min"] if e["material"]]
    thresholds: bool | None
    if not material:
        thresholds = None  # no crossover where the side matters by >= 1%: nothing to place
    else:
        thresholds = all(e["rel_error"] is not None and e["rel_error"] <= 0.15 for e in material)
    drift: bool | None = None
    if "drift_at_s" in r:
        rec = r.get("drift_recovery_s")
        drift = rec is not None and rec <= 180.0
    return {
        "ratio_ge_0.97": r["ratio_to_oracle"] is not None and r["ratio_to_oracle"] >= 0.97,
        "beats_every_static": r["beats_every_static"],
        "thresholds_within_15pct": thresholds,
        "drift_recovery_le_180s": drift,
    }


def summary_row(r: dict[str, Any]) -> dict[str, Any]:
    best = r["best_static"]
    return {
        "profile": r["profile"],
        "scenario": r["scenario"],
        "achieved_tok_per_s": r["achieved_tok_per_s"],
        "oracle_tok_per_s": r["oracle_tok_per_s"],
        "ratio_to_oracle": r["ratio_to_oracle"],
        "best_static": best,
        "best_static_ratio": r["static_ratio_to_oracle"][best],
        "exploration_share": r["exploration_share"],
        "time_to_good_table_s": r["time_to_good_table_s"],
        "drift_recovery_s": r.get("drift_recovery_s"),
        "final_table": r["final_table_text"],
        "thresholds_vs_oracle": r["thresholds_vs_oracle_at_10min"],
        "targets": targets_met(r),
    }


def _fmt_time(v: float | None) -> str:
    return "never" if v is None else f"{v:.0f} s"


def _mark(ok: bool | None) -> str:
    return "n/a" if ok is None else ("yes" if ok else "NO")


def markdown(rows: list[dict[str, Any]], command: str) -> str:
    lines = [
        f"Made by `{command}`.",
        "",
        "| profile | scenario | daemon / oracle | best static (/ oracle) | explore | "
        "first good table | drift recovery | >= 0.97 | beats statics | thresholds ±15% |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        t = r["targets"]
        drift = "-" if t["drift_recovery_le_180s"] is None else _fmt_time(r["drift_recovery_s"])
        lines.append(
            f"| {r['profile']} | {r['scenario']} | {r['ratio_to_oracle']:.3f} | "
            f"{r['best_static']} ({r['best_static_ratio']:.3f}) | "
            f"{r['exploration_share']:.1%} | {_fmt_time(r['time_to_good_table_s'])} | {drift} | "
            f"{_mark(t['ratio_ge_0.97'])} | {_mark(t['beats_every_static'])} | "
            f"{_mark(t['thresholds_within_15pct'])} |"
        )
    return "\n".join(lines) + "\n"


def plot(reports: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(reports)
    fig, ax = plt.subplots(figsize=(max(8, 0.9 * n + 3), 5))
    names = sorted({k for r in reports for k in r["static_ratio_to_oracle"]})
    for j, r in enumerate(reports):
        statics = r["static_ratio_to_oracle"]
        for name in names:
            if name in statics:
                ax.scatter(j, statics[name], color="0.6", s=14, zorder=2)
        ax.scatter(j, r["ratio_to_oracle"], color="tab:red", s=60, marker="D", zorder=3)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.axhline(0.97, color="tab:red", lw=0.8, ls="--")
    ax.set_xticks(range(n))
    ax.set_xticklabels(
        [f"{r['profile']}\n{r['scenario']}" for r in reports], rotation=60, ha="right", fontsize=7
    )
    ax.set_ylabel("achieved tok/s / oracle tok/s")
    ax.set_title("specctl daemon (red) vs static policies (grey), simulated")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "results")
    ap.add_argument("--profiles", nargs="*", default=None)
    ap.add_argument("--scenarios", nargs="*", default=None)
    args = ap.parse_args()
    pairs = [
        (p, s, args.seed)
        for p in (args.profiles or builtin_profiles())
        for s in (args.scenarios or builtin_scenarios())
    ]
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        reports = list(pool.map(_one, pairs))
    for r in reports:
        (args.out / f"{r['profile']}__{r['scenario']}.json").write_text(json.dumps(r, indent=1))
    rows = [summary_row(r) for r in reports]
    command = "python benchmarks/evaluate_all.py " + " ".join(sys.argv[1:])
    (args.out / "summary.json").write_text(
        json.dumps({"command": command.strip(), "seed": args.seed, "rows": rows}, indent=1)
    )
    (args.out / "summary.md").write_text(markdown(rows, command.strip()))
    plot(reports, args.out / "evaluation.png")
    print(markdown(rows, command.strip()))
    print(f"{len(reports)} evaluations in {time.monotonic() - t0:.0f} s -> {args.out}")


if __name__ == "__main__":
    main()
