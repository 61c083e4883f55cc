"""`specctl demo`: the daemon learning a simulated Kimi-K2.5 server, in under a minute.

A simulated server (profile kimi-k25-8x-rtxpro6000-pcie, the ramp scenario: 1 -> 250 -> 1
clients over 30 simulated minutes) runs in-process; the real daemon scrapes it, stores samples
in SQLite, fits the learner and pushes tables through the admin RPC payloads, on an accelerated
clock. At the end: the learned tok/s curves and the table it would freeze. The samples stay in
the demo's store (controller/cli/stores.py), where `specctl curves` and `specctl freeze` find
them; controller/cli/demo_run.py does the work.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from controller.cli import app
from controller.cli.args import fail, output_file_problem
from controller.cli.sim import scenario_option
from controller.cli.stores import DEMO_STORE


@app.command("demo")
def demo_command(
    scenario: Annotated[str, typer.Option(help="Workload scenario (name or YAML path)")] = "ramp",
    seed: Annotated[int, typer.Option(min=0, help="Seed of the simulator and the learner")] = 0,
    freeze: Annotated[
        Path | None,
        typer.Option(help="Also write the frozen policy file here (its folder must exist)"),
    ] = None,
) -> None:
    """Watch specctl learn a simulated Kimi-K2.5 server.

    The daemon learns an in-process simulated server on an accelerated clock; at the end it
    prints the learned curves and the table it would freeze.

    The samples are kept in ~/.local/state/specctl/demo.sqlite (replacing the previous
    demo's), so `specctl curves` and `specctl freeze` work right after.

    \b
    Examples:
      specctl demo
      specctl demo --scenario bursty --seed 1
      specctl demo --freeze policy.yaml && specctl freeze --check policy.yaml
    """
    duration_s = scenario_option(scenario).duration_s
    if freeze is not None and (problem := output_file_problem(freeze, "--freeze")) is not None:
        raise fail(problem)
    from controller.cli.demo_run import run_demo

    run_demo(scenario, duration_s, seed, freeze, DEMO_STORE.expanduser())
