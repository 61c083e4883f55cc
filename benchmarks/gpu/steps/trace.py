"""`trace`: one closed-loop load trace per policy, then every policy of the run side by side.

Each policy runs `python -m benchmarks.gpu.seeded.trace run` (benchmarks/gpu/seeded/trace.py)
over the phases of --trace-phases: `static:D` (a one-tier table of depth D; `static:3x4x16` a
draft tree, on a server started with --spec-shapes; there `static:0` is off, with plain in
--spec-shapes), `sglang`
(control released to SGLang's own adaptive steps), `daemon` (`specctl daemon` learning from
nothing; its results are named daemon-cold), `daemon-warm` (the daemon again, from the store
the daemon run learned), `bench-table` (the table the run's bench recommended, pushed once and
kept), `daemon-from-bench` (the daemon starting from that bench, its `seed_bench`) and `plain`
(the plain server). The bench is --trace-bench, or the run's `bench` step's folder.

With --trace-repeats N every policy runs N times, the order reversed in every other repeat
(A B C, C B A, ...) so that none always goes first; a repeat's files end in -rK. Then `trace
compare` puts every run of trace/ side by side (compare.md, compare.json, compare.png), and
closed_loop.json lists each policy's tok/s per repeat with the GPU and the trace (trace.json
beside it). Where the bench recommended a one-tier table of depth D and static:D is in the list,
bench-table is not run again: the two push the same table, so static:D's runs are bench-table's
too (closed_loop.json lists them under both names and says so in `same_runs`). The trace's
dataset names (a, b) are the seeded pair's prompt families, or --trace-datasets.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.gpu import servers
from benchmarks.gpu.context import Run, StepError
from benchmarks.gpu.cpus import pinned_argv
from benchmarks.gpu.options import trace_datasets
from benchmarks.gpu.seeded import criterion
from benchmarks.gpu.seeded.compare import CompareError, compare, load_results
from benchmarks.gpu.seeded.trace import TraceError, parse_phases, table_from
from benchmarks.gpu.subproc import run_logged

COLD, WARM = "daemon-cold", "daemon-warm"
BENCH_TABLE, FROM_BENCH = "bench-table", "daemon-from-bench"
# closed_loop.json's name of each policy
CLOSED_LOOP_NAMES = {COLD: "daemon", "sglang": "sglang-adaptive"}


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


def run_bench(run: Run) -> Path:
    """The bench the bench policies start from: --trace-bench, else the run's bench step's."""
    given = run.opts.trace_bench
    folder = Path(given) if given else run.dir / "bench"
    if not (folder / "bench.json").is_file() and not folder.is_file():
        raise StepError(f"{BENCH_TABLE} and {FROM_BENCH} start from a bench of the server: run "
                        f"the bench step first, or give --trace-bench DIR (none at {folder})")
    return folder


def base_label(name: str) -> str:
    """The label of one --trace-policies entry, before any repeat suffix."""
    return {"daemon": COLD}.get(name, name.replace(":", "-"))


def policy_run(name: str, run: Run, out: Path, suffix: str = ""
               ) -> tuple[str, str, str, list[str]]:  # fmt: skip
    """(policy, url, label, extra arguments) of one --trace-policies entry; `suffix` ends the
    label of a repeat."""
    label = base_label(name) + suffix
    if name == "plain":
        return "plain", run.url(servers.PLAIN), label, []
    if name == "daemon":
        return "daemon", run.url(servers.SPEC), label, []
    if name == WARM:
        # the daemon run of this repeat, else the latest of any (a reversed repeat runs warm
        # before cold)
        stores = [out / f"{COLD}{suffix}.sqlite",
                  *sorted(out.glob(f"{COLD}*.sqlite"), key=lambda p: p.stat().st_mtime)[::-1]]
        store = next((p for p in stores if p.is_file()), None)
        if store is None:
            raise StepError(f"{WARM} starts from the store of the daemon policy's run: put "
                            "daemon before it in --trace-policies")
        return "daemon", run.url(servers.SPEC), label, ["--daemon-store", str(store)]
    if name == BENCH_TABLE:
        return "table", run.url(servers.SPEC), label, ["--table-from", str(run_bench(run))]
    if name == FROM_BENCH:
        return "daemon", run.url(servers.SPEC), label, ["--seed-bench", str(run_bench(run))]
    return name, run.url(servers.SPEC), label, []


def same_as_static(run: Run, policies: list[str]) -> str | None:
    """The static:D policy of the list that pushes the very table bench-table would (the
    bench recommended one tier of depth D), else None."""
    if BENCH_TABLE not in policies:
        return None
    try:
        table = table_from(run_bench(run))
    except (StepError, TraceError):
        return None  # bench-table's own run reports why it cannot run
    shapes = {t.shape for t in table.tiers}  # a chain's depth and a tree of the same steps differ
    probes = any(t.explore_share > 0 for t in table.tiers)
    if len(shapes) != 1 or probes:
        return None
    shape = shapes.pop()
    name = f"static:{0 if shape is None else shape.steps if shape.is_chain else shape.label}"
    return name if name in policies else None


def trace_cpus(bench_cpus: str, daemon_cpus: str) -> str:
    """The cores a trace run starts on: the bench's, and the daemon's where it has its own
    (a process can only pin a child to cores it may use itself; the run then keeps its load
    processes off the daemon's cores)."""
    return f"{bench_cpus},{daemon_cpus}" if bench_cpus and daemon_cpus else bench_cpus


def schedule(policies: list[str], repeats: int) -> list[tuple[int, str]]:
    """(repeat, policy) in run order: the policies' order reversed in every other repeat."""
    out = []
    for r in range(1, repeats + 1):
        out += [(r, name) for name in (policies if r % 2 else policies[::-1])]
    return out


def run_files(out: Path, phases: str) -> list[dict[str, Any]]:
    """Every run of this trace (these phases) in trace/, in the order they ran: a trace step
    split over several commands (a --budget cut, a resumed run) reports them all."""
    try:
        runs = load_results(out)
    except CompareError:
        return []
    want = [asdict(p) for p in parse_phases(phases)]
    return sorted((r for r in runs if r.get("trace") == want),
                  key=lambda r: float(r.get("trace_started_unix") or 0.0))


def policy_of(label: str) -> tuple[str, int]:
    """The --trace-policies name and the repeat of a run's label: static-1-r2 -> (static:1,
    2), daemon-cold -> (daemon, 1)."""
    base, _, repeat = label.rpartition("-r")
    if not (base and repeat.isdigit()):
        base, repeat = label, "1"
    name = "daemon" if base == COLD else (
        "static:" + base.removeprefix("static-") if base.startswith("static-") else base)
    return name, int(repeat)


def closed_loop_name(label: str) -> tuple[str, int]:
    """closed_loop.json's name of a run's label, and its repeat: static-1-r2 -> (static:1,
    2), sglang-r1 -> (sglang-adaptive, 1), daemon-cold -> (daemon, 1)."""
    name, repeat = policy_of(label)
    return CLOSED_LOOP_NAMES.get(base_label(name), name), repeat


def closed_loop(run: Run, result: dict[str, Any], out: Path) -> dict[str, Any]:
    """closed_loop.json: each policy's whole-trace tok/s per repeat, the GPU, the trace, from
    every run of the trace in `out`."""
    gpus = (run.state.data.get("machine") or {}).get("gpus") or []
    gpu = ", ".join(sorted({str(g.get("name")) for g in gpus if isinstance(g, dict)})) or None
    policies: dict[str, list[float]] = {}
    runs: list[dict[str, Any]] = []
    for doc in run_files(out, run.opts.trace_phases):
        label = str(doc.get("name") or doc["policy"])
        key, repeat = closed_loop_name(label)
        total = doc.get("total") or {}
        if total.get("tok_per_s") is None:
            continue
        policies.setdefault(key, []).append(total["tok_per_s"])
        runs.append({"policy": key, "repeat": repeat, "name": label,
                     **{k: total.get(k) for k in ("tok_per_s", "tpot_p50_ms", "tpot_p90_ms",
                                                  "tpot_p99_ms", "ttft_p99_ms")},
                     "final_table": doc.get("final_table"),
                     **({"pushes": doc["daemon"]["push_count"]} if doc.get("daemon") else {})})
    earlier_file = out / "closed_loop.json"  # what an earlier command of this trace found
    earlier = json.loads(earlier_file.read_text()) if earlier_file.is_file() else {}
    shared = {**(earlier.get("same_runs") or {} if earlier.get("phases") == run.opts.trace_phases
                 else {}), **(result.get("same_runs") or {})}
    same = {alias: source for alias, source in shared.items()
            if source in policies and alias not in policies}
    for alias, source in same.items():
        policies[alias] = list(policies[source])
    # the prompt file behind each dataset name: its stem names the family the acceptance
    # step measured (what the simulated trace replays it with, benchmarks/gpu/sim_trace)
    (out / "trace.json").write_text(json.dumps(
        {"phases": run.opts.trace_phases, "datasets": result["prompts_from"],
         "files": result.get("files", {})}, indent=1) + "\n")
    doc = {"gpu": gpu, "trace": "trace.json", "phases": run.opts.trace_phases,
           "repeats": max((r["repeat"] for r in runs), default=0),
           "order": [f"{r['policy']} (repeat {r['repeat']})" for r in runs],
           "policies": policies,
           # a policy whose runs are another's (bench-table pushing static:D's very table)
           **({"same_runs": same} if same else {}),
           # every run: its latency figures, the daemon's applied pushes, the table it ended on
           "runs": runs}
    try:  # the done-when of the closed loop, with the trace's own noise
        doc["criterion"] = [{**asdict(c), "verdict": c.verdict}
                            for c in criterion.comparisons(policies, same)]
        (out / "criterion.md").write_text(criterion.render(policies, same) + "\n")
    except criterion.CriterionError as err:
        doc["criterion"] = str(err)
    (out / "closed_loop.json").write_text(json.dumps(doc, indent=1) + "\n")
    return doc


def run(run: Run) -> dict[str, Any]:
    o = run.opts
    # the plain server only for the `plain` policy (--start-order spec starts none)
    run.require_servers(servers.SPEC, *([servers.PLAIN] if "plain" in o.trace_policies.split()
                                         else []))
    out = run.dir / "trace"
    out.mkdir(parents=True, exist_ok=True)
    phases = parse_phases(o.trace_phases)
    files, where = datasets(run, {p.dataset for p in phases})
    missing = sorted({p.dataset for p in phases} - set(files))
    if missing:
        raise StepError(f"the trace uses dataset {missing[0]!r}, which {where} lack: name "
                        "a file for it in --trace-datasets NAME=FILE,...")
    seconds = sum(p.seconds for p in phases)
    names = o.trace_policies.split()
    result: dict[str, Any] = {"phases": o.trace_phases, "prompts_from": where, "policies": {},
                              "order": [], "files": {k: str(v) for k, v in files.items()}}
    static = same_as_static(run, names)
    if static is not None:
        names.remove(BENCH_TABLE)
        result["same_runs"] = {BENCH_TABLE: static}
        run.say(f"  {BENCH_TABLE}: the bench recommended {static}'s one-tier table, so "
                f"{static}'s runs are {BENCH_TABLE}'s too")
    order = schedule(names, o.trace_repeats)
    failures: list[str] = []
    for repeat, name in order:
        if run.time_left() < seconds + 60:
            result["cut_by_budget"] = f"{name} (repeat {repeat}) and the runs after it left " \
                "out: the --budget is spent"
            run.say(f"  {result['cut_by_budget']}")
            break
        suffix = f"-r{repeat}" if o.trace_repeats > 1 else ""
        try:
            policy, url, label, extra = policy_run(name, run, out, suffix)
        except StepError as err:
            failures.append(str(err))
            run.say(f"  {name}: {err}")
            continue
        run.say(f"  trace under {label}: {len(phases)} phases, {seconds:g} s")
        argv = [sys.executable, "-m", "benchmarks.gpu.seeded.trace", "run", "--policy", policy,
                "--name", label, "--url", url, "--admin-key", run.admin_key,
                *[a for k, v in files.items() for a in ("--dataset", f"{k}={v}")],
                "--phases", o.trace_phases, "--client-processes", str(o.client_processes),
                "--out", str(out), *extra,
                *(["--daemon-cpus", o.trace_daemon_cpus]
                  if policy == "daemon" and o.trace_daemon_cpus else [])]
        done = run_logged(pinned_argv(trace_cpus(o.bench_cpus, o.trace_daemon_cpus
                                                 if policy == "daemon" else ""), argv),
                          out / f"{label}.txt", run.cap(seconds + 90))
        entry: dict[str, Any] = {"policy": name, "repeat": repeat,
                                 "returncode": done.returncode, "seconds": round(done.seconds, 1)}
        written = out / f"{label}.json"
        if done.returncode == 0 and written.is_file():
            doc = json.loads(written.read_text())
            total = doc.get("total") or {}
            entry |= {k: total.get(k) for k in ("tok_per_s", "tpot_p50_ms", "tpot_p90_ms",
                                                 "tpot_p99_ms", "ttft_p99_ms")}
            entry["final_table"] = doc.get("final_table")
            if doc.get("daemon"):
                entry["pushes"] = doc["daemon"]["push_count"]
            run.say(f"  {label}: {entry['tok_per_s']} tok/s, TPOT p50 {entry['tpot_p50_ms']} ms")
        else:
            tail = done.log.read_text(errors="replace").strip().splitlines()[-1:]
            failures.append(f"{label}: {tail[0] if tail else done.describe()}")
            run.say(f"  {label} FAILED: {failures[-1]}")
        result["policies"][label] = entry
        result["order"].append([repeat, name])
        run.state.step("trace").update(status="running", result=result)
        run.checkpoint()
    try:
        table = compare(out)
        (out / "compare.txt").write_text(table + "\n")
        result["compare"] = "trace/compare.md"
    except CompareError as err:
        failures.append(f"compare: {err}")
    result["closed_loop"] = closed_loop(run, result, out)["policies"]
    if failures:
        raise StepError("; ".join(failures), result)
    return result
