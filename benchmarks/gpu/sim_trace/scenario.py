"""The GPU trace's phases as a simulator scenario, with the daemon settings the trace ran.

A phase `secs:streams:dataset` becomes `secs` seconds of a closed loop of `streams` clients
(step interpolation) whose new requests draw the acceptance phase named after the dataset;
at each phase's start every client's request is cut and the clients start afresh, as the
trace's load generator cuts its streams at each phase's end. Before the first phase the
server idles for the seconds the trace gives its daemon to start (not scored: the warm-up).

`clock` is the served simulator's speedup when the run's servers were `specctl sim serve`
(the harness's CPU backend): the trace's seconds and the daemon's intervals were wall
seconds, so they last `clock` times as long on the server's clock. 1 on a GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.gpu.daemon_run import daemon_config
from benchmarks.gpu.seeded.trace import DAEMON_START_WAIT_S, Phase
from sims.workload import (
    DaemonOverrides,
    LengthDist,
    PhaseStep,
    Scenario,
    Trace,
    Workload,
)

# daemon_config's schedule keys that are not settings of the evaluated daemon
WALL_ONLY = ("clock", "duration_s")


@dataclass(frozen=True)
class DaemonSettings:
    """The trace daemon's schedule and guardrails, on the server's clock."""

    schedule: dict[str, float] = field(default_factory=dict)
    guardrails: dict[str, float] = field(default_factory=dict)

    @property
    def scrape_s(self) -> float:
        return self.schedule["scrape_interval_s"]


def _scaled(section: dict[str, object], clock: float) -> dict[str, float]:
    """A config section's values, its seconds (keys ending `_s`) times `clock`."""
    out: dict[str, float] = {}
    for key, value in section.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"daemon_config: {key}={value!r} is not a number the evaluated "
                             "daemon can take")  # fmt: skip
        out[key] = float(value) * (clock if key.endswith("_s") else 1.0)
    return out


def harness_daemon(clock: float = 1.0) -> DaemonSettings:
    """What `benchmarks.gpu.daemon_run.daemon_config` gives the trace's daemon (one source:
    a change there changes the simulated daemon too), less what only a wall-clock daemon
    has; the URL, key and store are placeholders it does not use."""
    config = daemon_config("http://127.0.0.1:1", "", Path("unused.sqlite"), 0.0)
    schedule = {k: v for k, v in config["schedule"].items() if k not in WALL_ONLY}
    return DaemonSettings(_scaled(schedule, clock), _scaled(config.get("guardrails", {}), clock))


def trace_scenario(
    phases: Sequence[Phase],
    *,
    prompt_tokens: LengthDist,
    output_tokens: LengthDist,
    daemon: DaemonSettings,
    clock: float = 1.0,
    lead_s: float = DAEMON_START_WAIT_S,
    name: str = "gpu-trace",
) -> Scenario:
    """The scenario of `phases` (see the module docstring); times on the server's clock."""
    if not phases:
        raise ValueError("a trace needs at least one phase")
    lead = lead_s * clock
    starts: list[float] = []
    t = lead
    for phase in phases:
        starts.append(round(t, 6))
        t += phase.seconds * clock
    points = [(s, float(p.concurrency)) for s, p in zip(starts, phases, strict=True)]
    if lead > 0:
        points.insert(0, (0.0, 0.0))
    steps: list[PhaseStep] = []
    for s, p in zip(starts, phases, strict=True):
        if not steps or steps[-1].phase != p.dataset:
            steps.append(PhaseStep(at=s, phase=p.dataset))
    workload = Workload.model_validate({
        "mode": "closed",
        "concurrency": Trace(points=points, interpolation="step"),
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "phases": steps,
        "cut_at": starts,
    })  # fmt: skip
    text = ", ".join(f"{p.seconds:g} s at {p.concurrency} on {p.dataset}" for p in phases)
    return Scenario(
        name=name,
        description=f"The GPU harness's closed-loop trace: {text}"
        + (f" (times x{clock:g}: the servers' clock ran {clock:g}x wall time)"
           if clock != 1.0 else ""),
        duration_s=round(t, 6),
        warmup_s=lead,
        sample_interval_s=daemon.scrape_s,
        daemon=DaemonOverrides(schedule=daemon.schedule, guardrails=daemon.guardrails),
        workload=workload,
    )
