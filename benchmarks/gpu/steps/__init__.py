"""The harness's steps, in the order they run whatever order a command names them.

A step is one function `run(Run) -> dict` (the JSON-able result kept in state.json; raise
`context.StepError` with a message naming the fix, and the partial result, when it cannot do
its job) and one entry here. Its options are fields of `options.Options`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from benchmarks.gpu.context import Run
from benchmarks.gpu.steps import (
    acceptance,
    bench,
    check,
    compare,
    daemon,
    finish,
    parity,
    setup,
    shapes,
    trace,
    treeswitch,
)


@dataclass(frozen=True)
class Step:
    name: str
    run: Callable[[Run], dict[str, Any]]
    doc: str  # one line for --help
    uses_servers: bool = True  # the control-window monitor watches the log meanwhile
    always: bool = False  # runs whatever the --budget left (the end of every command)


STEPS: tuple[Step, ...] = (
    Step("setup", setup.run, "machine facts, model folders, both servers up", False),
    Step("acceptance", acceptance.run, "accept length per prompt family and depth"),
    Step("check", check.run, "smoke test, greedy check, depth on/off switches under load"),
    Step("bench", bench.run, "specctl bench over the depths, the plain server beside"),
    Step("parity", parity.run, "depth 0 against the plain server: paired series, verdict"),
    Step("compare", compare.run, "specctl bench beside SGLang's bench_serving, same prompts"),
    Step("shapes", shapes.run, "SGLang's static draft shapes (chains, trees) and plain, "
         "each alone: per-shape benches"),
    Step("treeswitch", treeswitch.run, "draft shapes captured and switched inside one server, "
         "against stock servers"),
    Step("trace", trace.run, "a closed-loop load trace per policy, compared"),
    Step("daemon", daemon.run, "specctl daemon under a stepped load"),
    Step("summary", finish.summarize, "summary.md and summary.json", False, True),
    Step("stop", finish.stop, "stop both servers", False, True),
)


def order() -> tuple[str, ...]:
    return tuple(s.name for s in STEPS)


def by_name(name: str) -> Step:
    return next(s for s in STEPS if s.name == name)
