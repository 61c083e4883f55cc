"""summary.json and summary.md: every phase's outcome in one place, read from state.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.gpu import gpu_info, server_log
from benchmarks.gpu.options import PHASES
from benchmarks.gpu.state import RunState
from benchmarks.gpu.switch_stress import check_mark


def log_counts(state: RunState) -> dict[str, Any]:
    spec = state.servers.get("spec")
    if spec is None:
        return {}
    log = Path(spec["log"])
    windows = state.data.get("control_windows", [])
    counts = server_log.count_lines(log, windows)
    own = counts[server_log.SGLANG_OWN_CHOICE]["under_table"]
    return {
        "log": str(log),
        "control_windows": len(windows),
        "control_window_bytes": sum(b - a for a, b in windows),
        "lines": counts,
        "sglang_own_choice_under_table_ok": own == 0,
    }


def build(state: RunState) -> dict[str, Any]:
    phases = state.data.get("phases", {})
    return {
        "run_dir": str(state.run_dir),
        "created_at": state.data.get("created_at"),
        "options": state.data.get("options"),
        "backend": state.data.get("backend"),
        "gpus": state.data.get("gpus"),
        "models": state.data.get("models"),
        "servers": {role: {k: v for k, v in s.items() if k != "argv"} | {
            "command": " ".join(s.get("argv", []))} for role, s in state.servers.items()},
        "server_info": state.data.get("server_info"),
        "phases": {name: phases[name] for name in PHASES if name in phases},
        "sglang_log_lines": log_counts(state),
        "prefill_batches": {role: server_log.prefill_graph_counts(Path(s["log"]))
                            for role, s in state.servers.items() if s.get("log")},
        "commands": state.data.get("commands", []),
    }


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.1f}"
    return str(value).replace("|", "\\|").replace("\n", " ")


def _md_table(header: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    out += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return [*out, ""]


def _bench_lines(result: dict[str, Any]) -> list[str]:
    tok = result.get("tok_per_s") or {}
    series: dict[str, dict[str, float]] = {}
    concs: list[str] = []
    for key, value in tok.items():
        name, conc = key.split(" c=")
        series.setdefault(name, {})[conc] = value
        if conc not in concs:
            concs.append(conc)
    concs.sort(key=int)
    lines = ["Output tok/s per series and concurrency:", ""]
    lines += _md_table(["series", *concs],
                       [[name, *[vals.get(c) for c in concs]] for name, vals in series.items()])
    if result.get("levels_without_finished_requests"):
        lines.append("Levels where no request finished: "
                     + ", ".join(result["levels_without_finished_requests"]) + "\n")
    cross = "; ".join(f"{c['from']} -> {c['to']} at concurrency ~{c['concurrency']:g}"
                      for c in result.get("crossovers") or ()) or "none measured"
    lines.append(f"Crossovers: {cross}. Recommended table: "
                 f"{result.get('recommended_table') or '-'}\n")
    return lines


def markdown(summary: dict[str, Any]) -> str:
    lines = [f"# GPU end-to-end harness: {Path(summary['run_dir']).name}", "",
             f"Backend: {summary.get('backend')}; models: "
             f"{(summary.get('models') or {}).get('kind', '-')}; run folder: "
             f"`{summary['run_dir']}`", ""]
    if summary.get("backend") == "sglang":
        lines += [f"GPU: {gpu_info.describe(summary.get('gpus'))}", ""]
    phases = summary["phases"]
    lines += ["## Phases", ""]
    lines += _md_table(["phase", "status", "seconds", "error"],
                       [[n, p.get("status"), p.get("elapsed_s"), p.get("error")]
                        for n, p in phases.items()])
    info = summary.get("server_info") or {}
    if info:
        keys = sorted({k for v in info.values() if isinstance(v, dict) for k in v})
        lines += ["## Servers (/server_info)", ""]
        roles = list(info)
        lines += _md_table(["field", *roles],
                           [[k, *[(info[r] or {}).get(k) for r in roles]] for k in keys])
    for role, server in (summary.get("servers") or {}).items():
        lines.append(f"- {role}: {server.get('url')}, pid {server.get('pid')}, up in "
                     f"{server.get('start_seconds', '-')} s: `{server.get('command')}`")
    lines.append("")
    sections = {
        "smoke": lambda r: [f"{r.get('result')}", *[f"- {x}" for x in r.get("failed_checks", [])],
                            ""],
        "greedy": lambda r: [r.get("headline", ""), "", *_md_table(
            ["mode", "identical", "flips", "first divergences", "pushes during requests"],
            [[c["mode"], f"{c['identical']}/{c['prompts']}", c["flips"],
              c["first_divergences"], c["pushes_during_requests"]]
             for c in r.get("comparisons", [])])],
        "switch": lambda r: [*[f"- {check_mark(ok)} {c}" for c, ok in
                               (r.get("checks") or {}).items()],
                             f"- pushes sent {r.get('pushes_sent')}, latency ms "
                             f"{r.get('push_latency_ms')}, load {r.get('load')}",
                             f"- iterations by depth: {r.get('iterations_by_depth')}",
                             *[f"- {v}" for v in (r.get("memory") or {}).values()],
                             f"- greedy after: {r.get('greedy_after')}", ""],
        "bench": _bench_lines,
        "daemon": lambda r: [f"{r.get('samples_stored')} samples stored, {r.get('pushes')} "
                             f"pushes {r.get('push_outcomes')}; table at the end: "
                             f"{r.get('table_at_end')} ({r.get('table_source_at_end')})", "",
                             *[f"    {x}" for x in r.get("push_lines", [])], ""],
    }
    for name, render in sections.items():
        result = (phases.get(name) or {}).get("result")
        if result:
            lines += [f"## {name}", "", *render(result)]
    counts = summary.get("sglang_log_lines") or {}
    if counts:
        lines += ["## SGLang log lines (speculative server)", ""]
        lines += _md_table(["line", "in the whole log", "while a table held control"],
                           [[f'"{k}"', v["total"], v["under_table"]]
                            for k, v in counts["lines"].items()])
        verdict = "0, as it must be" if counts["sglang_own_choice_under_table_ok"] else \
            "NOT 0: SGLang changed depth on its own while a table ruled"
        lines.append(f"SGLang's own depth changes while a table held control: {verdict} "
                     f"({counts['control_window_bytes'] / 1024:,.0f} KiB of log in "
                     f"{counts['control_windows']} stretches were written under a table).\n")
    prefills = summary.get("prefill_batches") or {}
    if any(sum(c.values()) for c in prefills.values()):
        lines += ["## Prefill batches (SGLang's log)", ""]
        lines += _md_table(["server", "on the CUDA graph", "eager", "eager, one new token"],
                           [[role, c["graphed"], c["eager"], c["eager_one_token"]]
                            for role, c in prefills.items()])
        lines.append("A prompt the prefix cache holds whole leaves a one-token prefill, which "
                     "SGLang runs eager on a server without speculation.\n")
    return "\n".join(lines)


def write(state: RunState) -> dict[str, Any]:
    summary = build(state)
    (state.run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    (state.run_dir / "summary.md").write_text(markdown(summary))
    return summary
