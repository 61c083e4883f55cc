"""`specctl daemon [--config PATH]`: run the controller until interrupted (or duration_s).

The work is in controller/cli/daemon_run.py, loaded when the command runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from controller.cli import app


@app.command("daemon")
def daemon_command(
    config: Annotated[
        Path | None,
        typer.Option(
            "--config", "-c", help="controller.yaml; default: an in-process simulated server"
        ),
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging")] = False,
) -> None:
    """Run the controller: scrape, store, learn, push.

    For every target in the config, until interrupted (or schedule.duration_s).

    Without --config: the embedded default, a simulated Kimi-K2.5 server for 30 simulated
    minutes, stored in ~/.local/state/specctl/simulated.sqlite (`specctl curves` and
    `specctl freeze` read it next).

    \b
    Examples:
      specctl daemon && specctl curves
      specctl daemon --config controller.yaml
      specctl daemon -c controller.yaml -v    # debug logging
    """
    from controller.cli.args import fail
    from controller.cli.daemon_run import run_daemon
    from controller.daemon.config import ConfigError, load_config

    try:
        cfg = load_config(config)
    except ConfigError as err:
        raise fail(str(err)) from None
    run_daemon(cfg, verbose=verbose)
