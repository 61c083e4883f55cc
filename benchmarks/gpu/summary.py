"""summary.json and summary.md: every step's outcome in one place, read from state.json."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.gpu import machine, server_log
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
    from benchmarks.gpu.steps import order  # the steps' package imports this module

    steps = state.data.get("steps", {})
    return {
        "run_dir": str(state.run_dir),
        "created_at": state.data.get("created_at"),
        "options": state.data.get("options"),
        "backend": state.data.get("backend"),
        "machine": state.data.get("machine"),
        "models": state.data.get("models"),
        "servers": {role: {k: v for k, v in s.items() if k != "argv"} | {
            "command": " ".join(s.get("argv", []))} for role, s in state.servers.items()},
        "server_info": state.data.get("server_info"),
        "steps": {name: steps[name] for name in order() if name in steps},
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
    lines = [f"Output tok/s per series and concurrency ({result.get('folder', 'bench')}/):", ""]
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


def _check_lines(result: dict[str, Any]) -> list[str]:
    lines: list[str] = []
    smoke, greedy, switch = (result.get(k) or {} for k in ("smoke", "greedy", "switch"))
    if smoke:
        lines += [f"Smoke test: {smoke.get('result') or smoke.get('error')}",
                  *[f"- {x}" for x in smoke.get("failed_checks", [])], ""]
    if greedy:
        lines += [f"Greedy check: {greedy.get('headline') or greedy.get('error')}", ""]
        lines += _md_table(
            ["mode", "identical", "flips", "first divergences", "pushes during requests"],
            [[c["mode"], f"{c['identical']}/{c['prompts']}", c["flips"],
              c["first_divergences"], c["pushes_during_requests"]]
             for c in greedy.get("comparisons", [])])
    if switch:
        lines += ["On/off switches under load:", "",
                  *[f"- {check_mark(ok)} {c}" for c, ok in (switch.get("checks") or {}).items()],
                  f"- pushes sent {switch.get('pushes_sent')}, latency ms "
                  f"{switch.get('push_latency_ms')}, load {switch.get('load')}",
                  f"- iterations by depth: {switch.get('iterations_by_depth')}",
                  *[f"- {v}" for v in (switch.get("memory") or {}).values()],
                  f"- greedy after: {switch.get('greedy_after')}", ""]
        if switch.get("error"):
            lines += [f"- error: {switch['error']}", ""]
    return lines


def _acceptance_lines(result: dict[str, Any]) -> list[str]:
    families = result.get("families") or {}
    depths = sorted({d for f in families.values() for d in f["accept_length"]}, key=int)
    lines = ["Accept length (tokens per request per verify):", ""]
    lines += _md_table(["family", *[f"depth {d}" for d in depths]],
                       [[name, *[f["accept_length"].get(d) for d in depths]]
                        for name, f in families.items()])
    spell = result.get("off_spell")
    if spell and spell["loss"] is None:
        lines.append(f"After {spell['off_tokens']} tokens at depth 0: not measured (no verify "
                     "was counted after the push: the requests ended first).\n")
    elif spell:
        lines.append(f"After {spell['off_tokens']} tokens at depth 0: accept length "
                     f"{spell['off_then_on']} at depth {spell['depth']}, against "
                     f"{spell['on_throughout']} drafted all along (loss {spell['loss']}).\n")
    return lines


def _parity_lines(result: dict[str, Any]) -> list[str]:
    verdict = result.get("verdict") or {}
    lines = [f"Series run by this command: {len(result.get('series', []))} "
             f"({result.get('folder')}/); the verdict pools "
             f"{verdict.get('series_judged', 0)} series "
             f"(`{result.get('folder')}/parity.txt`).", ""]
    if result.get("cut_by_budget"):
        lines += [result["cut_by_budget"], ""]
    lines += _md_table(
        ["streams", "depth 0 / plain tok/s", "90% interval", "runs", "TPOT p50 change",
         "orders weighed equally"],
        [[v["concurrency"], f"{v['pooled_ratio']:.3f}",
          "-" if not v.get("interval") else f"{v['interval'][0]:.3f}-{v['interval'][1]:.3f}",
          v["runs"], f"{v['tpot_change']:+.1%}",
          "-" if v.get("orders_equal_ratio") is None else f"{v['orders_equal_ratio']:.3f}"]
         for v in verdict.get("levels", [])])
    return lines


def _compare_lines(result: dict[str, Any]) -> list[str]:
    """specctl bench against SGLang's client, per level: each figure and their difference."""
    lines = [f"specctl bench and SGLang's bench_serving at depth {result.get('depth')}, the "
             "same prompts and load (`compare/compare.txt`).", ""]
    rows = [[streams, figure, v.get("specctl"), v.get("sglang"),
             "-" if v.get("relative") is None else f"{v['relative']:+.1%}"]
            for streams, figures in result.get("levels", {}).items()
            for figure, v in figures.items() if isinstance(v, dict) and "specctl" in v]
    return lines + _md_table(["streams", "figure", "specctl", "SGLang", "specctl / SGLang - 1"],
                             rows)


def _trace_lines(result: dict[str, Any]) -> list[str]:
    lines = [f"Phases {result.get('phases')}; every policy side by side in trace/compare.md.",
             ""]
    lines += _md_table(["policy", "tok/s", "TPOT p50 ms", "TPOT p90 ms", "exit"],
                       [[name, r.get("tok_per_s"), r.get("tpot_p50_ms"), r.get("tpot_p90_ms"),
                         r.get("returncode")] for name, r in result.get("policies", {}).items()])
    return lines


def _shapes_lines(result: dict[str, Any]) -> list[str]:
    lines = [f"Families {result.get('families')}, streams {result.get('streams')}; every "
             "figure in shapes/shapes.txt.", "", f"Verdict: {result.get('verdict')}", ""]
    lines += _md_table(["shape", "backend", "up in s", "GPU MiB at start", "error"],
                       [[name, e.get("backend"), e.get("start_seconds"),
                         e.get("gpu_used_mib_at_start"), e.get("error")]
                        for name, e in result.get("shapes", {}).items()])
    return lines


def _plugin_lines(info: dict[str, Any]) -> list[str]:
    """The plugin's block of each server's /server_info, as the plugin reports it."""
    lines: list[str] = []
    for role, fields in info.items():
        plugin = (fields or {}).get("specctl") if isinstance(fields, dict) else None
        if plugin:
            lines += [f"- {role}: " + json.dumps(plugin, sort_keys=True, default=str)]
    return ["## The plugin (/server_info)", "", *lines, ""] if lines else []


SECTIONS: dict[str, Callable[[dict[str, Any]], list[str]]] = {
    "acceptance": _acceptance_lines,
    "check": _check_lines,
    "bench": _bench_lines,
    "parity": _parity_lines,
    "compare": _compare_lines,
    "shapes": _shapes_lines,
    "trace": _trace_lines,
    "daemon": lambda r: [f"{r.get('samples_stored')} samples stored, {r.get('pushes')} "
                         f"pushes {r.get('push_outcomes')}; table at the end: "
                         f"{r.get('table_at_end')} ({r.get('table_source_at_end')})", "",
                         *[f"    {x}" for x in r.get("push_lines", [])], ""],
}


def markdown(summary: dict[str, Any]) -> str:
    lines = [f"# GPU harness run: {Path(summary['run_dir']).name}", "",
             f"Backend: {summary.get('backend')}; models: "
             f"{(summary.get('models') or {}).get('kind', '-')}; run folder: "
             f"`{summary['run_dir']}`", "", *machine.describe(summary.get("machine")), ""]
    steps = summary["steps"]
    lines += ["## Steps", ""]
    lines += _md_table(["step", "status", "seconds", "error"],
                       [[n, p.get("status"), p.get("elapsed_s"), p.get("error")]
                        for n, p in steps.items()])
    info = summary.get("server_info") or {}
    if info:
        keys = sorted({k for v in info.values() if isinstance(v, dict) for k in v} - {"specctl"})
        lines += ["## Servers (/server_info)", ""]
        roles = list(info)
        lines += _md_table(["field", *roles],
                           [[k, *[(info[r] or {}).get(k) for r in roles]] for k in keys])
    for role, server in (summary.get("servers") or {}).items():
        lines.append(f"- {role}: {server.get('url')}, pid {server.get('pid')}, up in "
                     f"{server.get('start_seconds', '-')} s: `{server.get('command')}`")
    lines.append("")
    lines += _plugin_lines(info)
    for name, render in SECTIONS.items():
        result = (steps.get(name) or {}).get("result")
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
    """summary.json and summary.md in the run folder, from its state."""
    summary = build(state)
    (state.run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    (state.run_dir / "summary.md").write_text(markdown(summary))
    return summary
