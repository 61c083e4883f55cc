"""Every policy of a trace results folder side by side: compare.md, compare.json, compare.png."""

from __future__ import annotations

import itertools
import json
import re
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


def _name(run: dict[str, Any]) -> str:
    """A run's row: its --name (e.g. daemon-warm), or its policy for results without one."""
    return str(run.get("name") or run["policy"])


def _cell(value: Any, fmt: str = "{:.1f}") -> str:
    return "-" if value is None else fmt.format(value)


def markdown(runs: list[dict[str, Any]]) -> str:
    phases = [p["name"] for p in runs[0]["phases"]]
    head = ["policy", "tok/s", "TPOT p50 ms", "TPOT p90 ms", "TPOT p99 ms", "TTFT p99 ms",
            *[f"{n} tok/s" for n in phases],
            *[f"{n} TPOT p50/p90" for n in phases], "pushes", "final table"]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for run in runs:
        by_name = {p["name"]: p for p in run["phases"]}
        cells = [_name(run), _cell(run["total"]["tok_per_s"]),
                 *[_cell(run["total"].get(k)) for k in ("tpot_p50_ms", "tpot_p90_ms",
                                                        "tpot_p99_ms", "ttft_p99_ms")]]
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
            _name(r): {
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


_REPEAT = re.compile(r"-r\d+$")


def policy_of(run: dict[str, Any]) -> str:
    """A run's policy row without its repeat suffix (daemon-cold-r2 -> daemon-cold)."""
    return _REPEAT.sub("", _name(run))


def _phase_rates(runs: list[dict[str, Any]], phases: list[str]) -> list[list[float]]:
    """Each run's tok/s per phase (0 where a phase is missing)."""
    return [[float({p["name"]: p for p in r["phases"]}.get(n, {}).get("tok_per_s") or 0.0)
             for n in phases] for r in runs]


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    """tok/s over the trace's time per policy (the mean of its repeats, their range shaded),
    and over the plain server's (or the first policy's) in the same phase; the daemon's pushes
    marked where it made them."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    trace = runs[0]["phases"]
    phases = [p["name"] for p in trace]
    edges = [0.0]
    for p in trace:
        edges.append(edges[-1] + float(p["seconds"]))
    groups: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        groups.setdefault(policy_of(run), []).append(run)
    base_name = "plain" if "plain" in groups else next(iter(groups))
    base = [sum(col) / len(col) for col in zip(*_phase_rates(groups[base_name], phases),
                                                strict=True)]  # fmt: skip
    fig, (ax_tok, ax_rel) = plt.subplots(2, 1, figsize=(11, 7.5), sharex=True)
    for name, members in groups.items():
        rates = _phase_rates(members, phases)
        mean = [sum(col) / len(col) for col in zip(*rates, strict=True)]
        low = [min(col) for col in zip(*rates, strict=True)]
        high = [max(col) for col in zip(*rates, strict=True)]
        total = sum(r["total"]["tok_per_s"] for r in members) / len(members)
        label = f"{name} ({total:,.0f} tok/s, {len(members)} run{'s' * (len(members) > 1)})"
        line = ax_tok.stairs(mean, edges, label=label, linewidth=1.6, baseline=None)
        colour = line.get_edgecolor()
        ax_tok.stairs(high, edges, baseline=low, fill=True, alpha=0.15, color=colour)
        rel = [m / b if b > 0 else 0.0 for m, b in zip(mean, base, strict=True)]
        ax_rel.stairs(rel, edges, linewidth=1.6, color=colour, baseline=None)
        for run in members:
            start = run.get("trace_started_unix")
            pushes = (run.get("daemon") or {}).get("pushes") or []
            if start is None:
                continue
            ts = [p["t"] - start for p in pushes if p.get("outcome") == "applied"
                  and 0 <= p["t"] - start <= edges[-1]]  # fmt: skip
            ax_rel.plot(ts, [0.02 + 0.03 * list(groups).index(name)] * len(ts), "|",
                        color=colour, markersize=9, transform=ax_rel.get_xaxis_transform())
    ax_tok.set_yscale("log")
    ax_tok.set_ylabel("output tok/s (log)")
    ax_rel.axhline(1.0, color="grey", linewidth=0.8)
    ax_rel.set_ylabel(f"over {base_name}")
    ax_rel.set_xlabel("trace time (s); ticks at the bottom: the daemons' applied pushes")
    for ax in (ax_tok, ax_rel):
        for x in edges[1:-1]:
            ax.axvline(x, color="grey", linewidth=0.4, linestyle=":")
    for (a, b), p in zip(itertools.pairwise(edges), trace, strict=True):  # phases on top
        ax_tok.text((a + b) / 2, 1.01, f"c={p['concurrency']} {p['dataset']}", fontsize=8,
                    ha="center", va="bottom", transform=ax_tok.get_xaxis_transform())
    ax_tok.legend(fontsize=7, loc="lower right")
    ax_tok.set_title("one load trace per policy: tok/s per phase over the trace's time", pad=18)
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
