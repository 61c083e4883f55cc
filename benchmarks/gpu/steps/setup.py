"""`setup`: the machine's facts, the model folders, and both servers up.

Models: dummy configs (`--load-format dummy`), the seeded pair (benchmarks.gpu.seeded.build,
built once per run folder), or the folders given as --target/--draft. Servers: the
speculative one through `specctl serve` and a plain one, each in its own session so that it
outlives the command; a server already up with the same launch is kept, one whose launch
changed (options, settings) is restarted.
"""

from __future__ import annotations

import importlib.util
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.gpu import machine, server_info, servers
from benchmarks.gpu.context import Run, StepError
from benchmarks.gpu.model_folders import (
    SHAPES,
    ModelFolderError,
    ModelFolders,
    build_dummy_folders,
    check_given_folders,
)
from benchmarks.gpu.procs import pid_alive
from benchmarks.gpu.subproc import run_logged

SEEDED_BUILD = "benchmarks.gpu.seeded.build"
LAUNCH_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


def run(run: Run) -> dict[str, Any]:
    run.state.data["machine"] = facts = machine.facts(run.dir)
    run.state.save()
    run.say(f"  {machine.describe(facts)[0]}")
    models = setup_models(run)
    if not run.opts.setup_servers:
        run.say("  servers not started (--no-setup-servers)")
        return {"models": models.to_json()}
    return {"models": models.to_json(), **start_servers(run)}


def setup_models(run: Run) -> ModelFolders:
    opts = run.opts
    root = run.dir / "models"
    known = run.models()
    if opts.models == "seeded" and opts.target is None and known is not None and \
            known.kind == "seeded" and Path(known.target).is_dir():
        run.say(f"  seeded folders already built: {known.target}, {known.draft}")
        return known  # training the head again would cost minutes
    try:
        if opts.target is not None and opts.draft is not None:
            folders = check_given_folders(Path(opts.target), Path(opts.draft))
        elif opts.models == "seeded":
            folders = seeded_folders(run, root / "seeded")
        else:
            folders = build_dummy_folders(root, SHAPES[opts.shape])
    except ModelFolderError as err:
        raise StepError(str(err)) from None
    run.state.data["models"] = folders.to_json()
    run.state.save()
    run.say(f"  target {folders.target}\n  draft  {folders.draft}\n  "
            f"{'dummy weights' if folders.dummy else 'weights from the folders'}")
    return folders


def seeded_folders(run: Run, root: Path) -> ModelFolders:
    """Run the seeded builder (`python -m benchmarks.gpu.seeded.build --out DIR` plus
    --seeded-args) and serve what it wrote: DIR/target, DIR/draft and its prompt families
    DIR/*.jsonl (the first one is the run's --dataset unless one is given)."""
    for module, why in ((SEEDED_BUILD, "is not importable"),
                        ("torch", "(which builds the pair) is not installed in this Python")):
        try:
            found = importlib.util.find_spec(module) is not None
        except ImportError:
            found = False
        if not found:
            raise StepError(f"--models seeded: {module} {why}; use --models dummy, or give "
                            "the folders as --target/--draft")
    shape = ["--tiny"] if run.opts.shape == "tiny" and "--tiny" not in run.opts.seeded_args \
        else []
    argv = [sys.executable, "-m", SEEDED_BUILD, "--out", str(root), *shape,
            *shlex.split(run.opts.seeded_args)]
    run.say(f"  {shlex.join(argv)}")
    done = run_logged(argv, run.dir / "seeded_build.txt", run.cap(run.opts.seeded_timeout))
    if done.returncode != 0:
        raise StepError(f"the seeded builder failed: {done.describe()}")
    folders = check_given_folders(root / "target", root / "draft", kind="seeded")
    datasets = tuple(str(p) for p in sorted(root.glob("family_*.jsonl")))
    return ModelFolders(folders.target, folders.draft, False, "seeded", datasets)


def server_options(run: Run) -> servers.ServerOptions:
    o = run.opts
    return servers.ServerOptions(
        backend=o.backend, admin_key=run.admin_key, spec_port=o.spec_port,
        plain_port=o.plain_port, depths=o.depths, mem_fraction_first=o.mem_fraction_first,
        mem_fraction_second=o.mem_fraction_second, roles=tuple(o.start_order.split(",")),
        extra_args=tuple(shlex.split(o.server_args)), sim_speedup=o.sim_speedup,
        sim_profile=o.sim_profile,
        plain_with_plugin=o.plain_with_plugin, spec_cpus=o.spec_cpus, plain_cpus=o.plain_cpus,
        off_path=o.off_path, device_timer=o.device_timer, shapes=o.spec_shapes,
    )  # fmt: skip


def start_servers(run: Run) -> dict[str, Any]:
    result: dict[str, Any] = {}
    plans = servers.plans(run.models(), server_options(run), run.dir / "logs")
    # A server an earlier setup started that this start order leaves out (spec,plain, then
    # spec) is stopped: its GPU memory is the card's share the other asks for.
    for role in [r for r in run.state.servers if r not in {p.role for p in plans}]:
        entry = run.state.servers.pop(role)
        if pid_alive(int(entry["pid"])):
            run.say(f"  {role}: stopping it, left out of --start-order {run.opts.start_order} "
                    f"(pid {entry['pid']}): {servers.stop(int(entry['pid']))}")
        run.state.save()
    for plan in plans:
        known = run.state.servers.get(plan.role)
        if (known and known.get("argv") == plan.argv and known.get("env", {}) == plan.env
                and pid_alive(int(known["pid"])) and servers.healthy(plan.url)):
            run.say(f"  {plan.role}: already up at {plan.url} (pid {known['pid']})")
            result[plan.role] = {"reused": True, **known}
            continue
        if known and pid_alive(int(known["pid"])):
            run.say(f"  {plan.role}: stopping the old server (pid {known['pid']}): "
                    f"{servers.stop(int(known['pid']))}")
        if servers.healthy(plan.url):
            raise StepError(f"something else answers on {plan.url}: stop it or pick another "
                            f"--{plan.role}-port")
        run.say(f"  {plan.role}: {plan.describe()}")
        pid = servers.launch(plan, LAUNCH_ENV)
        entry = {"url": plan.url, "pid": pid, "argv": plan.argv, "env": plan.env,
                 "log": str(plan.log), "started_at": time.time()}
        run.state.servers[plan.role] = entry
        run.state.save()
        try:
            seconds = servers.wait_healthy(plan.url, pid, plan.log,
                                           run.cap(run.opts.start_timeout))
        except servers.StartError as err:
            raise StepError(f"{plan.role} server: {err}", result) from None
        entry["start_seconds"] = round(seconds, 1)
        run.state.save()
        run.say(f"  {plan.role}: up at {plan.url} in {seconds:.0f} s (pid {pid})")
        result[plan.role] = entry
    result["server_info"] = server_info.record(run.state)
    note = server_info.kv_pool_note(result["server_info"])
    if note:
        result["kv_pool_note"] = note
        run.say(f"  ! {note}")
    return result
