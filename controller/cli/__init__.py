"""The `specctl` CLI: the root Typer application and the console script's entry point.

Each command lives in its own module of this package (listed in `COMMAND_MODULES`) and
registers with `@app.command()` or `app.add_typer(...)`, so commands can be read and tested
alone. Nothing below the CLI imports it: `main` loads the command modules by name.
"""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="specctl",
    help=(
        "Load-aware speculative decoding for SGLang: learn tok/s against concurrency and "
        "speculation depth, and push the best depth per batch size into the server."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# One module per command (group); importing a module registers its commands on `app`.
COMMAND_MODULES = (
    "controller.cli.sim",
    "controller.cli.sim_fit",
    "controller.cli.bench",
    "controller.cli.status",
    "controller.cli.curves",
    "controller.cli.freeze",
    "controller.cli.serve",
    "controller.cli.daemon",
    "controller.cli.evaluate",
    "controller.cli.demo",
)


def main() -> None:
    for name in COMMAND_MODULES:
        importlib.import_module(name)
    app()

