"""`shapes`: SGLang's own static draft shapes (chains and trees) and a plain server, each
started alone on the GPU in turn and benched at every load of --shape-streams on every prompt
family, into shapes/<shape>/<family>.json, then shapes/shapes.txt and shapes.json
(benchmarks/gpu/shape_report.py: where each shape wins, and whether a tree beats the best
chain).

Each shape's server is stock SGLang without any plugin (`SGLANG_PLUGINS=none`): the figures
are SGLang's own for that shape. The run's two servers are stopped first (the shapes need the
GPU to themselves). A shape whose server does not start on --shape-attention-backend is tried
once more on --shape-fallback-backend when it is a tree, and the failure is kept. Every
family's requests are drawn once (fresh prompts, outputs spread over --shape-output-spread)
and sent in the same order to every shape. Shapes already measured in the run folder are
skipped, so a command cut by its --budget goes on where it stopped.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from benchmarks.gpu import memory, servers, shape_report
from benchmarks.gpu.context import Run, StepError
from benchmarks.gpu.cpus import pinned_argv
from benchmarks.gpu.draft_shapes import Shape, ShapeError, label, parse_shapes
from benchmarks.gpu.options import int_list, output_span
from benchmarks.gpu.procs import pid_alive
from benchmarks.gpu.seeded.datasets import fresh_prompts, spread_outputs, write_family
from benchmarks.gpu.steps.setup import LAUNCH_ENV, server_options
from benchmarks.gpu.subproc import run_logged
from controller.bench.prompts import DatasetError, load_dataset

FOLDER = "shapes"
PROMPT_SEED = 0  # one draw per family, the same requests for every shape
START_GUESS_S = 150.0  # a server's start before one was timed in this run
LEVEL_EXTRA_S = 2.0  # a level's drain and scrapes beyond its warm-up and window


def graph_sizes(streams: Sequence[int]) -> tuple[int, ...]:
    """Decode CUDA graph sizes: the loads themselves. Each size is captured for the target's
    verify and every draft step, so few sizes start a shape's server sooner (seven shapes start
    in one run); a closed-loop level holds its batch at its load, and a batch a request short of
    it pads to it."""
    return tuple(sorted(set(streams)))


def family_files(run: Run) -> dict[str, Path]:
    """The families benched: --shape-families of the seeded build's, or the run's prompts."""
    known = run.families()
    wanted = [f for f in run.opts.shape_families.split(",") if f.strip()]
    if not known:
        return {"prompts": run.prompt_file()}
    missing = [f for f in wanted if f not in known]
    if missing:
        raise StepError(f"--shape-families: no family {missing[0]!r} in this run "
                        f"(it has {', '.join(sorted(known))})")
    return {f: known[f] for f in (wanted or sorted(known))}


def draw_requests(run: Run, out: Path, families: dict[str, Path]) -> dict[str, Path]:
    """Each family's requests as one file, drawn once per run folder."""
    o = run.opts
    drawn = {}
    for family, source in families.items():
        path = out / "prompts" / f"{family}.jsonl"
        if not path.is_file():
            try:
                prompts = load_dataset(source, o.output_tokens)
            except DatasetError as err:
                raise StepError(str(err)) from None
            rows: list[dict[str, object]] = [
                {"prompt": p.text, "output_tokens": p.output_tokens} for p in prompts]
            if o.fresh_prompts:
                rows = fresh_prompts(rows, o.fresh_prompts, seed=PROMPT_SEED)
            span = output_span(o.shape_output_spread, "--shape-output-spread")
            if span is not None:
                rows = spread_outputs(rows, *span, seed=PROMPT_SEED)
            path.parent.mkdir(parents=True, exist_ok=True)
            write_family(path, rows)
        drawn[family] = path
    return drawn


def stop_servers(run: Run) -> dict[str, str]:
    """The run's servers and any shape server a cut command left, stopped."""
    out = {}
    for role, entry in run.state.servers.items():
        if pid_alive(int(entry["pid"])):
            out[role] = entry["stopped"] = servers.stop(int(entry["pid"]))
            run.say(f"  {role} server (pid {entry['pid']}) {out[role]}: the shapes take the GPU")
    run.state.save()
    return out


def bench_seconds(run: Run, families: int) -> float:
    o = run.opts
    levels = families * len(int_list(o.shape_streams, "shape-streams"))
    return levels * (o.level_seconds + o.warmup_seconds + LEVEL_EXTRA_S) + 15.0 * families


def shape_seconds(run: Run, families: int, start_s: float) -> float:
    """What one shape takes, about: its start, every level and its stop."""
    return start_s + bench_seconds(run, families) + 15.0


def backends_for(run: Run, shape: Shape) -> list[str]:
    o = run.opts
    out = [o.shape_attention_backend]
    if shape is not None and not shape.is_chain and o.shape_fallback_backend and \
            o.shape_fallback_backend != o.shape_attention_backend:
        out.append(o.shape_fallback_backend)
    return out


def start(run: Run, shape: Shape, backend: str) -> tuple[servers.LaunchPlan, int, float]:
    """One shape's server up on `backend`; StartError (the server stopped) if it cannot be."""
    o = run.opts
    streams = int_list(o.shape_streams, "shape-streams")
    launch = servers.ShapeLaunch(
        shape=shape, max_streams=max(streams), graph_sizes=graph_sizes(streams),
        mem_fraction=o.shape_mem_fraction, kv_tokens=o.shape_kv_tokens,
        attention_backend=backend)  # fmt: skip
    plan = servers.shape_plan(run.models(), launch, server_options(run), run.dir / "logs")
    if servers.healthy(plan.url):
        raise StepError(f"something else answers on {plan.url}: stop it or pick another "
                        "--spec-port")
    run.say(f"  {label(shape)} on {backend or 'the backend SGLang picks'}: {plan.describe()}")
    pid, seconds = launch_alone(run, plan)
    return plan, pid, seconds


def launch_alone(run: Run, plan: servers.LaunchPlan) -> tuple[int, float]:
    """(pid, seconds to healthy) of the run's one shape server; StartError (the server
    stopped) if it does not come up."""
    pid = servers.launch(plan, LAUNCH_ENV)
    run.state.servers[servers.SHAPE] = {"url": plan.url, "pid": pid, "argv": plan.argv,
                                        "env": plan.env, "log": str(plan.log),
                                        "started_at": time.time()}
    run.state.save()
    try:
        seconds = servers.wait_healthy(plan.url, pid, plan.log, run.cap(run.opts.start_timeout))
    except servers.StartError:
        servers.stop(pid)
        raise
    return pid, seconds


def server_info(url: str) -> dict[str, Any]:
    try:
        reply = httpx.get(f"{url}/server_info", timeout=10.0)
        data = reply.json() if reply.status_code == 200 else {}
    except (httpx.HTTPError, ValueError):
        data = {}
    return data if isinstance(data, dict) else {}


def bench(run: Run, url: str, shape: Shape, folder: Path, prompts: dict[str, Path]
          ) -> dict[str, Any]:  # fmt: skip
    return bench_levels(run, url, label(shape), run.opts.shape_streams, folder, prompts)


def bench_levels(run: Run, url: str, series: str, streams: str, folder: Path,
                 prompts: dict[str, Path]) -> dict[str, Any]:
    """Each family's closed-loop levels at `streams` into folder/<family>.json, as the server
    runs (benchmarks.gpu.shape_bench); per family its exit and time, and what failed."""
    o = run.opts
    folder.mkdir(parents=True, exist_ok=True)
    levels = len(int_list(streams, "streams"))
    out: dict[str, Any] = {}
    for family, path in prompts.items():
        argv = [sys.executable, "-m", "benchmarks.gpu.shape_bench", "--url", url,
                "--series", series, "--dataset", str(path),
                "--streams", streams, "--out", str(folder / f"{family}.json"),
                "--level-seconds", f"{o.level_seconds:g}",
                "--warmup-seconds", f"{o.warmup_seconds:g}",
                "--client-processes", str(o.client_processes),
                "--output-tokens", str(o.output_tokens), "--admin-key", run.admin_key]
        run.say(f"  {series}, family {family}: {streams} streams")
        seconds = levels * (o.level_seconds + o.warmup_seconds + LEVEL_EXTRA_S) + 75.0
        done = run_logged(pinned_argv(o.bench_cpus, argv), folder / f"{family}.txt",
                          run.cap(seconds))
        for line in (folder / f"{family}.txt").read_text().splitlines():
            if line.startswith("  "):
                run.say("  " + line)
        out[family] = {"returncode": done.returncode, "seconds": round(done.seconds, 1)}
        if done.returncode != 0:
            out[family]["error"] = done.describe()
    return out


def measure(run: Run, shape: Shape, folder: Path, prompts: dict[str, Path]) -> dict[str, Any]:
    """Start the shape's server (on the fallback backend too, for a tree that needs it), bench
    every family, stop it. What went wrong is kept, not raised: the next shape still runs."""
    entry: dict[str, Any] = {"attempts": []}
    for backend in backends_for(run, shape):
        try:
            plan, pid, seconds = start(run, shape, backend)
        except servers.StartError as err:
            tail = str(err)[-1500:]
            entry["attempts"].append({"backend": backend, "error": tail})
            run.say(f"  ! {label(shape)} did not start on {backend or 'the default backend'}: "
                    f"{tail.splitlines()[0]}")
            continue
        info = server_info(plan.url)
        entry.update(backend=backend, start_seconds=round(seconds, 1),
                     gpu_used_mib_at_start=memory.gpu_used_mib(),
                     attention_backend=info.get("attention_backend"),
                     max_total_num_tokens=info.get("max_total_num_tokens"))
        (folder / "server_info.json").write_text(json.dumps(info, indent=1, default=str) + "\n")
        run.say(f"  {label(shape)}: up in {seconds:.0f} s on "
                f"{info.get('attention_backend') or backend}, "
                f"GPU memory {entry['gpu_used_mib_at_start']} MiB")
        try:
            entry["families"] = bench(run, plan.url, shape, folder, prompts)
        finally:
            entry["stopped"] = servers.stop(pid)
            run.state.servers[servers.SHAPE]["stopped"] = entry["stopped"]
            run.state.save()
        return entry
    entry["error"] = "did not start on " + " or ".join(
        a["backend"] or "the default backend" for a in entry["attempts"])
    return entry


def done_before(folder: Path, families: dict[str, Path]) -> bool:
    return all((folder / f"{f}.json").is_file() for f in families)


def run(run: Run) -> dict[str, Any]:
    o = run.opts
    try:
        shapes = parse_shapes(o.shapes)
    except ShapeError as err:
        raise StepError(f"--shapes: {err}") from None
    out = run.dir / FOLDER
    out.mkdir(parents=True, exist_ok=True)
    families = family_files(run)
    prompts = draw_requests(run, out, families)
    previous = (run.state.step(FOLDER).get("result") or {}).get("shapes", {})
    result: dict[str, Any] = {"shapes": dict(previous), "families": sorted(families),
                              "streams": o.shape_streams, "stopped": stop_servers(run)}
    failures = []
    for shape in shapes:
        name = label(shape)
        folder = out / name
        if done_before(folder, families):
            run.say(f"  {name}: measured by an earlier command")
            continue
        # The latest start is the guide: the first start of a machine also fills its kernel
        # caches, which later starts find ready.
        timed = [e["start_seconds"] for e in result["shapes"].values() if "start_seconds" in e]
        need = shape_seconds(run, len(families), timed[-1] if timed else START_GUESS_S)
        if run.time_left() < need:
            result["cut_by_budget"] = (f"{name} and the shapes after it left for a later "
                                       f"command: about {need:.0f} s each, the --budget "
                                       f"leaves {run.time_left():.0f} s")
            run.say(f"  {result['cut_by_budget']}")
            break
        folder.mkdir(parents=True, exist_ok=True)
        entry = measure(run, shape, folder, prompts)
        result["shapes"][name] = entry
        if "error" in entry:
            failures.append(f"{name}: {entry['error']}")
        failures += [f"{name}, family {f}: {e['error']}"
                     for f, e in entry.get("families", {}).items() if "error" in e]
        run.state.step(FOLDER).update(status="running", result=result)
        run.checkpoint()
    analysis = shape_report.write(out, [label(s) for s in shapes])
    result["verdict"] = analysis["verdict"]
    result["tree_wins"] = analysis["tree_wins"]
    run.say(f"  verdict: {analysis['verdict']} (shapes/shapes.txt)")
    if failures:
        raise StepError("; ".join(failures), result)
    return result
