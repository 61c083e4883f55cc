"""GPU end-to-end harness: a speculative and a plain SGLang server on one GPU, checked and
measured in phases. docs/sglang.md, "GPU end-to-end harness", describes it.

    python -m benchmarks.gpu.harness all --tiny --run-dir /tmp/gpu-tiny --out-tar t.tar.gz
    python -m benchmarks.gpu.harness models start smoke greedy --run-dir /tmp/gpu-8b
    python -m benchmarks.gpu.harness switch daemon --run-dir /tmp/gpu-8b
    python -m benchmarks.gpu.harness bench summary stop --run-dir /tmp/gpu-8b

Phases run in their fixed order whatever the order given: models, start, smoke, greedy,
switch, bench, daemon, summary, stop (`all` is every one). State lives in DIR/state.json, so
a later command continues the run (servers keep running between commands: they are started
in their own sessions). A failing phase records its error and the next one still runs; the
summary is rewritten at the end of every command, and `--out-tar` packs the whole folder.
"""

from __future__ import annotations

import argparse
import secrets
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.gpu import pack, phases, summary
from benchmarks.gpu.context import BUDGET_RESERVE_S, PhaseError, Run
from benchmarks.gpu.options import (
    PHASES,
    SERVER_PHASES,
    OptionError,
    add_arguments,
    resolve,
    validate,
)
from benchmarks.gpu.server_log import ControlMonitor
from benchmarks.gpu.state import RunState

PHASE_FUNCTIONS: dict[str, Callable[[Run], Any]] = {
    "models": phases.phase_models,
    "start": phases.phase_start,
    "smoke": phases.phase_smoke,
    "greedy": phases.phase_greedy,
    "switch": phases.phase_switch,
    "bench": phases.phase_bench,
    "daemon": phases.phase_daemon,
    "summary": lambda run: _summary(run),
    "stop": phases.phase_stop,
}
DEFAULT_RESULTS = Path("benchmarks/results/gpu")
MIN_PHASE_S = 30.0
ALWAYS_RUN = ("summary", "stop")  # whatever the budget left


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu.harness",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ap.add_argument("phases", nargs="+", metavar="PHASE",
                    help=f"one or more of: {', '.join(PHASES)}, all")
    ap.add_argument("--run-dir", type=Path, default=None,
                    help=f"results and state folder (default: {DEFAULT_RESULTS}/<run-name>)")
    ap.add_argument("--run-name", default=None, help="folder name under the default results "
                    "folder (default: the date and time)")
    ap.add_argument("--out-tar", type=Path, default=None,
                    help="also pack the results folder into this .tar.gz at the end")
    ap.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                    help="this command's time limit: phase timeouts shrink to fit it, a phase "
                    f"is skipped when less than {MIN_PHASE_S:g} s are left, and "
                    f"{BUDGET_RESERVE_S:g} s stay for the summary, the archive and "
                    "stop (not kept for later commands)")
    add_arguments(ap)
    return ap


def phase_list(names: list[str]) -> list[str]:
    wanted: set[str] = set()
    for name in names:
        if name == "all":
            wanted.update(PHASES)
        elif name in PHASES:
            wanted.add(name)
        else:
            raise OptionError(f"unknown phase {name!r}; phases: {', '.join(PHASES)}, all")
    return [p for p in PHASES if p in wanted]


def _summary(run: Run) -> dict[str, Any]:
    if run.state.servers and _servers_up(run):
        phases.record_server_info(run)  # the capacity fields as they are at the end
    written = summary.write(run.state)
    counts = written.get("sglang_log_lines") or {}
    return {"sglang_log_lines": counts.get("lines"),
            "sglang_own_choice_under_table_ok": counts.get("sglang_own_choice_under_table_ok")}


def _servers_up(run: Run) -> bool:
    from benchmarks.gpu.servers import healthy

    return all(healthy(url) for r in ("spec", "plain") if (url := run.state.url(r)))


def run_phase(run: Run, name: str) -> bool:
    run.say(f"== phase {name}")
    t0 = time.monotonic()
    try:
        result = PHASE_FUNCTIONS[name](run)
    except Exception as err:  # recorded, and the next phase still runs
        elapsed = time.monotonic() - t0
        detail = str(err) if isinstance(err, PhaseError | OptionError | ValueError) \
            else "".join(traceback.format_exception(err)[-3:])
        partial = err.result if isinstance(err, PhaseError) else None
        run.state.record_phase(name, "failed", elapsed, partial, error=detail.strip())
        run.say(f"== phase {name}: FAILED after {elapsed:.1f} s: {detail.strip()}")
        return False
    elapsed = time.monotonic() - t0
    run.state.record_phase(name, "ok", elapsed, result)
    run.say(f"== phase {name}: ok in {elapsed:.1f} s")
    return True


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    explicit = {k: v for k, v in vars(args).items()
                if k not in ("phases", "run_dir", "run_name", "out_tar", "budget")}
    try:
        names = phase_list(args.phases)
        run_dir = args.run_dir or DEFAULT_RESULTS / (args.run_name
                                                     or time.strftime("%Y%m%d-%H%M%S"))
        state = RunState.load(run_dir)
        opts = resolve(state.data["options"], explicit)
        validate(opts)
        if args.budget is not None and args.budget <= BUDGET_RESERVE_S:
            raise OptionError(f"--budget: give more than {BUDGET_RESERVE_S:g} s (that "
                              "much is kept for the summary, the archive and stop)")
    except (OptionError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    state.data["options"] = {**state.data["options"], **explicit}
    state.data.setdefault("admin_key", secrets.token_hex(12))
    state.data["backend"] = opts.backend
    state.data["commands"].append({"argv": sys.argv[1:] if argv is None else argv,
                                   "at": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
    state.save()
    t0 = time.monotonic()
    run = Run(opts, state, None if args.budget is None else t0 + args.budget)
    print(f"run folder: {run_dir.resolve()}", flush=True)
    monitor: ControlMonitor | None = None
    ok = True
    for name in names:
        if name in SERVER_PHASES and monitor is None and state.url("spec"):
            monitor = ControlMonitor(state.url("spec") or "", Path(state.servers["spec"]["log"]))
            monitor.start()
        if name in ("summary", "stop") and monitor is not None:
            state.add_control_windows(monitor.stop())
            monitor = None
        if name not in ALWAYS_RUN and run.time_left() < MIN_PHASE_S:
            why = f"skipped: {max(run.time_left(), 0):.0f} s of the --budget left"
            run.state.record_phase(name, "skipped", 0.0, error=why)
            run.say(f"== phase {name}: {why}")
            ok = False
            continue
        ok = run_phase(run, name) and ok
    if monitor is not None:
        state.add_control_windows(monitor.stop())
    if "summary" not in names:
        summary.write(state)
    print(f"results: {run_dir.resolve()} (summary.md, summary.json); "
          f"{time.monotonic() - t0:.0f} s", flush=True)
    if args.out_tar is not None:
        packed = pack.pack(run_dir, args.out_tar)
        print(f"packed {packed['files']} files into {packed['path']} "
              f"({int(packed['bytes']) / 1e6:.1f} MB)", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
