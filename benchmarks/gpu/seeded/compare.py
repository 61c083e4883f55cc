"""Every policy of a trace results folder side by side: compare.md, compare.json, compare.png."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

OUTPUTS = ("compare.json",)
_PHASE_KEYS = ("tok_per_s", "tpot_p50_ms", "tpot_p90_ms", "table_after")


class CompareError(RuntimeError):
    pass


def load_results(folder: Path) -> list[dict[str, Any]]:
    runs = []
    for path in sorted(folder.glob("*.json")):
        if path.name in OUTPUTS:
            continue
        data = json.loads(path.read_text())
        if isinstance(data, dict) and "policy" in data and "total" in data:
            runs.append(data)
    if not runs:
        raise CompareError(f"{folder}: no trace results (<policy>.json from `trace run`) there")
    return runs


def _cell(value: Any, fmt: str = "{:.1f}") -> str:
    return "-" if value is None else fmt.format(value)


def markdown(runs: list[dict[str, Any]]) -> str:
    phases = [p["name"] for p in runs[0]["phases"]]
    head = ["policy", "tok/s", "TPOT p50 ms", "TPOT p90 ms", *[f"{n} tok/s" for n in phases],
            *[f"{n} TPOT p50/p90" for n in phases], "pushes", "final table"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for run in runs:
        by_name = {p["name"]: p for p in run["phases"]}
        cells = [run["policy"], _cell(run["total"]["tok_per_s"]),
                 _cell(run["total"]["tpot_p50_ms"]), _cell(run["total"]["tpot_p90_ms"])]
        cells += [_cell(by_name.get(n, {}).get("tok_per_s")) for n in phases]
        cells += [f"{_cell(by_name.get(n, {}).get('tpot_p50_ms'))}/"
                  f"{_cell(by_name.get(n, {}).get('tpot_p90_ms'))}" for n in phases]
        daemon = run.get("daemon")
        cells.append(str(daemon["push_count"]) if daemon else "-")
        cells.append(run.get("final_table") or "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "trace": runs[0]["trace"],
        "policies": {
            r["policy"]: {
                "total": r["total"],
                "phases": {
                    p["name"]: {k: p.get(k) for k in _PHASE_KEYS} for p in r["phases"]
                },
                "final_table": r.get("final_table"),
                "pushes": r["daemon"]["pushes"] if r.get("daemon") else None,
            }
            for r in runs
        },
    }


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    phases = [p["name"] for p in runs[0]["phases"]]
    fig, (ax_tok, ax_tpot) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    width = 0.8 / len(runs)
    for i, run in enumerate(runs):
        by_name = {p["name"]: p for p in run["phases"]}
        xs = [j + i * width for j in range(len(phases))]
        ax_tok.bar(xs, [by_name.get(n, {}).get("tok_per_s") or 0 for n in phases], width,
                   label=f"{run['policy']} ({run['total']['tok_per_s']:.0f} tok/s)")  # fmt: skip
        ax_tpot.bar(xs, [by_name.get(n, {}).get("tpot_p50_ms") or 0 for n in phases], width)
    ax_tok.set_ylabel("output tok/s")
    ax_tpot.set_ylabel("TPOT p50 (ms)")
    ax_tpot.set_xticks([j + 0.4 - width / 2 for j in range(len(phases))])
    concurrency = [p["concurrency"] for p in runs[0]["phases"]]
    datasets = [p["dataset"] for p in runs[0]["phases"]]
    ax_tpot.set_xticklabels([f"{n}\nc={c}, {d}" for n, c, d in zip(phases, concurrency, datasets,
                                                                    strict=True)])  # fmt: skip
    ax_tok.legend(fontsize=8)
    ax_tok.set_title("one load trace per policy")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def compare(folder: Path) -> str:
    runs = load_results(folder)
    if len({json.dumps(r["trace"]) for r in runs}) > 1:
        raise CompareError(f"{folder}: the runs used different traces; compare runs of one trace")
    table = markdown(runs)
    (folder / "compare.md").write_text(table + "\n")
    (folder / "compare.json").write_text(json.dumps(summary(runs), indent=2) + "\n")
    plot(runs, folder / "compare.png")
    return table + f"\n\nwrote {folder / 'compare.md'}, compare.json, compare.png"
