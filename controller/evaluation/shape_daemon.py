"""The daemon steering a simulated shape server through a closed loop of loads.

The same staircase `sims.shape_switch.closed_loop` runs every static shape and a bench's table
over, here with the daemon in charge of the shape server from an empty store: it scrapes the
server's per-shape counters, learns each shape's tok/s per batch bucket
(`models.shape_learner`), probes and pushes tables, all on the simulated clock. What it earns
over the trace is what learning on the server costs and wins against knowing the bench's table
beforehand.
"""

from __future__ import annotations

import itertools
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.daemon.config import parse_config
from controller.daemon.loop import Controller
from controller.daemon.own_metrics import DaemonMetrics
from controller.daemon.runner import TickInfo, run_simulated
from controller.daemon.store import Store
from controller.daemon.transport import InProcessTransport
from controller.evaluation.evaluate import NominalClock, live_table_of
from sglang_hooks.contract import PolicyTable
from sims.engine import SimStats
from sims.profile import Profile
from sims.server import SimulatedServer
from sims.shape_table import staircase
from sims.workload import Trace, Workload

DAEMON = "daemon"  # the label of the daemon's run beside the static shapes' and the table's


@dataclass(frozen=True)
class DaemonLoopRun:
    tok_per_s: float  # every output token over the whole trace
    per_step: list[float]  # tok/s in each step of the trace
    completed: int
    pushes: list[dict[str, Any]]  # t, outcome, reason (opening with the table), detail
    exploration_share: float
    final_table: PolicyTable | None  # what the server ran at the trace's end


def daemon_closed_loop(profile: Profile, shapes: Sequence[str], phase: str,
                       streams: Sequence[int], step_s: float, prompt_tokens: int,
                       output_tokens: int | tuple[int, int], seed: int,
                       scrape_s: float = 2.0, decide_s: float = 4.0,
                       on_tick: Callable[[float], None] | None = None
                       ) -> DaemonLoopRun:  # fmt: skip
    """The daemon, from an empty store, on a shape server that captured `shapes`, over the
    staircase of `streams` (each held `step_s`), as `closed_loop` runs the static shapes."""
    steps = staircase(streams)
    trace = Trace(points=[(i * step_s, float(s)) for i, s in enumerate(steps)],
                  interpolation="step")  # fmt: skip
    workload = Workload.closed(trace, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                               phase=phase)  # fmt: skip
    server = SimulatedServer(profile, workload, seed=seed, shapes=list(shapes))
    clock = NominalClock(server)
    with tempfile.TemporaryDirectory(prefix="specctl-shape-daemon-") as tmp:
        config = parse_config({
            "targets": [{"name": "sim", "group": "shapes", "simulated": {"seed": seed}}],
            "schedule": {"clock": "simulated", "scrape_interval_s": scrape_s,
                         "fit_interval_s": decide_s, "decide_interval_s": decide_s},
            "store": {"path": str(Path(tmp) / "shapes.sqlite")},
            "metrics": {"enabled": False}, "seed": seed,
        }, "the shape server's daemon")  # fmt: skip
        store = Store(config.store.resolved_path())
        controller = Controller(config, store, {"sim": InProcessTransport(server)},
                                metrics=DaemonMetrics())  # fmt: skip
        controller.start(server.now)
        marks: list[SimStats] = [server.stats()]

        def tick(info: TickInfo) -> None:
            while len(marks) <= len(steps) and info.now >= len(marks) * step_s - 1e-9:
                marks.append(server.stats())
            if on_tick is not None:
                on_tick(info.now)

        run_simulated(controller, {"sim": clock}, until_s=len(steps) * step_s, speedup=None,
                      on_tick=tick)  # fmt: skip
        while len(marks) <= len(steps):  # the last tick lands on the trace's end
            marks.append(server.stats())
        pushes = [{"t": round(p.t, 1), "outcome": p.outcome, "reason": p.reason,
                   "detail": p.detail}
                  for p in store.pushes("sim")]  # fmt: skip
        final = live_table_of(server)
        controller.close()
        store.close()
    end = marks[-1]
    explore = end.explore_iterations / end.decode_iterations if end.decode_iterations else 0.0
    return DaemonLoopRun(
        tok_per_s=end.tok_per_s_since(marks[0]),
        per_step=[b.tok_per_s_since(a) for a, b in itertools.pairwise(marks)],
        completed=end.completed_requests - marks[0].completed_requests,
        pushes=pushes,
        exploration_share=explore,
        final_table=final,
    )
