"""The runner behind `python -m benchmarks.gpu` (its manual: benchmarks/gpu/__main__.py).

Parses a command, layers its options over the run's saved ones, runs the steps it names in
their fixed order (benchmarks/gpu/steps/), records each step's outcome in DIR/state.json (a
failing step records its error and the next one still runs), rewrites the summary at the end
of every command and packs the run folder into --out-tar.
"""

from __future__ import annotations

import argparse
import secrets
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

from benchmarks.gpu import pack, steps, summary
from benchmarks.gpu.context import BUDGET_RESERVE_S, Run, StepError
from benchmarks.gpu.options import OptionError, add_arguments, resolve, validate
from benchmarks.gpu.server_log import ControlMonitor
from benchmarks.gpu.state import RunState

PROG = "python -m benchmarks.gpu"
MIN_STEP_S = 30.0
COMMAND_ARGS = ("steps", "run_dir", "out_tar", "budget")  # not saved as the run's options


class OneLineParser(argparse.ArgumentParser):
    """Bad usage is one line on stderr and exit status 2, not the usage text."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {message} (see {PROG} --help)", file=sys.stderr)
        sys.exit(2)


def parser() -> argparse.ArgumentParser:
    listed = "\n".join(f"  {s.name:<11} {s.doc}" for s in steps.STEPS)
    ap = OneLineParser(
        prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter,
        usage=f"{PROG} STEP [STEP...] --run-dir DIR [options]",
        description="A speculative and a plain SGLang server on one GPU, checked and measured\n"
                    "in steps, which run in this order whatever order they are given (`all`:\n"
                    f"every one; the manual: benchmarks/gpu/__main__.py):\n{listed}",
    )  # fmt: skip
    ap.add_argument("steps", nargs="+", metavar="STEP",
                    help=f"{', '.join(steps.order())} or all")
    ap.add_argument("--run-dir", type=Path, required=True, metavar="DIR",
                    help="the run's folder: results, logs and state.json, which a later "
                    "command of the run continues from (servers stay up between commands)")
    ap.add_argument("--out-tar", type=Path, default=None, metavar="FILE",
                    help="pack the run folder into this .tar.gz at the end of the command, "
                    "and after each series and trace (weights and prompt sets left out)")
    ap.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                    help="this command's time limit: step timeouts shrink to fit it, a step "
                    f"is skipped when less than {MIN_STEP_S:g} s are left, and "
                    f"{BUDGET_RESERVE_S:g} s stay for the summary, the archive and stop "
                    "(not kept for later commands)")
    add_arguments(ap)
    return ap


def step_list(names: list[str]) -> list[str]:
    order = steps.order()
    wanted: set[str] = set()
    for name in names:
        if name == "all":
            wanted.update(order)
        elif name in order:
            wanted.add(name)
        else:
            raise OptionError(f"unknown step {name!r}; steps: {', '.join(order)}, all")
    return [s for s in order if s in wanted]


def run_step(run: Run, name: str) -> bool:
    run.say(f"== step {name}")
    t0 = time.monotonic()
    try:
        result = steps.by_name(name).run(run)
    except Exception as err:  # recorded, and the next step still runs
        elapsed = time.monotonic() - t0
        detail = str(err) if isinstance(err, StepError | OptionError | ValueError) \
            else "".join(traceback.format_exception(err)[-3:])
        partial = err.result if isinstance(err, StepError) else None
        run.state.record_step(name, "failed", elapsed, partial, error=detail.strip())
        run.say(f"== step {name}: FAILED after {elapsed:.1f} s: {detail.strip()}")
        return False
    elapsed = time.monotonic() - t0
    run.state.record_step(name, "ok", elapsed, result)
    run.say(f"== step {name}: ok in {elapsed:.1f} s")
    return True


def checkpointer(state: RunState, out_tar: Path | None) -> Callable[[], None]:
    """The command's checkpoint: the state and the summary written, the folder packed."""

    def checkpoint() -> None:
        state.save()
        summary.write(state)
        if out_tar is not None:
            packed = pack.pack(state.run_dir, out_tar)
            print(f"packed {packed['files']} files into {packed['path']} "
                  f"({int(packed['bytes']) / 1e6:.1f} MB)", flush=True)

    return checkpoint


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    explicit = {k: v for k, v in vars(args).items() if k not in COMMAND_ARGS}
    try:
        names = step_list(args.steps)
        state = RunState.load(args.run_dir)
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
    checkpoint = checkpointer(state, args.out_tar)
    run = Run(opts, state, None if args.budget is None else t0 + args.budget,
              on_checkpoint=checkpoint)
    print(f"run folder: {args.run_dir.resolve()}", flush=True)
    monitor: ControlMonitor | None = None
    ok = True
    for name in names:
        step = steps.by_name(name)
        if step.uses_servers and monitor is None and state.url("spec"):
            monitor = ControlMonitor(state.url("spec") or "", Path(state.servers["spec"]["log"]))
            monitor.start()
        if not step.uses_servers and monitor is not None:
            state.add_control_windows(monitor.stop())
            monitor = None
        if not step.always and run.time_left() < MIN_STEP_S:
            why = f"skipped: {max(run.time_left(), 0):.0f} s of the --budget left"
            run.state.record_step(name, "skipped", 0.0, error=why)
            run.say(f"== step {name}: {why}")
            ok = False
            continue
        ok = run_step(run, name) and ok
    if monitor is not None:
        state.add_control_windows(monitor.stop())
    checkpoint()
    print(f"results: {args.run_dir.resolve()} (summary.md, summary.json); "
          f"{time.monotonic() - t0:.0f} s", flush=True)
    return 0 if ok else 1
