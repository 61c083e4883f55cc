"""The harness's phases. Each takes the run context (benchmarks/gpu/context.py), does one
bounded job, writes its files in the run folder and returns a JSON-able result for state.json;
an exception is recorded as the phase's error by the runner (benchmarks/gpu/harness.py) and the
next phase still runs.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.gpu import daemon_run, gpu_info, servers
from benchmarks.gpu.context import PhaseError, Run
from benchmarks.gpu.greedy import RunResult, greedy_check, headline
from benchmarks.gpu.model_folders import (
    SHAPES,
    ModelFolderError,
    ModelFolders,
    build_dummy_folders,
    check_given_folders,
)
from benchmarks.gpu.options import int_list
from benchmarks.gpu.procs import pid_alive
from benchmarks.gpu.subproc import run_logged
from benchmarks.gpu.switch_stress import StressPlan, check_mark, run_stress
from controller.bench.server_client import ServerClient

SERVER_INFO_FIELDS = (
    "model_path", "version", "max_running_requests", "max_total_num_tokens",
    "max_prefill_tokens", "context_length", "chunked_prefill_size", "mem_fraction_static",
    "cuda_graph_max_bs", "cuda_graph_max_bs_decode", "attention_backend", "sampling_backend",
    "load_format", "speculative_algorithm", "speculative_num_steps",
    "speculative_num_draft_tokens", "speculative_eagle_topk", "speculative_adaptive",
    "disable_overlap_schedule", "enable_metrics",
)  # fmt: skip
INTERNAL_STATE_FIELDS = ("effective_max_running_requests_per_dp", "memory_usage",
                         "avg_spec_accept_length")


# ----------------------------------------------------------------------------- models


def phase_models(run: Run) -> dict[str, Any]:
    opts = run.opts
    root = run.dir / "models"
    known = run.models()
    if opts.models == "seeded" and opts.target is None and known is not None and \
            known.kind == "seeded" and Path(known.target).is_dir():
        run.say(f"  seeded folders already built: {known.target}, {known.draft}")
        return known.to_json()  # training the head again would cost minutes
    if opts.target is not None and opts.draft is not None:
        folders = check_given_folders(Path(opts.target), Path(opts.draft))
    elif opts.models == "seeded":
        folders = seeded_folders(run, root / "seeded")
    else:
        folders = build_dummy_folders(root, SHAPES[opts.shape])
    run.state.data["models"] = folders.to_json()
    run.state.save()
    run.say(f"  target {folders.target}\n  draft  {folders.draft}\n  "
            f"{'dummy weights' if folders.dummy else 'weights from the folders'}")
    return folders.to_json()


SEEDED_BUILD = "benchmarks.gpu.seeded.build"


def seeded_folders(run: Run, root: Path) -> ModelFolders:
    """Run the seeded builder (`python -m benchmarks.gpu.seeded.build --out DIR` plus
    --seeded-args) and serve what it wrote: DIR/target, DIR/draft and its prompt families
    DIR/*.jsonl (the first one is the harness's --dataset unless one is given)."""
    try:
        found = importlib.util.find_spec(SEEDED_BUILD) is not None
    except ImportError:
        found = False
    if not found:
        raise ModelFolderError(f"--models seeded: {SEEDED_BUILD} is not importable; use "
                               "--models dummy, or give the folders as --target/--draft")
    argv = [sys.executable, "-m", SEEDED_BUILD, "--out", str(root),
            *shlex.split(run.opts.seeded_args)]
    run.say(f"  {shlex.join(argv)}")
    done = run_logged(argv, run.dir / "seeded_build.txt", run.cap(run.opts.seeded_timeout))
    if done.returncode != 0:
        raise PhaseError(f"the seeded builder failed: {done.describe()}")
    folders = check_given_folders(root / "target", root / "draft", kind="seeded")
    datasets = tuple(str(p) for p in sorted(root.glob("*.jsonl")))
    return ModelFolders(folders.target, folders.draft, False, "seeded", datasets)


# ----------------------------------------------------------------------------- servers


def _server_options(run: Run) -> servers.ServerOptions:
    o = run.opts
    return servers.ServerOptions(
        backend=o.backend, admin_key=run.admin_key, spec_port=o.spec_port,
        plain_port=o.plain_port, depths=o.depths, mem_fraction_first=o.mem_fraction_first,
        mem_fraction_second=o.mem_fraction_second, spec_first=o.start_order == "spec,plain",
        extra_args=tuple(shlex.split(o.server_args)), sim_speedup=o.sim_speedup,
        plain_with_plugin=o.plain_with_plugin, spec_cpus=o.spec_cpus, plain_cpus=o.plain_cpus,
    )  # fmt: skip


def phase_start(run: Run) -> dict[str, Any]:
    models = run.models()
    if models is None and run.opts.backend == "sglang":
        raise PhaseError("no model folders: run the `models` phase first")
    launch_env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    result: dict[str, Any] = {}
    for plan in servers.plans(models, _server_options(run), run.dir / "logs"):
        known = run.state.servers.get(plan.role)
        if (known and known.get("argv") == plan.argv and known.get("env", {}) == plan.env
                and pid_alive(int(known["pid"]))
                and servers.healthy(plan.url)):
            run.say(f"  {plan.role}: already up at {plan.url} (pid {known['pid']})")
            result[plan.role] = {"reused": True, **known}
            continue
        if known and pid_alive(int(known["pid"])):
            run.say(f"  {plan.role}: stopping the old server (pid {known['pid']}): "
                    f"{servers.stop(int(known['pid']))}")
        if servers.healthy(plan.url):
            raise PhaseError(f"something else answers on {plan.url}: stop it or pick another "
                             f"--{plan.role}-port")
        run.say(f"  {plan.role}: {plan.describe()}")
        pid = servers.launch(plan, launch_env)
        entry = {"url": plan.url, "pid": pid, "argv": plan.argv, "env": plan.env,
                 "log": str(plan.log), "started_at": time.time()}
        run.state.servers[plan.role] = entry
        run.state.save()
        seconds = servers.wait_healthy(plan.url, pid, plan.log, run.opts.start_timeout)
        entry["start_seconds"] = round(seconds, 1)
        run.state.save()
        run.say(f"  {plan.role}: up at {plan.url} in {seconds:.0f} s (pid {pid})")
        result[plan.role] = entry
    if run.opts.backend == "sglang":  # the simulator's stand-ins run on no GPU
        run.state.data["gpus"] = gpu_info.read()  # saved with the servers' info below
    result["server_info"] = record_server_info(run)
    note = kv_pool_note(result["server_info"])
    if note:
        result["kv_pool_note"] = note
        run.say(f"  ! {note}")
    return result


def kv_pool_note(server_info: dict[str, Any]) -> str | None:
    """A warning when the two servers' KV pools differ, naming the cap that evens them.

    SGLang lowers a `--max-total-tokens` above what its memory share holds to what it holds,
    so the harness's one cap evens the pools only where both shares hold it (an H100's do not
    hold 262,144 tokens of the 8B shape)."""
    spec, plain = ((server_info.get(role) or {}).get("max_total_num_tokens")
                   for role in (servers.SPEC, servers.PLAIN))
    if not isinstance(spec, int) or not isinstance(plain, int) or spec == plain:
        return None
    return (f"the KV pools differ: {servers.SPEC} {spec:,} tokens, {servers.PLAIN} "
            f"{plain:,}; a paired comparison then weighs unequal prefix caches. Pass "
            f"{servers.KV_TOKENS_FLAG} {min(spec, plain)} in --server-args (SERVER_ARGS in "
            f"h200_session.sh) to give both the smaller")


# The plugin's state in the summary: whether it steers, and what its off path skipped.
PLUGIN_STATE_FIELDS = ("active", "inactive_reason", "captured_depths", "source", "off_mode",
                       "lean_host", "skip_draft_prefill", "skipped_draft_extends",
                       "skipped_draft_prefills", "plain_decode")


def record_server_info(run: Run) -> dict[str, Any]:
    """/server_info of both servers to files; the capacity fields side by side."""
    out: dict[str, Any] = {}
    for role in (servers.SPEC, servers.PLAIN):
        url = run.state.url(role)
        if url is None:
            continue
        try:
            info = httpx.get(f"{url}/server_info", timeout=10).json()
        except (httpx.HTTPError, ValueError) as err:
            out[role] = {"error": f"{type(err).__name__}: {err}"}
            continue
        (run.dir / f"server_info_{role}.json").write_text(json.dumps(info, indent=2) + "\n")
        fields = {k: info.get(k) for k in SERVER_INFO_FIELDS if k in info}
        states = info.get("internal_states") or [{}]
        first = states[0] if isinstance(states, list) and states else {}
        for k in INTERNAL_STATE_FIELDS:
            if isinstance(first, dict) and k in first:
                fields[f"internal.{k}"] = first[k]
        if isinstance(first, dict) and isinstance(first.get("specctl"), dict):
            plugin = first["specctl"]
            fields["specctl"] = {k: plugin.get(k) for k in PLUGIN_STATE_FIELDS}
        out[role] = fields
    run.state.data["server_info"] = out
    run.state.save()
    return out


def phase_stop(run: Run) -> dict[str, Any]:
    out = {}
    for role, entry in run.state.servers.items():
        outcome = servers.stop(int(entry["pid"]))
        entry["stopped"] = outcome
        out[role] = outcome
        run.say(f"  {role} (pid {entry['pid']}): {outcome}")
    run.state.save()
    return out


# ----------------------------------------------------------------------------- checks


def phase_smoke(run: Run) -> dict[str, Any]:
    run.require_servers(servers.SPEC)  # the plain server is not needed here
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
        raise PhaseError(f"smoke: {result['result'] or done.describe()} (see smoke.txt)", result)
    return result


def _plain_reference(run: Run) -> RunResult | None:
    """The plain outputs the greedy phase stored, if they answer the same prompts."""
    path = run.dir / "greedy_plain_outputs.json"
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    if data.get("prompts") != [p.name for p in run.greedy_prompts()] or \
            data.get("max_new_tokens") != run.opts.greedy_tokens:
        return None
    return RunResult("plain", outputs=data["outputs"], pushes_during=[0] * len(data["outputs"]))


def phase_greedy(run: Run) -> dict[str, Any]:
    run.require_servers()
    prompts = run.greedy_prompts()
    report, plain = greedy_check(
        run.url(servers.SPEC), run.url(servers.PLAIN), run.admin_key, prompts,
        run.opts.greedy_tokens,
        switch_depths=int_list(run.opts.greedy_switch_depths, "greedy-switch-depths"),
        interval_s=run.opts.greedy_interval,
        fixed_depths=int_list(run.opts.greedy_fixed_depths, "greedy-fixed-depths"),
        deadline=None if run.deadline is None else time.monotonic() + run.time_left(),
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
        raise PhaseError(f"greedy: {pusher['failures']} of the pusher's pushes failed, first: "
                         f"{pusher['first_failures'][0]}", result)
    return result


def phase_switch(run: Run) -> dict[str, Any]:
    run.require_servers()
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
        deadline=None if run.deadline is None else time.monotonic() + run.time_left(),
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
    # Greedy flips are reported, not fatal: random weights leave small logit margins.
    failed = [c for c, ok in report["checks"].items()
              if ok is False and not c.startswith("greedy")]
    if failed:
        raise PhaseError(f"switch stress: failed checks: {'; '.join(failed)}", summary)
    return summary


# ----------------------------------------------------------------------------- bench, daemon


def phase_bench(run: Run) -> dict[str, Any]:
    run.require_servers()
    o = run.opts
    depths = o.bench_depths or o.depths
    levels = len(int_list(o.bench_concurrency, "bench-concurrency"))
    series = len(int_list(depths, "bench-depths")) + 1
    out_dir = run.dir / "bench"
    argv = [sys.executable, "-m", "controller.cli", "bench", "--url", run.url(servers.SPEC),
            "--no-spec-url", run.url(servers.PLAIN), "--admin-key", run.admin_key,
            "--concurrency", o.bench_concurrency, "--depths", depths,
            "--duration-per-level", f"{o.bench_duration:g}", "--output-tokens",
            str(o.output_tokens), "--prompt-tokens", str(o.prompt_tokens), "--out", str(out_dir)]
    dataset = run.dataset()
    if dataset is not None:
        argv += ["--dataset", str(dataset)]
    # A level is its duration plus waiting for the server to drain (bounded by the bench).
    timeout = levels * series * (o.bench_duration + 40) + 60
    run.say(f"  {levels * series} levels of {o.bench_duration:g} s (timeout {timeout:.0f} s)")
    if run.time_left() < timeout:
        run.say(f"  warning: the --budget leaves {run.time_left():.0f} s: the bench is cut "
                "then, and the levels measured by that time are kept")
    done = run_logged(argv, run.dir / "bench.txt", run.cap(timeout))
    bench_json = out_dir / "bench.json"
    if not bench_json.is_file():
        raise PhaseError(f"bench wrote no bench.json: {done.describe()}")
    data = json.loads(bench_json.read_text())
    rows = data.get("results", [])
    unfinished = [f"{r['series']} c={r['concurrency']}" for r in rows if r["requests"] == 0]
    errors = [f"{r['series']} c={r['concurrency']}: {r['errors']}" for r in rows if r["errors"]]
    if unfinished:
        run.say(f"  warning: no request finished within {o.bench_duration:g} s at "
                f"{', '.join(unfinished)}: raise --bench-duration or lower --output-tokens")
    table = {f"{r['series']} c={r['concurrency']}": r["output_tok_per_s"] for r in rows}
    result = {"returncode": done.returncode, "seconds": round(done.seconds, 1),
              "levels": len(rows), "levels_planned": levels * series,
              "levels_without_finished_requests": unfinished, "levels_with_errors": errors,
              "tok_per_s": table, "crossovers": data.get("crossovers"),
              "recommended_table": data.get("recommended_table_text"),
              "interrupted": data.get("interrupted")}
    if done.returncode != 0:
        raise PhaseError(f"bench: {done.describe()}; {len(rows)} of {levels * series} levels "
                         "measured (see bench.txt)", result)
    return result


def phase_daemon(run: Run) -> dict[str, Any]:
    run.require_servers(servers.SPEC)  # the plain server is not needed here
    o = run.opts
    folder = run.dir / "daemon"
    folder.mkdir(parents=True, exist_ok=True)
    store = folder / "daemon.sqlite"
    for stale in folder.glob("daemon.sqlite*"):
        stale.unlink()  # a rerun measures afresh
    seconds = min(o.daemon_seconds, run.time_left() - o.daemon_segment - 30)
    if seconds < o.daemon_seconds:
        if seconds < 10:
            raise PhaseError(f"the --budget leaves {run.time_left():.0f} s, too little for a "
                             "daemon run; give this phase a command of its own")
        run.say(f"  the --budget shortens the daemon run to {seconds:.0f} s")
    config = daemon_run.daemon_config(run.url(servers.SPEC), run.admin_key, store, seconds)
    daemon_run.write_config(folder / "daemon.yaml", config)
    with ServerClient(run.url(servers.SPEC)) as probe:
        model = probe.model_id() or "default"
        before = probe.state()
    load = daemon_run.SteppedLoad(
        run.url(servers.SPEC), run.load_prompts(),
        int_list(o.daemon_concurrency, "daemon-concurrency"), o.daemon_segment, model,
    ).start()  # fmt: skip
    try:
        done = daemon_run.run_daemon(folder / "daemon.yaml", folder / "daemon.log",
                                     run.cap(seconds + 60))
    finally:
        load_stopped = load.stop(timeout_s=o.daemon_segment + 60)
    with ServerClient(run.url(servers.SPEC), run.admin_key) as server:
        after = server.state()
        server.push(before.table)  # hand the server back as the phase found it
    pushes = daemon_run.read_pushes(store)
    (folder / "pushes.json").write_text(json.dumps(pushes, indent=2) + "\n")
    (folder / "load.json").write_text(json.dumps(load.segments, indent=2) + "\n")
    outcomes: dict[str, int] = {}
    for p in pushes:
        outcomes[p["outcome"]] = outcomes.get(p["outcome"], 0) + 1
    result = {
        "returncode": done.returncode, "seconds": round(done.seconds, 1),
        "samples_stored": daemon_run.count_samples(store), "pushes": len(pushes),
        "push_outcomes": outcomes, "table_at_end": after.describe(),
        "table_source_at_end": after.source, "restored": before.describe(),
        "load_segments": len(load.segments), "load_error": load.error,
        "load_stopped": load_stopped,
        "push_lines": [line for line in (folder / "daemon.log").read_text(
            errors="replace").splitlines() if " push " in line][:20],
    }
    run.say(f"  daemon: {result['samples_stored']} samples, {len(pushes)} pushes {outcomes}, "
            f"table at the end: {after.describe()}")
    if done.timed_out or (done.returncode not in (0, None)):
        raise PhaseError(f"daemon: {done.describe()}", result)
    if load.error:
        raise PhaseError(f"daemon load failed: {load.error}", result)
    return result
