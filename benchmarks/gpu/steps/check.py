"""`check`: the plugin's smoke test, the greedy lossless check, then the on/off switches under
load with the greedy check after.

Each part runs whatever the one before it found, and the step fails if any part did; its
result keeps every part's outcome. Greedy flips are reported, not fatal: random weights leave
small logit margins, where a numerically different kernel can flip an argmax.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from typing import Any

from benchmarks.gpu import servers
from benchmarks.gpu.context import Run, StepError
from benchmarks.gpu.greedy import RunResult, greedy_check, headline
from benchmarks.gpu.options import int_list
from benchmarks.gpu.subproc import run_logged
from benchmarks.gpu.switch_stress import StressPlan, check_mark, run_stress


def run(run: Run) -> dict[str, Any]:
    run.require_servers()
    parts: dict[str, Callable[[Run], dict[str, Any]]] = {
        "smoke": smoke, "greedy": greedy, "switch": switch}
    result: dict[str, Any] = {}
    failed: list[str] = []
    for name, part in parts.items():
        run.say(f"  -- {name}")
        try:
            result[name] = part(run)
        except Exception as err:  # recorded, and the next part still runs
            partial = err.result if isinstance(err, StepError) else None
            detail = str(err) if isinstance(err, StepError) else f"{type(err).__name__}: {err}"
            result[name] = {**(partial or {}), "error": detail}
            failed.append(f"{name}: {detail}" if not detail.startswith(name) else detail)
            run.say(f"  {name} FAILED: {detail}")
    if failed:
        raise StepError("; ".join(failed), result)
    return result


def smoke(run: Run) -> dict[str, Any]:
    argv = [sys.executable, "-m", "sglang_hooks.smoke", "--url", run.url(servers.SPEC),
            "--admin-key", run.admin_key, "--seconds-per-depth", f"{run.opts.smoke_seconds:g}"]
    timeout = 2 * (run.opts.smoke_seconds + 10) + 60
    done = run_logged(argv, run.dir / "smoke.txt", run.cap(timeout))
    text = done.log.read_text(errors="replace")
    last = [line for line in text.splitlines() if " passed, " in line]
    run.say("  " + (last[-1] if last else done.describe()))
    for line in text.splitlines():
        if line.startswith("FAIL"):
            run.say("  " + line)
    result = {"returncode": done.returncode, "seconds": round(done.seconds, 1),
              "result": last[-1] if last else None,
              "failed_checks": [x for x in text.splitlines() if x.startswith("FAIL")]}
    if done.returncode != 0:
        raise StepError(f"smoke: {result['result'] or done.describe()} (see smoke.txt)", result)
    return result


def _plain_reference(run: Run) -> RunResult | None:
    """The plain outputs the greedy check stored, if they answer the same prompts."""
    path = run.dir / "greedy_plain_outputs.json"
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    if data.get("prompts") != [p.name for p in run.greedy_prompts()] or \
            data.get("max_new_tokens") != run.opts.greedy_tokens:
        return None
    return RunResult("plain", outputs=data["outputs"], pushes_during=[0] * len(data["outputs"]))


def _deadline(run: Run) -> float | None:
    return None if run.deadline is None else time.monotonic() + run.time_left()


def greedy(run: Run) -> dict[str, Any]:
    prompts = run.greedy_prompts()
    report, plain = greedy_check(
        run.url(servers.SPEC), run.url(servers.PLAIN), run.admin_key, prompts,
        run.opts.greedy_tokens,
        switch_depths=int_list(run.opts.greedy_switch_depths, "greedy-switch-depths"),
        interval_s=run.opts.greedy_interval,
        fixed_depths=int_list(run.opts.greedy_fixed_depths, "greedy-fixed-depths"),
        deadline=_deadline(run),
    )  # fmt: skip
    (run.dir / "greedy_plain_outputs.json").write_text(json.dumps({
        "prompts": [p.name for p in prompts], "max_new_tokens": run.opts.greedy_tokens,
        "outputs": plain.outputs}) + "\n")
    (run.dir / "greedy_report.json").write_text(json.dumps(report, indent=2) + "\n")
    run.say("  " + headline(report))
    result = {k: v for k, v in report.items() if k != "comparisons"} | {
        "headline": headline(report),
        "comparisons": [{k: v for k, v in c.items() if k != "per_prompt"}
                        for c in report["comparisons"]],
    }
    switching = next(c for c in report["comparisons"] if c["mode"] == "spec-switching")
    if switching["pushes_during_requests"] == 0:
        run.say("  warning: no push landed during a request: raise --greedy-tokens or lower "
                "--greedy-interval to switch depth mid-request")
    pusher = report.get("pusher") or {}
    if pusher.get("failures"):
        raise StepError(f"greedy: {pusher['failures']} of the pusher's pushes failed, first: "
                        f"{pusher['first_failures'][0]}", result)
    return result


def switch(run: Run) -> dict[str, Any]:
    o = run.opts
    off, on = int_list(o.switch_depths, "switch-depths")
    plan = StressPlan(
        spec_url=run.url(servers.SPEC), plain_url=run.url(servers.PLAIN),
        admin_key=run.admin_key, server_pid=int(run.state.servers[servers.SPEC]["pid"]),
        switches=o.switches, interval_s=o.switch_interval, off_depth=off, on_depth=on,
        load_concurrency=o.switch_load, load_max_new_tokens=min(o.output_tokens, 64),
        probe_every=o.switch_probe_every, gpu_limit_mib=o.gpu_growth_limit_mib,
        rss_limit_mib=o.rss_growth_limit_mib, greedy_max_new_tokens=o.greedy_tokens,
        greedy_switch_depths=int_list(o.greedy_switch_depths, "greedy-switch-depths"),
        deadline=_deadline(run),
    )  # fmt: skip
    prompts = run.greedy_prompts()
    report = run_stress(plan, prompts, prompts, _plain_reference(run), progress=run.say)
    (run.dir / "switch_report.json").write_text(json.dumps(report, indent=2) + "\n")
    for check, ok in report["checks"].items():
        run.say(f"  {check_mark(ok)} {check}")
    run.say(f"  {report['memory']['gpu_used']}; {report['memory']['rss']}")
    summary = {k: v for k, v in report.items() if k not in ("memory", "greedy_after")}
    summary["memory"] = {k: v for k, v in report["memory"].items() if k != "samples"}
    summary["greedy_after"] = headline(report["greedy_after"])
    failed = [c for c, ok in report["checks"].items()
              if ok is False and not c.startswith("greedy")]
    if failed:
        raise StepError(f"switch stress: failed checks: {'; '.join(failed)}", summary)
    return summary
