"""`specctl release --url URL`: hand a server back to SGLang's own choice (or strip its probes).

What a daemon does by itself on exit (`on_exit`), by hand: for a server whose daemon died
without handing back (SIGKILL, a lost host), or to take a table off a server for a comparison.
"""

from __future__ import annotations

from typing import Annotated

import typer

from controller.cli import app
from controller.cli.args import ADMIN_KEY_ENV, API_KEY_ENV, API_KEY_HELP, fail


@app.command("release")
def release(
    url: Annotated[str, typer.Option(help="The server, e.g. http://127.0.0.1:30000.")],
    admin_key: Annotated[
        str | None,
        typer.Option(envvar=ADMIN_KEY_ENV, help="The server's --admin-api-key (Bearer)."),
    ] = None,
    api_key: Annotated[str | None, typer.Option(envvar=API_KEY_ENV, help=API_KEY_HELP)] = None,
    keep_table: Annotated[
        bool,
        typer.Option(
            "--keep-table",
            help="Keep the live table, without its probes, instead of releasing the server.",
        ),
    ] = False,
) -> None:
    """Hand a server back to SGLang's own choice.

    No specctl table, no probes (or, with --keep-table, the live table without its probes).
    Prints what the server ran before and what it runs now. A running specctl daemon pushes
    again at its next decision: stop it first (it hands back by itself on exit, see
    `on_exit` in its config). Exit status 2 when the server cannot be reached, refuses the
    admin key or the API key, or has no specctl plugin.

    \b
    Examples:
      specctl release --url http://127.0.0.1:30000
      specctl release --url http://127.0.0.1:30000 --admin-key "$ADMIN_KEY"
      specctl release --url http://127.0.0.1:30000 --keep-table
    """
    from controller.daemon.config import url_problem

    problem = url_problem(url)
    if problem is not None:
        raise typer.BadParameter(problem, param_hint="--url")
    from controller.bench.server_client import ServerClient, ServerError
    from controller.daemon.handback import describe, has_probes, without_probes

    try:
        with ServerClient(url, admin_key, api_key=api_key) as server:
            before = server.state()
            typer.echo(f"before: {describe(before.table)} (source {before.source})")
            if keep_table:
                if before.table is None:
                    typer.echo("now:    unchanged: no table to keep, nothing pushed")
                    return
                if not has_probes(before.table):
                    typer.echo("now:    unchanged: the table has no probes, nothing pushed")
                    return
                target = without_probes(before.table, before.table.version + 1)
            else:
                if before.table is None:
                    typer.echo("now:    unchanged: already released, nothing pushed")
                    return
                target = None
            after = server.push(target)
    except ServerError as err:
        raise fail(str(err)) from None
    typer.echo(f"now:    {describe(after.table)} (source {after.source})")
