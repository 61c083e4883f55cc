"""One closed-loop load trace run against a server under a chosen policy, and its report.

    python -m benchmarks.gpu.seeded.trace run --policy daemon --url http://127.0.0.1:30000 \
        --dataset a=DIR/family_a.jsonl --dataset b=DIR/family_b.jsonl --seconds 48 --out RESULTS
    python -m benchmarks.gpu.seeded.trace compare RESULTS

The trace is a list of phases (seconds, concurrency, dataset), run back to back with the
bench's load generator (controller/bench/loadgen.py): `--seconds` scales the default one
(DEFAULT_SHAPE: low load, a ramp into saturation at 256 streams, a dip, a flash crowd that
drifts from family a to family b, and back), or
`--phases 5:2:a,5:64:a,...` gives one outright. Policies:

- `plain`: `--url` is a server without speculation; nothing is pushed.
- `static:D`: a one-tier table of depth D is pushed for the whole trace; `static:TREE` (like
  `static:3x4x16`) the same for a draft tree a shape server captured (`specctl serve --shapes`).
- `static:D+scrape`: the same, while a thread reads /metrics as often as the trace's daemon
  scrapes it (benchmarks/gpu/seeded/scrape_load.py): what the scrapes alone cost the server,
  and how long it takes to render the page under load (`metrics_reads` in the result).
- `sglang`: control is released (`specctl_tiers: 0`): SGLang's own adaptive choice of steps.
- `table`: the table of `--table-from PATH` is pushed once and kept for the whole trace: the
  table a `specctl bench` recommended (its `--out` folder or bench.json), or a policy file's
  (`specctl freeze`); what a user who benches and freezes runs.
- `daemon`: `specctl daemon` runs against the server for the trace (config written here,
  intervals of seconds); `--daemon-store FILE` starts it from a copy of a store learned
  earlier (e.g. the harness's daemon step on the same model pair), `--seed-bench PATH` from a
  `specctl bench` of the server (its `seed_bench`), else from nothing.

A phase of at least `--client-processes` streams (default 4) is carried by that many load
processes, as `specctl bench` splits a level: one event loop cannot read the streams of a
saturated server fast enough, and the trace would measure the client.

Each run writes RESULTS/<policy>.json: output tok/s and TPOT p50/p90 for the whole trace and
per phase, the table live after each phase, and for the daemon its pushes and final table.
The table live before a run is pushed back after it. `--name` names a run's files and its row
(e.g. `--name daemon-warm` for a second daemon run from the first one's store).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.gpu.cpus import CpuListError, parse_cpu_list, pinned_argv
from benchmarks.gpu.daemon_run import (
    SCRAPE_INTERVAL_S,
    daemon_config,
    read_pushes,
    write_config,
)
from benchmarks.gpu.seeded.compare import CompareError, compare
from benchmarks.gpu.seeded.scrape_load import MetricsReader, split_policy
from controller.bench.load_processes import LoadProcesses
from controller.bench.loadgen import ClosedLoop, LevelLoad, StopRule, make_client, run_level
from controller.bench.prompts import DatasetError, Prompt, load_dataset
from controller.bench.server_client import ServerClient, ServerError, admin_key_from_env
from controller.daemon.bench_seed import BenchSeedError, bench_path, read_bench
from sglang_hooks.contract import (
    PolicyError,
    PolicyTable,
    parse_table,
    shape_tier,
    single_depth_table,
)
from sglang_hooks.draft_shape import DraftShape, ShapeError, parse_shape
from sglang_hooks.policy_file import load_policy_file

# (name, share of the trace, concurrency, dataset): low load, a ramp into saturation at 256
# streams, a dip, then a flash crowd whose traffic has drifted to the family the head predicts
# worse, settling at 128, and back to the first family. The crowd on b is the longest phase:
# there a table benched on family a must change.
DEFAULT_SHAPE = (
    ("low", 0.06, 1, "a"),
    ("ramp", 0.09, 64, "a"),
    ("saturation", 0.18, 256, "a"),
    ("dip", 0.06, 4, "a"),
    ("flash-drift", 0.33, 256, "b"),
    ("settle", 0.14, 128, "b"),
    ("back", 0.14, 64, "a"),
)
DAEMON_START_WAIT_S = 4.0  # lets the daemon take its first scrape before the load starts


class TraceError(RuntimeError):
    """Bad options or a server that cannot run the policy; the message says what to change."""


@dataclass(frozen=True)
class Phase:
    name: str
    seconds: float
    concurrency: int
    dataset: str


def default_trace(total_s: float) -> list[Phase]:
    """DEFAULT_SHAPE at `total_s` seconds, each phase its share (rounded to 0.01 s)."""
    if total_s < 12:
        raise TraceError(f"--seconds {total_s:g}: the default trace needs at least 12 s")
    return [Phase(n, round(share * total_s, 2), c, d) for n, share, c, d in DEFAULT_SHAPE]


def phases_text(phases: Sequence[Phase]) -> str:
    """`phases` as --phases (and the harness's --trace-phases) take them."""
    return ",".join(f"{p.seconds:g}:{p.concurrency}:{p.dataset}" for p in phases)


def parse_phases(text: str) -> list[Phase]:
    """'secs:concurrency:dataset,...' (e.g. '6:2:a,10:128:a,8:4:b')."""
    phases = []
    for i, part in enumerate(p for p in text.split(",") if p.strip()):
        fields = part.strip().split(":")
        try:
            secs, conc, data = float(fields[0]), int(fields[1]), fields[2]
        except (ValueError, IndexError):
            raise TraceError(f"--phases item {i + 1} {part!r}: write seconds:concurrency:dataset, "
                             "e.g. 6:2:a") from None  # fmt: skip
        if secs <= 0 or conc < 1:
            raise TraceError(f"--phases item {i + 1} {part!r}: seconds must be > 0 and "
                             "concurrency >= 1")  # fmt: skip
        phases.append(Phase(f"p{i + 1}-{conc}-{data}", secs, conc, data))
    if not phases:
        raise TraceError("--phases is empty: give e.g. 6:2:a,10:128:a")
    return phases


def parse_policy(text: str) -> tuple[str, int | DraftShape | None]:
    """(kind, what a static policy holds: a depth, or a draft tree on a shape server)."""
    if text in ("daemon", "sglang", "plain", "table"):
        return text, None
    if text.startswith("static:"):
        held = text.split(":", 1)[1]
        if held.isdigit():
            return "static", int(held)
        with contextlib.suppress(ShapeError):
            shape = parse_shape(held)
            if shape is not None and not shape.is_chain:
                return "static", shape
    raise TraceError(f"--policy {text!r}: use daemon, sglang, plain, table, static:D, "
                     "static:TREE or static:D+scrape (e.g. static:3, static:3x4x16)")


def table_from(path: Path) -> PolicyTable:
    """The table a bench recommended (its folder or bench.json), or a policy file's table."""
    bench = bench_path(path)
    if bench.suffix == ".json" and bench.is_file():
        try:
            doc = json.loads(bench.read_text())
        except (OSError, ValueError) as err:
            raise TraceError(f"--table-from {path}: not readable as JSON ({err})") from None
        if isinstance(doc, dict) and "recommended_table" in doc:
            if doc["recommended_table"] is None:
                raise TraceError(f"--table-from {path}: the bench recommended no table (its "
                                 "report says why); bench again, or give a policy file")
            try:
                return parse_table(doc["recommended_table"])
            except PolicyError as err:
                raise TraceError(f"--table-from {path}: recommended_table: {err}") from None
    try:
        return load_policy_file(path)
    except PolicyError as err:
        raise TraceError(f"--table-from {path}: {err}") from None


def _percentile_ms(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return round(1000.0 * ordered[index], 2)


def tpot_values(loads: Sequence[LevelLoad]) -> list[float]:
    """TPOT of every request with two tokens or more (a request cut at a phase's end counts
    over the tokens it got)."""
    return [r.tpot_s for load in loads for r in load.requests if r.tpot_s is not None]


def request_shape(load: LevelLoad) -> dict[str, Any]:
    """The phase's requests: mean prompt tokens as the server counted them, and the output
    tokens asked (what a simulated replay of the trace sends, benchmarks/gpu/sim_trace)."""
    prompts = [r.prompt_tokens for r in load.requests if r.prompt_tokens is not None]
    asked = [r.max_tokens for r in load.requests if r.max_tokens is not None]
    return {
        "prompt_tokens_mean": round(sum(prompts) / len(prompts), 1) if prompts else None,
        "max_tokens_mean": round(sum(asked) / len(asked), 1) if asked else None,
        "max_tokens_min": min(asked, default=None),
        "max_tokens_max": max(asked, default=None),
    }


def summarize_phase(phase: Phase, load: LevelLoad) -> dict[str, Any]:
    tpots = tpot_values([load])
    ttfts = [r.ttft_s for r in load.requests if r.ttft_s is not None]
    return {
        **asdict(phase),
        **request_shape(load),
        "elapsed_s": round(load.elapsed_s, 2),
        "tokens": load.tokens,
        "tok_per_s": round(load.output_tok_per_s, 1),
        "completed": len(load.completed),
        "errors": len(load.errors),
        "client_processes": len(load.process_cpu_s) or 1,
        "tpot_p50_ms": _percentile_ms(tpots, 0.5),
        "tpot_p90_ms": _percentile_ms(tpots, 0.9),
        "tpot_p99_ms": _percentile_ms(tpots, 0.99),
        "ttft_p50_ms": _percentile_ms(ttfts, 0.5),
        "ttft_p99_ms": _percentile_ms(ttfts, 0.99),
    }


def summarize_trace(loads: Sequence[LevelLoad]) -> dict[str, Any]:
    tokens = sum(load.tokens for load in loads)
    seconds = sum(load.elapsed_s for load in loads)
    tpots = tpot_values(loads)
    ttfts = [r.ttft_s for load in loads for r in load.requests if r.ttft_s is not None]
    return {
        "tokens": tokens,
        "seconds": round(seconds, 2),
        "tok_per_s": round(tokens / seconds, 1) if seconds > 0 else 0.0,
        "tpot_p50_ms": _percentile_ms(tpots, 0.5),
        "tpot_p90_ms": _percentile_ms(tpots, 0.9),
        "tpot_p99_ms": _percentile_ms(tpots, 0.99),
        "ttft_p99_ms": _percentile_ms(ttfts, 0.99),
        "requests": sum(len(load.requests) for load in loads),
        "errors": sum(len(load.errors) for load in loads),
    }


def split_phases(phases: Sequence[Phase], processes: int) -> set[str]:
    """The datasets whose phases some worker processes carry: a phase of at least `processes`
    streams is split across them, as `specctl bench --client-processes` splits a level (one
    event loop reading 256 streams capped a plain server's measured tok/s at 13.2k of the 22.8k
    it decoded); fewer streams run in this process."""
    if processes < 2:
        return set()
    return {p.dataset for p in phases if p.concurrency >= processes}


async def _run_phases(
    url: str, phases: Sequence[Phase], prompts: dict[str, list[Prompt]], model: str,
    server: ServerClient | None, pools: dict[str, LoadProcesses],
) -> tuple[list[LevelLoad], list[dict[str, Any]]]:  # fmt: skip
    loads: list[LevelLoad] = []
    rows: list[dict[str, Any]] = []
    offsets = dict.fromkeys(prompts, 0)
    def in_process(phase: Phase) -> bool:
        pool = pools.get(phase.dataset)
        return pool is None or phase.concurrency < pool.processes

    own = [p.concurrency for p in phases if in_process(p)]
    async with make_client(url, max([1, *own])) as http:
        for phase in phases:
            shape = ClosedLoop(phase.concurrency)
            stop = StopRule(duration_s=phase.seconds, warmup_s=0.0)
            pool = pools.get(phase.dataset)
            if pool is not None and not in_process(phase):
                load, offsets[phase.dataset] = await pool.run_level(
                    url, shape, stop, model=model, prompt_offset=offsets[phase.dataset])
            else:
                load = await run_level(http, prompts[phase.dataset], shape, stop, model=model,
                                       prompt_offset=offsets[phase.dataset])
                offsets[phase.dataset] += len(load.requests)
            loads.append(load)
            row = summarize_phase(phase, load)
            if server is not None:
                state = await asyncio.to_thread(server.state)
                row["table_after"] = state.describe()
            rows.append(row)
            print(f"  {phase.name:12s} c={phase.concurrency:<4d} {row['tok_per_s']:8.1f} tok/s  "
                  f"TPOT p50 {row['tpot_p50_ms']} ms  p90 {row['tpot_p90_ms']} ms"
                  + (f"  [{row['table_after']}]" if "table_after" in row else ""), flush=True)
    return loads, rows


@dataclass
class RunSpec:
    policy: str
    url: str
    phases: list[Phase]
    datasets: dict[str, Path]
    out: Path
    admin_key: str | None = None
    daemon_store: Path | None = None
    name: str | None = None  # names the result files; default: the policy
    table_from: Path | None = None  # policy table: a bench (folder or bench.json), a policy file
    seed_bench: Path | None = None  # policy daemon: the bench its store starts from
    client_processes: int = 1  # load processes for phases of at least this many streams
    # policy daemon: the CPU cores its process runs on ("": the trace's own), so that its
    # fits do not share cores with the load processes
    daemon_cpus: str = ""

    @property
    def label(self) -> str:
        return self.name or self.policy.replace(":", "-")


def _copy_store(source: Path, dest: Path) -> None:
    """A consistent copy of a daemon's SQLite store, including what still sits in its
    write-ahead log (a plain file copy of the main file would miss those samples)."""
    dest.unlink(missing_ok=True)
    with contextlib.closing(sqlite3.connect(f"file:{source}?mode=ro", uri=True)) as src, \
            contextlib.closing(sqlite3.connect(dest)) as out:
        src.backup(out)


def _start_daemon(
    spec: RunSpec, admin_key: str, total_s: float
) -> tuple[subprocess.Popen[bytes], Path]:
    store = spec.out / f"{spec.label}.sqlite"
    if spec.daemon_store is not None:
        if not spec.daemon_store.is_file():
            raise TraceError(f"--daemon-store {spec.daemon_store}: no such file")
        _copy_store(spec.daemon_store, store)
    else:
        store.unlink(missing_ok=True)
    config = spec.out / f"{spec.label}.yaml"
    write_config(config, daemon_config(spec.url, admin_key, store, total_s + 30.0,
                                       seed_bench=spec.seed_bench))
    log = spec.out / f"{spec.label}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            pinned_argv(spec.daemon_cpus,
                        [sys.executable, "-m", "controller.cli", "daemon", "--config",
                         str(config)]),
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    return proc, log


def _stop_daemon(proc: subprocess.Popen[bytes]) -> int | None:
    for sig, wait in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
        if proc.poll() is not None:
            break
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait)
    return proc.poll()


def _trees(state: Any) -> str:
    return ", ".join(t.label for t in state.captured_trees) or "none"


def run_policy(spec: RunSpec) -> dict[str, Any]:
    base, scraping = split_policy(spec.policy)
    kind, depth = parse_policy(base)
    if scraping and kind != "static":
        raise TraceError(f"--policy {spec.policy!r}: +scrape goes with a static depth, e.g. "
                         "static:3+scrape (the daemon scrapes for itself)")
    missing = sorted({p.dataset for p in spec.phases} - set(spec.datasets))
    if missing:
        raise TraceError(f"the trace uses dataset(s) {missing}: give --dataset NAME=FILE for each")
    try:
        prompts = {n: load_dataset(p, default_output_tokens=128) for n, p in spec.datasets.items()}
    except DatasetError as err:
        raise TraceError(str(err)) from None
    spec.out.mkdir(parents=True, exist_ok=True)
    admin_key = admin_key_from_env(spec.admin_key)
    result: dict[str, Any] = {"policy": spec.policy, "name": spec.name or spec.policy,
                              "url": spec.url, "trace": [asdict(p) for p in spec.phases],
                              "started_at": time.strftime("%Y-%m-%dT%H:%M:%S")}  # fmt: skip
    server = None if kind == "plain" else ServerClient(spec.url, admin_key)
    before: PolicyTable | None = None
    daemon: subprocess.Popen[bytes] | None = None
    own_cpus = frozenset(os.sched_getaffinity(0))
    t0 = time.time()
    try:
        if server is not None:
            state = server.state()
            if state.inactive_reason:
                raise TraceError(f"{spec.url}: the specctl plugin is inactive: "
                                 f"{state.inactive_reason}")  # fmt: skip
            before = state.table
            if kind == "table":
                if spec.table_from is None:
                    raise TraceError("--policy table needs --table-from PATH (a bench's folder "
                                     "or bench.json, or a policy file)")
                table = table_from(spec.table_from)
                uncaptured = sorted(table.depths - set(state.captured_depths))
                if uncaptured:
                    raise TraceError(f"--table-from {spec.table_from}: depth {uncaptured[0]} was "
                                     f"not captured (captured: {list(state.captured_depths)})")
                trees = sorted(t.label for t in table.trees - set(state.captured_trees))
                if trees:
                    raise TraceError(f"--table-from {spec.table_from}: tree {trees[0]} was not "
                                     f"captured (captured trees: {_trees(state)})")
                server.push(PolicyTable.build(table.tiers, version=state.version + 1))
                result["table"] = table.describe()
            elif kind == "static" and isinstance(depth, DraftShape):
                if depth not in state.captured_trees:
                    raise TraceError(f"--policy {spec.policy}: tree {depth.label} was not "
                                     f"captured (captured trees: {_trees(state)}; start the "
                                     f"server with specctl serve --shapes)")
                server.push(PolicyTable.build([shape_tier(1, depth)],
                                              version=state.version + 1))
            elif kind == "static":
                assert isinstance(depth, int)
                if depth not in state.captured_depths:
                    raise TraceError(f"--policy {spec.policy}: depth {depth} was not captured "
                                     f"(captured: {list(state.captured_depths)})")  # fmt: skip
                server.push(single_depth_table(depth, version=state.version + 1))
            else:  # the daemon starts from SGLang's own choice too
                server.push(None)
        with ServerClient(spec.url, admin_key) as client:  # the plain server's too
            result["prefix_cache_flushed"] = client.flush_cache()  # every policy from one state
            model = client.model_id() or "default"
        total = sum(p.seconds for p in spec.phases)
        if kind == "daemon":
            if not admin_key:
                raise TraceError("--policy daemon needs the server's admin key (--admin-key or "
                                 "SPECCTL_ADMIN_KEY)")  # fmt: skip
            if spec.seed_bench is not None:
                try:
                    read_bench(spec.seed_bench)
                except BenchSeedError as err:
                    raise TraceError(f"--seed-bench: {err}") from None
            daemon, log = _start_daemon(spec, admin_key, total)
            time.sleep(DAEMON_START_WAIT_S)
            if daemon.poll() is not None:
                raise TraceError(f"specctl daemon exited at start (status {daemon.returncode}); "
                                 f"see {log}")  # fmt: skip
            with contextlib.suppress(OSError):  # the cores it runs on, as the kernel has them
                result["daemon_cpus"] = sorted(os.sched_getaffinity(daemon.pid))
            if spec.daemon_cpus:  # the load processes, started next, keep off its cores
                rest = own_cpus - parse_cpu_list(spec.daemon_cpus, "daemon-cpus")
                if rest:
                    os.sched_setaffinity(0, rest)
                    result["load_cpus"] = sorted(rest)
        print(f"trace: {len(spec.phases)} phases, {total:g} s, policy {spec.policy}", flush=True)
        with contextlib.ExitStack() as stack:
            pools = {name: stack.enter_context(LoadProcesses(spec.client_processes,
                                                             prompts[name]))
                     for name in sorted(split_phases(spec.phases, spec.client_processes))}
            for pool in pools.values():
                pool.start()
            reader = stack.enter_context(MetricsReader(spec.url, SCRAPE_INTERVAL_S)) \
                if scraping else None
            t0 = time.time()  # the load processes are up: the trace's time starts here
            result["trace_started_unix"] = round(t0, 3)
            loads, rows = asyncio.run(_run_phases(spec.url, spec.phases, prompts, model, server,
                                                  pools))
        if reader is not None:
            result["metrics_reads"] = reader.summary()
        result["phases"] = rows
        result["total"] = summarize_trace(loads)
        if server is not None:
            result["final_table"] = server.state().describe()
    finally:
        os.sched_setaffinity(0, own_cpus)
        if daemon is not None:
            code = _stop_daemon(daemon)
            pushes = [p for p in read_pushes(spec.out / f"{spec.label}.sqlite") if p["t"] >= t0 - 1]
            result["daemon"] = {
                "exit_status": code,
                "warm_start_store": str(spec.daemon_store) if spec.daemon_store else None,
                "seed_bench": str(spec.seed_bench) if spec.seed_bench else None,
                "pushes": pushes,
                "push_count": len(pushes),
            }
        if server is not None:
            with contextlib.suppress(ServerError):
                server.push(before)
            server.close()
    path = spec.out / f"{spec.label}.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    total = result["total"]
    print(f"{spec.label}: {total['tok_per_s']} tok/s, TPOT p50 {total['tpot_p50_ms']} ms, "
          f"p90 {total['tpot_p90_ms']} ms -> {path}", flush=True)  # fmt: skip
    return result


def _datasets(items: Sequence[str]) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise TraceError(f"--dataset {item!r}: write NAME=FILE, e.g. a=DIR/family_a.jsonl")
        out[name] = Path(path)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the trace under one policy")
    run.add_argument("--policy", required=True, help="daemon, sglang, plain, table, static:D, "
                     "static:TREE (a shape server's tree, like static:3x4x16) or "
                     "static:D+scrape")
    run.add_argument("--url", required=True)
    run.add_argument("--dataset", action="append", default=[], metavar="NAME=FILE")
    run.add_argument("--seconds", type=float, default=48.0, help="length of the default trace")
    run.add_argument("--phases", default=None, help="secs:concurrency:dataset,... instead")
    run.add_argument("--out", type=Path, required=True, help="results folder")
    run.add_argument("--admin-key", default=None, help="or SPECCTL_ADMIN_KEY")
    run.add_argument("--daemon-store", type=Path, default=None,
                     help="daemon: start from a copy of this store")  # fmt: skip
    run.add_argument("--table-from", type=Path, default=None,
                     help="table: a bench's folder or bench.json (its recommended table), or "
                     "a policy file")
    run.add_argument("--seed-bench", type=Path, default=None,
                     help="daemon: start its store from this bench (folder or bench.json)")
    run.add_argument("--name", default=None,
                     help="names this run's files (NAME.json; the daemon's NAME.sqlite, .yaml, "
                     ".log) and its row in compare; default: the policy, e.g. static-3")
    run.add_argument("--daemon-cpus", default="",
                     help="daemon: the CPU cores its process runs on, like 11 (default: this "
                     "process's)")
    run.add_argument("--client-processes", type=int, default=4,
                     help="load processes that carry each phase of at least this many streams "
                     "(1: every phase in this process)")
    cmp = sub.add_parser("compare", help="put every policy of a results folder side by side")
    cmp.add_argument("results", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "compare":
            print(compare(args.results))
            return 0
        if args.client_processes < 1:
            raise TraceError(f"--client-processes {args.client_processes}: give 1 or more")
        if args.daemon_cpus:
            parse_cpu_list(args.daemon_cpus, "daemon-cpus")
        phases = parse_phases(args.phases) if args.phases else default_trace(args.seconds)
        run_policy(RunSpec(args.policy, args.url, phases, _datasets(args.dataset), args.out,
                           args.admin_key, args.daemon_store, args.name, args.table_from,
                           args.seed_bench, args.client_processes, args.daemon_cpus))  # fmt: skip
    except (TraceError, ServerError, CompareError, CpuListError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
