"""`specctl serve -- <sglang launch_server args>`: start SGLang with the plugin enabled.

Adds --speculative-adaptive, an adaptive config capturing every allowed depth at every batch
size, --enable-metrics and SGLANG_PLUGINS=specctl, then prints the admin URL for the daemon.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from controller.cli_app import app
from sglang_hooks import launch


@app.command(
    "serve",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)
def serve(
    ctx: typer.Context,
    depths: Annotated[
        str,
        typer.Option(help="Comma-separated depths to capture at start-up (0 = drafting off). "
                     "A table can only use captured depths."),
    ] = ",".join(map(str, launch.DEFAULT_DEPTHS)),
    config_out: Annotated[
        Path | None,
        typer.Option(help="Where to write the adaptive config (default: a temporary file)."),
    ] = None,
    policy_file: Annotated[
        Path | None,
        typer.Option(help="Frozen start-up table (YAML/JSON with a `table:`); "
                     "sets SPECCTL_POLICY_FILE."),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the command, do not run it.")
    ] = False,
) -> None:
    """Launch SGLang with the specctl plugin: `specctl serve -- --model-path ... `."""
    try:
        depth_list = [int(d) for d in depths.split(",") if d.strip()]
        config = config_out or Path(tempfile.gettempdir()) / "specctl-adaptive.json"
        argv, env, notes = launch.build_command(ctx.args, config, python=sys.executable)
    except ValueError as err:
        typer.echo(f"error: {err}", err=True)
        raise typer.Exit(2) from None
    if policy_file is not None:
        if not policy_file.is_file():
            typer.echo(f"error: --policy-file {policy_file}: no such file", err=True)
            raise typer.Exit(2)
        env["SPECCTL_POLICY_FILE"] = str(policy_file.resolve())
    for note in notes:
        typer.echo(f"note: {note}", err=True)
    url = launch.admin_url(ctx.args)
    if dry_run:
        typer.echo(f"# adaptive config {config}: {launch.adaptive_config(depth_list)}")
        typer.echo(launch.render(argv, env))
        typer.echo(f"# admin URL for the daemon: {url}")
        return
    launch.write_config(config, depth_list)
    typer.echo(f"admin URL for the daemon: {url}  (POST {url}/set_internal_state)", err=True)
    raise typer.Exit(subprocess.call(argv, env={**os.environ, **env}))
