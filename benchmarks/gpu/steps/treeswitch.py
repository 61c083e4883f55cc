"""`treeswitch`: draft shapes switched inside one server (the plugin's SPECCTL_SHAPES).

One server starts statically at the shape of --switch-shapes that dominates the others (a
tree), with the plugin capturing the others beside it; `plain` in the list (beside a tree) is
off, SGLang's own depth 0 captured too (on the run's --off-path), held and probed like any
other shape. It is checked against stock SGLang, each server alone on the GPU in turn (the
run's two servers are stopped first):

1. the shape server, first so that a capture that fails shows at once: what each captured
   shape's target verify runs (top-k, mask) and what its capture cost; per held shape (a
   one-tier table, plain an off tier) its greedy outputs and its tok/s at --switch-streams;
   the best held shape per load as a table per family (an off tier where plain is best),
   pushed and benched at the same loads against the best held shape; then a table that
   switches at random between the shapes every iteration (exploration, share 0.5; plain as
   the depth-0 probe): greedy passes at batch 1 (switches inside requests) until
   --switch-greedy-switches, then --switch-stress-seconds under --switch-stress-streams
   streams with the switch count, errors and GPU memory before and after;
2. a plain server (no plugin): the greedy reference every pass above is compared with;
3. a stock server at each shape of --switch-bench-shapes (no plugin): its greedy outputs and
   its tok/s at --switch-streams, the baseline of the held shapes.

--switch-greedy-only keeps the greedy passes alone (no bench, table, stress or stock server),
and --switch-reference takes the plain server's outputs from an earlier run's reference.json
instead of starting one: the shortest run that checks greedy identity over the switches.
--switch-keep-server (with --switch-reference and no stock shapes) leaves the shape server up
as the run's speculative server, so that a `trace` step after this one runs its closed loop
(`static:3x4x16 static:3 bench-table`, --trace-bench treeswitch/held/table_<family>.json; with
plain listed `static:0` holds off) on the very server whose held benches made the table,
without starting it again (--spec-shapes, which the trace's policies are checked against,
must then list the shapes of --switch-shapes).

Into treeswitch/: server_info.json, passes.json and reference.json (the greedy outputs),
greedy.json, held/<shape>/<family>.json (the shape server's benches, with held/shapes.txt and
one policy file per family, held/table_<family>.json: the best held shape per load),
table/<family>.json (that table's bench), stock/<shape>/<family>.json, stress.json, and the
step's result in state.json.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from benchmarks.gpu import memory, servers, shape_report
from benchmarks.gpu.context import Run, StepError
from benchmarks.gpu.draft_shapes import DraftShape, Shape, ShapeError, label, parse_shapes
from benchmarks.gpu.greedy import GreedyPrompt, RunResult, compare, run_prompts, word_prompts
from benchmarks.gpu.options import int_list
from benchmarks.gpu.steps import shapes as shape_step
from benchmarks.gpu.steps.setup import server_options
from benchmarks.gpu.switch_stress import LoadThreads
from controller.bench.level_flags import level_flags
from controller.bench.server_client import ServerClient, ServerError
from sglang_hooks.contract import PolicyTable, Tier, shape_tier
from sglang_hooks.draft_shape import depths_and_trees, dominating
from sglang_hooks.policy_file import load_policy_file

FOLDER = "treeswitch"
SHAPES_ENV = "SPECCTL_SHAPES"
SWITCH_SHARE = 0.5  # the exploration share of the switching table: a switch every ~2 launches
MAX_SWITCHING_PASSES = 40  # greedy passes while switching, at most, to reach the switches asked


def plan_shapes(text: str) -> tuple[DraftShape, list[Shape]]:
    """(the start-up shape, the others, plain as None) of --switch-shapes."""
    try:
        listed = parse_shapes(text)
        top = dominating(listed)
    except ShapeError as err:
        raise StepError(f"--switch-shapes: {err}") from None
    if top is None:
        raise StepError("--switch-shapes: list a drafting shape to start at, like "
                        "3x4x16,3x1x4,plain")
    if None in listed and top.is_chain:
        # off beside a tree only: a list of chains and plain is a depth server's (--depths)
        raise StepError(f"--switch-shapes: plain goes with a tree, like 3x4x16,3x1x4,plain "
                        f"(chains and plain alone are --depths {_depths(listed)})")
    return top, [s for s in listed if s != top]


def _depths(shapes: list[Shape]) -> str:
    return ",".join(str(0 if s is None else s.steps) for s in shapes)


def held_table(shape: Shape, version: int) -> PolicyTable:
    """One tier running `shape` at every batch size (None: off, SGLang's depth 0)."""
    return PolicyTable.build([shape_tier(1, shape)], version=version)


def switching_table(top: DraftShape, others: list[Shape], version: int) -> PolicyTable:
    """One tier at the start-up shape probing every other shape half the time: plain as the
    depth-0 probe, which the contract allows beside a tree tier (a probe depth is checked
    against the captured depths only, and a tree tier's own depth is its steps, never 0)."""
    base = shape_tier(1, top)
    # ascending, as the wire's bitmask returns them: the push reads the table back alike
    depths, trees = depths_and_trees(others)
    tier = Tier(min_batch=1, depth=base.depth, topk=base.topk, draft_tokens=base.draft_tokens,
                explore_share=SWITCH_SHARE, explore_depths=tuple(sorted(depths)),
                explore_trees=tuple(trees))
    return PolicyTable.build([tier], version=version)


def push(url: str, admin_key: str, table: PolicyTable | None) -> None:
    """Push `table` (None: release) through the bench's client, which reads it back live."""
    try:
        with ServerClient(url, admin_key) as client:
            client.push(table)
    except ServerError as err:
        raise StepError(str(err)) from None


def plugin_state(url: str) -> dict[str, Any]:
    info = shape_step.server_info(url)
    states = info.get("internal_states") or [{}]
    state = states[0].get("specctl") if isinstance(states[0], dict) else None
    return state if isinstance(state, dict) else {}


def start(run: Run, shape: Shape, env: dict[str, str] | None) -> tuple[str, int, float]:
    """A server at `shape` alone on the GPU: stock SGLang when `env` is None, else with the
    plugin and `env`. Raises StepError when it does not start."""
    o = run.opts
    streams = int_list(o.switch_streams, "switch-streams")
    stress = o.switch_stress_streams
    launch = servers.ShapeLaunch(
        shape=shape, max_streams=max(*streams, stress),
        graph_sizes=shape_step.graph_sizes([*streams, stress]),
        mem_fraction=o.shape_mem_fraction, kv_tokens=o.shape_kv_tokens,
        attention_backend="fa3")  # fmt: skip
    plan = servers.shape_plan(run.models(), launch, server_options(run), run.dir / "logs")
    launch_env = dict(plan.env)
    if env is not None:
        launch_env.pop("SGLANG_PLUGINS", None)  # the plugin loads
        launch_env |= env
    argv = plan.argv
    if o.backend == "sim" and shape is not None:
        # The stand-in: a simulated shape server of the profile's shapes (--sim-profile), at
        # the shape alone for a stock server, with the plugin's others captured beside it.
        argv = [*argv, "--shapes", ",".join([label(shape), *filter(None, [
            (env or {}).get(SHAPES_ENV)])])]
    plan = servers.LaunchPlan(plan.role, plan.url, argv,
                              plan.log.with_name(f"treeswitch_{label(shape)}"
                                                 f"{'_plugin' if env is not None else ''}.log"),
                              launch_env)
    run.say(f"  {label(shape)}{' with the plugin' if env is not None else ''}: "
            f"{plan.describe()}")
    try:
        pid, seconds = shape_step.launch_alone(run, plan)
    except servers.StartError as err:
        raise StepError(f"{label(shape)} did not start: {str(err)[-800:]}") from None
    return plan.url, pid, seconds


def stop(run: Run, pid: int) -> str:
    out = servers.stop(pid)
    run.state.servers[servers.SHAPE]["stopped"] = out
    run.state.save()
    return out


def keep_as_spec(run: Run) -> None:
    """The shape server becomes the run's speculative server (a `trace` step's), replacing
    any earlier one in the run's state, which the step stopped before the shapes."""
    run.state.servers[servers.SPEC] = run.state.servers.pop(servers.SHAPE)
    run.state.save()


def greedy_prompts(run: Run) -> list[GreedyPrompt]:
    return word_prompts(run.opts.switch_greedy_prompts, seed=7)


def reference_from(path: Path, prompts: int) -> RunResult:
    """A plain server's greedy outputs as an earlier run wrote them (reference.json)."""
    try:
        outputs = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise StepError(f"--switch-reference {path}: not readable ({err})") from None
    if not (isinstance(outputs, list) and len(outputs) == prompts and all(
            isinstance(o, list) and all(isinstance(t, int) for t in o) for o in outputs)):
        raise StepError(f"--switch-reference {path}: not {prompts} lists of token ids (a "
                        "treeswitch/reference.json of the same --switch-greedy-prompts)")
    return RunResult("plain", outputs=outputs)


def greedy_pass(run: Run, url: str, mode: str) -> RunResult:
    return run_prompts(url, greedy_prompts(run), run.opts.greedy_tokens, mode)


def bench(run: Run, url: str, series: str, folder: Path, prompts: dict[str, Path]
          ) -> dict[str, Any]:  # fmt: skip
    """Each family's closed-loop levels at --switch-streams, into folder/series/<family>.json."""
    return shape_step.bench_levels(run, url, series, run.opts.switch_streams, folder / series,
                                   prompts)


def held_tables(folder: Path, shapes: list[Shape]) -> dict[str, str | None]:
    """The shapes report of the held benches (folder/shapes.txt, .json, .png) and, per
    family, the table that runs the best held shape at every load (plain held: an off tier
    where it is best) as a policy file, folder/table_<family>.json (for `specctl serve
    --shapes --policy-file`, or the trace's bench-table with --trace-bench)."""
    analysis = shape_report.write(folder, [label(s) for s in shapes])
    out: dict[str, str | None] = {}
    for family, found in analysis["families"].items():
        out[family] = found["table_line"]
        if found["table"] is not None:
            (folder / f"table_{family}.json").write_text(json.dumps(
                {"table": found["table"], "from": f"the held benches of family {family}"},
                indent=1) + "\n")
    return out


def table_vs_best(folder: Path, family: str) -> list[dict[str, Any]]:
    """Per level of folder/table/<family>.json: the table's tok/s over the best held shape's
    at that load (flagged levels of either side left out of the ratio)."""
    held = shape_report.load(folder / "held")
    doc = json.loads((folder / "table" / f"{family}.json").read_text())
    rows = []
    for level in doc["levels"]:
        streams = int(level["concurrency"])
        scored = {lb: lv["output_tok_per_s"] for lb, by in held.items()
                  if (lv := by.get(family, {}).get(streams)) is not None and not lv["flags"]
                  and lv.get("output_tok_per_s")}
        best = max(scored, key=lambda lb: scored[lb]) if scored else None
        mine = None if level_flags(level) else level.get("output_tok_per_s")
        rows.append({"streams": streams, "table": level.get("output_tok_per_s"),
                     "best_shape": best, "best": None if best is None else scored[best],
                     "ratio": None if best is None or not mine
                     else round(float(mine) / float(scored[best]), 3)})
    return rows


def stress(run: Run, url: str, pid: int, version: int) -> dict[str, Any]:
    o = run.opts
    before = plugin_state(url).get("shapes", {}).get("switches", 0)
    mem_before = memory.sample(pid, "before")
    load = LoadThreads(url, greedy_prompts(run), o.switch_stress_streams,
                       o.greedy_tokens).start()
    time.sleep(o.switch_stress_seconds)
    stuck = load.stop()
    mem_after = memory.sample(pid, "after")
    state = plugin_state(url)
    switches = state.get("shapes", {}).get("switches", 0) - before
    healthy = servers.healthy(url)
    return {"streams": o.switch_stress_streams, "seconds": o.switch_stress_seconds,
            "switches": switches, "completed": load.completed, "errors": load.errors,
            "last_error": load.last_error, "stuck_threads": stuck, "healthy_after": healthy,
            "memory_before": mem_before.to_json(), "memory_after": mem_after.to_json(),
            "table_version": version, "tree_results": state.get("tree_results"),
            "iteration": state.get("iteration")}


def run(run: Run) -> dict[str, Any]:
    o = run.opts
    top, others = plan_shapes(o.switch_shapes)
    # read first: a reference that cannot serve stops the step before any server starts
    earlier = (reference_from(Path(o.switch_reference), len(greedy_prompts(run)))
               if o.switch_reference else None)  # fmt: skip
    out = run.dir / FOLDER
    out.mkdir(parents=True, exist_ok=True)
    prompts = shape_step.draw_requests(run, out, shape_step.family_files(run))
    result: dict[str, Any] = {"startup": top.label, "captured": [label(s) for s in others],
                              "stopped": shape_step.stop_servers(run)}

    def save() -> None:
        run.state.step(FOLDER).update(status="running", result=result)
        run.checkpoint()

    # 1. the shape server first: a capture that fails shows at once
    # the run's --off-path is what off (plain listed) runs, as on the run's speculative server
    env = {SHAPES_ENV: ",".join(label(s) for s in others), servers.OFF_PATH_ENV: o.off_path}
    url, pid, seconds = start(run, top, env)
    passes: list[RunResult] = []
    try:
        info = shape_step.server_info(url)
        (out / "server_info.json").write_text(json.dumps(info, indent=1, default=str) + "\n")
        state = plugin_state(url)
        result["shape_server"] = {"start_s": round(seconds, 1),
                                  "gpu_used_mib": memory.gpu_used_mib(),
                                  "active": state.get("active"),
                                  "inactive_reason": state.get("inactive_reason"),
                                  "shapes": state.get("shapes")}
        run.say(f"  shape server up in {seconds:.0f} s: {json.dumps(state.get('shapes'))}")
        if not state.get("active"):
            raise StepError(f"the plugin is inactive: {state.get('inactive_reason')}", result)
        version = 1
        for shape in [top, *others]:
            name = label(shape)
            push(url, run.admin_key, held_table(shape, version))
            version += 1
            passes.append(greedy_pass(run, url, f"held {name}"))
            if o.switch_greedy_only:
                continue
            result.setdefault("held_bench", {})[name] = bench(run, url, name, out / "held",
                                                              prompts)
            # the server's answer beside each held shape's bench: `specctl sim fit --shapes
            # treeswitch/held` reads it there (the shape is among those it reports captured)
            shutil.copy(out / "server_info.json", out / "held" / name / "server_info.json")
            save()
        result["held_tables"] = {} if o.switch_greedy_only else held_tables(
            out / "held", [top, *others])
        if not o.switch_greedy_only:
            run.say(f"  the held shapes' best per load: {json.dumps(result['held_tables'])}")
        for family in result["held_tables"]:
            table_file = out / "held" / f"table_{family}.json"
            if not table_file.is_file():
                continue
            push(url, run.admin_key, PolicyTable.build(
                load_policy_file(table_file).tiers, version=version))
            version += 1
            bench(run, url, "table", out, {family: prompts[family]})
            result.setdefault("table_vs_best", {})[family] = table_vs_best(out, family)
            run.say(f"  the table against the best held shape, family {family}: "
                    f"{json.dumps(result['table_vs_best'][family])}")
            save()
        push(url, run.admin_key, switching_table(top, others, version))
        before = plugin_state(url).get("shapes", {}).get("switches", 0)
        switches, k = 0, 0
        while switches < o.switch_greedy_switches and k < MAX_SWITCHING_PASSES:
            k += 1
            passes.append(greedy_pass(run, url, f"switching {k}"))
            switches = plugin_state(url).get("shapes", {}).get("switches", 0) - before
        result["greedy_switches"] = switches
        run.say(f"  {switches} switches over {k} greedy passes at batch 1")
        if not o.switch_greedy_only:
            result["stress"] = stress(run, url, pid, version)
            run.say(f"  stress: {json.dumps(result['stress'])}")
            (out / "stress.json").write_text(json.dumps(result["stress"], indent=1) + "\n")
        push(url, run.admin_key, None)
        result["after_release"] = plugin_state(url).get("shapes")
        if o.switch_keep_server:
            keep_as_spec(run)
            result["kept_as"] = servers.SPEC
            run.say(f"  the shape server stays up as the run's {servers.SPEC} server at {url}")
    finally:
        if result.get("kept_as") is None:
            result["shape_server_stopped"] = stop(run, pid)
        (out / "passes.json").write_text(json.dumps(
            {p.mode: p.outputs for p in passes}) + "\n")
        save()

    # 2. the plain server's greedy outputs, the reference (or an earlier run's)
    if earlier is not None:
        reference = earlier
        result["reference"] = o.switch_reference
        run.say(f"  plain: the greedy outputs of {o.switch_reference}")
    else:
        url, pid, seconds = start(run, None, None)
        try:
            reference = greedy_pass(run, url, "plain")
        finally:
            stop(run, pid)
        result["plain_start_s"] = round(seconds, 1)
    (out / "reference.json").write_text(json.dumps(reference.outputs) + "\n")
    greedy = {p.mode: {k: v for k, v in compare(reference, p, greedy_prompts(run)).items()
                       if k != "per_prompt"} for p in passes}
    for mode, row in greedy.items():
        run.say(f"  {mode}: {row['identical']}/{row['prompts']} identical to plain")
    result["greedy"] = greedy
    (out / "greedy.json").write_text(json.dumps(greedy, indent=1) + "\n")
    save()

    # 3. stock servers of the shapes benched for comparison
    stock: dict[str, Any] = {}
    for text in filter(None, [] if o.switch_greedy_only else o.switch_bench_shapes.split(",")):
        url, pid, seconds = start(run, parse_shapes(text)[0], None)
        try:
            own = greedy_pass(run, url, f"stock {text}")
            stock[text] = {"start_s": round(seconds, 1),
                           "greedy": {k: v for k, v in compare(
                               reference, own, greedy_prompts(run)).items() if k != "per_prompt"},
                           "bench": bench(run, url, text, out / "stock", prompts)}
            run.say(f"  stock {text}: {stock[text]['greedy']['identical']}/"
                    f"{stock[text]['greedy']['prompts']} identical to plain")
        finally:
            stop(run, pid)
        result["stock"] = stock
        save()
    failures: list[str] = []
    for mode, row in result.get("greedy", {}).items():
        if row.get("flips"):
            failures.append(f"{mode}: {row['flips']} of {row['prompts']} prompts differ from "
                            "the plain server's")
    s = result.get("stress", {})
    if s.get("errors") or s.get("stuck_threads") or not s.get("healthy_after", True):
        failures.append(f"stress: {s.get('errors')} errors, {s.get('stuck_threads')} stuck")
    if failures:
        raise StepError("; ".join(failures), result)
    return result
