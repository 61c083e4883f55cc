"""`acceptance`: the served head's accept length per prompt family and depth, read from the
plugin's own counters (benchmarks/gpu/seeded/acceptance.py), and with --acceptance-off-spell
what a request that decoded its first tokens at depth 0 accepts once drafting resumes,
against the same requests drafted all along. The seeded pair's prompt families, or the run's
one set of prompts where it has none.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from benchmarks.gpu import servers
from benchmarks.gpu.context import Run, StepError
from benchmarks.gpu.options import int_list
from benchmarks.gpu.seeded import acceptance
from controller.bench.server_client import ServerError


def run(run: Run) -> dict[str, Any]:
    run.require_servers(servers.SPEC)
    o = run.opts
    families = list(run.families().values()) or [run.prompt_file()]
    try:
        measured = asyncio.run(acceptance.run(
            run.url(servers.SPEC), run.admin_key, families,
            int_list(o.acceptance_depths, "acceptance-depths"), o.acceptance_concurrency,
            o.acceptance_requests, o.acceptance_off_spell or None,
        ))  # fmt: skip
    except (acceptance.AcceptanceError, ServerError) as err:
        raise StepError(f"acceptance: {err}") from None
    out = run.dir / "acceptance"
    out.mkdir(parents=True, exist_ok=True)
    (out / "acceptance.json").write_text(json.dumps(measured, indent=2) + "\n")
    text = acceptance.render(measured)
    (out / "acceptance.txt").write_text(text + "\n")
    for line in text.splitlines():
        run.say("  " + line)
    result: dict[str, Any] = {
        "families": {name: {"accept_length": {str(r["depth"]): r["accept_length"]
                                              for r in fam["depths"]},
                            "per_position": fam["per_position"]}
                     for name, fam in measured["families"].items()},
    }
    if spell := measured.get("off_spell"):
        result["off_spell"] = {
            "off_tokens": spell["off_tokens"], "depth": spell["depth"],
            "on_throughout": spell["on_throughout"]["accept_length"],
            "off_then_on": spell["off_then_on"]["accept_length"], "loss": spell["loss"]}
    return result
