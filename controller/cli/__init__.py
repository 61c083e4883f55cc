"""The `specctl` CLI: the root Typer application and the console script's entry point.

Each command lives in its own module of this package (listed in `COMMAND_MODULES`) and
registers with `@app.command()` or `app.add_typer(...)`, so commands can be read and tested
alone. Nothing below the CLI imports it: `main` loads the command modules by name.

Command modules import only typer and light modules at the top, and everything heavy (the
learner, the simulator, matplotlib, httpx, rich) inside the command that needs it, so
`specctl --help` answers at once (benchmarks/cli_startup.py measures it).

Help is click's plain text (paragraphs rewrapped to the terminal; examples kept as written
behind click's `\\b` marker), and every usage error is one `error:` line, exit status 2.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Sequence
from typing import Any

import typer
from typer.core import TyperGroup

try:  # typer vendors click since 0.2x; before, click was a dependency of its own
    from typer._click import exceptions as click_errors
except ImportError:  # pragma: no cover
    from click import exceptions as click_errors  # type: ignore[no-redef]


# typer checks `min=` / `max=` with pydantic, whose messages read "Input should be greater
# than or equal to 1"; the CLI's own messages read "must be >= 1".
_REWRITES = (
    ("Input should be ", "must be "),
    ("a valid integer, unable to parse string as an integer", "an integer"),
    ("a valid number, unable to parse string as a number", "a number"),
    ("greater than or equal to ", ">= "),
    ("less than or equal to ", "<= "),
    ("greater than ", "> "),
    ("less than ", "< "),
)


def _value_message(err: click_errors.BadParameter) -> str:
    message = err.message
    for old, new in _REWRITES:
        message = message.replace(old, new)
    errors = getattr(err.__cause__, "errors", None)
    if callable(errors):
        with contextlib.suppress(Exception):
            given = errors()[0].get("input")
            if given is not None:
                message += f", got {given}"
    return message


def usage_error_line(err: click_errors.ClickException) -> str:
    """A usage error as one line naming the option: `error: --url: 'x' has no scheme: ...`."""
    ctx = getattr(err, "ctx", None)
    help_hint = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
    if isinstance(err, click_errors.BadParameter) and not isinstance(
        err, click_errors.MissingParameter
    ):
        hint = err.param_hint
        if hint is None and err.param is not None:
            hint = list(getattr(err.param, "opts", None) or [err.param.name or ""])
        if isinstance(hint, (list, tuple)):
            hint = " / ".join(hint)
        if hint:
            return f"error: {str(hint).replace(chr(39), '')}: {_value_message(err)}"
    message = " ".join(err.format_message().split()).rstrip(".")
    return f"error: {message}{help_hint}"


class OneLineErrors(TyperGroup):
    """The root command: usage errors print as one line (click prints three, rich a box)."""

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click_errors.NoArgsIsHelpError as err:
            if not standalone_mode:
                raise
            err.show()
            sys.exit(err.exit_code)
        except click_errors.ClickException as err:
            if not standalone_mode:
                raise
            typer.echo(usage_error_line(err), err=True)
            sys.exit(err.exit_code)
        except typer.Abort:
            if not standalone_mode:
                raise
            typer.echo("aborted", err=True)
            sys.exit(1)
        if not standalone_mode:
            return code
        # Not standalone, typer returns a command's exit status instead of raising it.
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(
    name="specctl",
    cls=OneLineErrors,
    help=(
        "Load-aware speculative decoding for SGLang: learn tok/s against concurrency and "
        "speculation depth, and push the best depth per batch size into the server."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain help: rich's boxes cut defaults with `…` and wrap the docstrings a second time.
    rich_markup_mode=None,
)

# One module per command (group); importing a module registers its commands on `app`.
COMMAND_MODULES = (
    "controller.cli.sim",
    "controller.cli.sim_fit",
    "controller.cli.sim_shapes",
    "controller.cli.bench",
    "controller.cli.status",
    "controller.cli.curves",
    "controller.cli.freeze",
    "controller.cli.release",
    "controller.cli.serve",
    "controller.cli.daemon",
    "controller.cli.evaluate",
    "controller.cli.demo",
)


def load_commands() -> typer.Typer:
    """`app` with every command registered."""
    for name in COMMAND_MODULES:
        importlib.import_module(name)
    return app


def main() -> None:
    load_commands()
    app()
