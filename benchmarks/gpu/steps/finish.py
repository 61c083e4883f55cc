"""`summary` (both servers' /server_info as they are now, then summary.md and summary.json)
and `stop` (both servers' sessions ended)."""

from __future__ import annotations

from typing import Any

from benchmarks.gpu import server_info, servers, summary
from benchmarks.gpu.context import Run


def summarize(run: Run) -> dict[str, Any]:
    if run.state.servers and all(servers.healthy(url) for role in (servers.SPEC, servers.PLAIN)
                                 if (url := run.state.url(role))):
        server_info.record(run.state)  # the capacity fields as they are at the end
    written = summary.write(run.state)
    counts = written.get("sglang_log_lines") or {}
    return {"sglang_log_lines": counts.get("lines"),
            "sglang_own_choice_under_table_ok": counts.get("sglang_own_choice_under_table_ok")}


def stop(run: Run) -> dict[str, Any]:
    out = {}
    for role, entry in run.state.servers.items():
        outcome = servers.stop(int(entry["pid"]))
        entry["stopped"] = outcome
        out[role] = outcome
        run.say(f"  {role} (pid {entry['pid']}): {outcome}")
    run.state.save()
    return out
