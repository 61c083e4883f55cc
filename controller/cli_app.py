"""The root `specctl` Typer application; command modules attach themselves to it.

Each command lives in its own module (listed in `controller.cli.COMMAND_MODULES`) and registers
with `@app.command()` or `app.add_typer(...)`, so commands can be read and tested alone.
"""

from __future__ import annotations

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
