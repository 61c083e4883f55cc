"""`trace`: one closed-loop load trace per policy, then every policy of the run side by side.

Each policy runs `python -m benchmarks.gpu.seeded.trace run` (benchmarks/gpu/seeded/trace.py)
over the phases of --trace-phases: `static:D` (a one-tier table of depth D), `sglang`
(control released to SGLang's own adaptive steps), `daemon` (`specctl daemon` learning from
nothing; its results are named daemon-cold), `daemon-warm` (the daemon again, from the store
the daemon run learned) and `plain` (the plain server). Then `trace compare` puts every
policy of trace/ side by side (compare.md, compare.json, compare.png). The trace's dataset
names (a, b) are the seeded pair's prompt families, or --trace-datasets.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.gpu import servers
from benchmarks.gpu.context import Run, StepError
from benchmarks.gpu.cpus import pinned_argv
from benchmarks.gpu.options import trace_datasets
from benchmarks.gpu.seeded.compare import CompareError, compare
from benchmarks.gpu.seeded.trace import parse_phases
from benchmarks.gpu.subproc import run_logged

COLD, WARM = "daemon-cold", "daemon-warm"


def datasets(run: Run, names: set[str]) -> tuple[dict[str, Path], str]:
    """A prompt file for each dataset name the trace uses, and where they came from:
    --trace-datasets, else the seeded families, else the run's one set of prompts (its
    --dataset, or synthetic prompts) under every name."""
    given = trace_datasets(run.opts.trace_datasets)
    if given:
        return {k: Path(v) for k, v in given.items()}, "--trace-datasets"
    if run.families():
        return run.families(), "the seeded families"
    one = run.prompt_file()
    return dict.fromkeys(sorted(names), one), f"{one} under every name (no families)"


def policy_run(name: str, run: Run, out: Path) -> tuple[str, str, str, list[str]]:
    """(policy, url, label, extra arguments) of one --trace-policies entry."""
    if name == "plain":
        return "plain", run.url(servers.PLAIN), "plain", []
    if name == "daemon":
        return "daemon", run.url(servers.SPEC), COLD, []
    if name == WARM:
        store = out / f"{COLD}.sqlite"
        if not store.is_file():
            raise StepError(f"{WARM} starts from the store of the daemon policy's run: put "
                            "daemon before it in --trace-policies")
        return "daemon", run.url(servers.SPEC), WARM, ["--daemon-store", str(store)]
    return name, run.url(servers.SPEC), name.replace(":", "-"), []


def run(run: Run) -> dict[str, Any]:
    run.require_servers()
    o = run.opts
    out = run.dir / "trace"
    out.mkdir(parents=True, exist_ok=True)
    phases = parse_phases(o.trace_phases)
    files, where = datasets(run, {p.dataset for p in phases})
    missing = sorted({p.dataset for p in phases} - set(files))
    if missing:
        raise StepError(f"the trace uses dataset {missing[0]!r}, which {where} lack: name "
                        "a file for it in --trace-datasets NAME=FILE,...")
    seconds = sum(p.seconds for p in phases)
    result: dict[str, Any] = {"phases": o.trace_phases, "prompts_from": where, "policies": {}}
    failures: list[str] = []
    for name in o.trace_policies.split():
        if run.time_left() < seconds + 60:
            result["cut_by_budget"] = f"{name} and the policies after it left out: the " \
                "--budget is spent"
            run.say(f"  {result['cut_by_budget']}")
            break
        try:
            policy, url, label, extra = policy_run(name, run, out)
        except StepError as err:
            failures.append(str(err))
            run.say(f"  {name}: {err}")
            continue
        run.say(f"  trace under {label}: {len(phases)} phases, {seconds:g} s")
        argv = [sys.executable, "-m", "benchmarks.gpu.seeded.trace", "run", "--policy", policy,
                "--name", label, "--url", url, "--admin-key", run.admin_key,
                *[a for k, v in files.items() for a in ("--dataset", f"{k}={v}")],
                "--phases", o.trace_phases, "--out", str(out), *extra]
        done = run_logged(pinned_argv(o.bench_cpus, argv), out / f"{label}.txt",
                          run.cap(seconds + 90))
        entry: dict[str, Any] = {"returncode": done.returncode, "seconds": round(done.seconds, 1)}
        written = out / f"{label}.json"
        if done.returncode == 0 and written.is_file():
            total = json.loads(written.read_text()).get("total") or {}
            entry |= {k: total.get(k) for k in ("tok_per_s", "tpot_p50_ms", "tpot_p90_ms")}
            run.say(f"  {label}: {entry['tok_per_s']} tok/s, TPOT p50 {entry['tpot_p50_ms']} ms")
        else:
            tail = done.log.read_text(errors="replace").strip().splitlines()[-1:]
            failures.append(f"{label}: {tail[0] if tail else done.describe()}")
            run.say(f"  {label} FAILED: {failures[-1]}")
        result["policies"][label] = entry
        run.state.step("trace").update(status="running", result=result)
        run.checkpoint()
    try:
        table = compare(out)
        (out / "compare.txt").write_text(table + "\n")
        result["compare"] = "trace/compare.md"
    except CompareError as err:
        failures.append(f"compare: {err}")
    if failures:
        raise StepError("; ".join(failures), result)
    return result
