"""`specctl sim ...`: run the simulator (sweep, serve, evaluate)."""

from __future__ import annotations

import typer

from controller.cli_app import app
from sims.profile import builtin_profiles

sim_app = typer.Typer(help="Simulated SGLang server: sweeps, a served stand-in, evaluations.")
app.add_typer(sim_app, name="sim")


@sim_app.command("profiles")
def list_profiles() -> None:
    """List the built-in profiles."""
    for name in builtin_profiles():
        typer.echo(name)
