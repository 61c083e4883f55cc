"""`specctl serve -- <sglang launch_server args>`: start SGLang with the plugin enabled.

Adds --speculative-adaptive, an adaptive config capturing every allowed depth at every batch
size and --enable-metrics, adds specctl to SGLANG_PLUGINS when that variable lists plugins
(unset, SGLang loads every installed plugin), then prints the admin URL for the daemon. It sets
no plugin variable but SPECCTL_POLICY_FILE (--policy-file) and, with --shapes, SPECCTL_SHAPES:
SGLang then starts statically at the shape that dominates the list, on FlashAttention 3, and
the plugin captures the others (`plain` as depth 0, off). The plugin runs the same code however
it was loaded.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from controller.cli import app
from controller.cli.args import parse_int_list
from sglang_hooks import launch
from sglang_hooks.contract import MAX_DEPTH, PolicyError, PolicyTable, off_field
from sglang_hooks.draft_shape import (
    DraftShape,
    Shape,
    ShapeError,
    depths_and_trees,
    label,
    parse_shapes,
)
from sglang_hooks.policy_file import POLICY_FILE_ENV, load_policy_file, table_fingerprint
from sglang_hooks.shape_launch import shape_launch

# Shown by --dry-run when no --config-out is given: a run writes a new temporary file there.
TEMP_CONFIG_PLACEHOLDER = Path(tempfile.gettempdir()) / "specctl-adaptive-XXXXXXXX.json"


@app.command(
    "serve",
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
)
def serve(
    ctx: typer.Context,
    depths: Annotated[
        str,
        typer.Option(help="Comma-separated depths to capture at start-up (0 = drafting off). "
                     "A table can only use captured depths. Ignored when the SGLang arguments "
                     "carry their own --speculative-adaptive-config."),
    ] = ",".join(map(str, launch.DEFAULT_DEPTHS)),
    config_out: Annotated[
        Path | None,
        typer.Option(help="Where to write the adaptive config (default: a new temporary file)."),
    ] = None,
    policy_file: Annotated[
        Path | None,
        typer.Option(help="Frozen start-up table (YAML/JSON with a `table:`); checked against "
                     "the captured depths, then set as SPECCTL_POLICY_FILE."),
    ] = None,
    shapes: Annotated[
        str | None,
        typer.Option(help="Draft shapes STEPSxTOPKxDRAFT to switch between, a tree among them "
                     "(like 3x4x16,3x1x4,plain): SGLang starts at the one that dominates the "
                     "others and the plugin captures the rest, plain as drafting off. "
                     "Replaces --depths."),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the command, do not run it.")
    ] = False,
) -> None:
    """Launch SGLang with the specctl plugin enabled.

    `specctl serve [OPTIONS] -- <sglang.launch_server arguments>`: adds adaptive speculation
    capturing --depths, the plugin and metrics, then prints the admin URL for the daemon.

    \b
    Examples:
      specctl serve -- --model-path meta-llama/Llama-3.1-8B-Instruct \\
          --speculative-algorithm EAGLE3 --speculative-draft-model-path ... \\
          --admin-api-key "$KEY" --max-running-requests 128
      specctl serve --depths 0,1,3 --policy-file policy.yaml -- --model-path ...
      specctl serve --shapes 3x4x16,3x1x4,plain -- --model-path ...
      specctl serve --dry-run -- --model-path m --speculative-algorithm EAGLE3
    """
    if shapes is not None:
        source = ctx.get_parameter_source("depths")
        if source is not None and source.name == "COMMANDLINE":
            _fail("--shapes replaces --depths: list the chains as shapes (depth d is dx1x(d+1))")
        _serve_shapes(ctx, shapes, policy_file, dry_run)
        return
    depth_list = list(parse_int_list(depths, "--depths", 0, MAX_DEPTH))
    own_config = launch.user_config(ctx.args)
    notes: list[str] = []
    try:
        if own_config is not None:
            captured = list(launch.config_depths(Path(own_config)))
            source = ctx.get_parameter_source("depths")
            if source is not None and source.name == "COMMANDLINE":
                notes.append(f"--depths is ignored: your --speculative-adaptive-config decides "
                             f"the captured depths (every slot lists {captured})")
        else:
            captured = depth_list
            launch.adaptive_config(depth_list)
            launch.check_num_steps(ctx.args, depth_list)
        # Checked before anything is written or started; the path is filled in below.
        launch.build_command(ctx.args, TEMP_CONFIG_PLACEHOLDER, python=sys.executable)
    except ValueError as err:
        _fail(str(err))
    env_extra: dict[str, str] = {}
    if policy_file is not None:
        if not policy_file.is_file():
            _fail(f"--policy-file {policy_file}: no such file")
        try:
            table = load_policy_file(policy_file, captured_depths=captured)
        except PolicyError as err:
            where = "" if err.field == POLICY_FILE_ENV else f" {err.field}"
            _fail(f"--policy-file{where}: {err.message}")
        notes.append(f"start-up table from {policy_file}: {table.describe()} "
                     f"[{table_fingerprint(table)}]")
        env_extra[POLICY_FILE_ENV] = str(policy_file.resolve())
        if launch.node_count(ctx.args) > 1:
            notes.append(f"--nnodes > 1: every TP rank reads {policy_file.resolve()} on its own "
                         f"node; copy the same file there on every node, or ranks run different "
                         f"depths and hang. Each rank logs 'start-up table: "
                         f"{table_fingerprint(table)}': check it matches on every node")
    url = launch.admin_url(ctx.args)
    if dry_run:
        shown = config_out or TEMP_CONFIG_PLACEHOLDER
        argv, env, build_notes = launch.build_command(ctx.args, shown, python=sys.executable,
                                                     current_env=os.environ)
        _notes(notes + build_notes)
        if own_config is None:
            where = str(shown) if config_out else "a new temporary file when run; --config-out PATH"
            typer.echo(f"# adaptive config ({where}): {launch.adaptive_config(depth_list)}")
        typer.echo(launch.render(argv, {**env, **env_extra}))
        typer.echo(f"# admin URL for the daemon: {url}")
        return
    config: Path = TEMP_CONFIG_PLACEHOLDER
    if own_config is None:
        try:
            config = _write_config(config_out, depth_list)
        except OSError as err:
            _fail(f"--config-out {config_out or tempfile.gettempdir()}: cannot write the "
                  f"adaptive config ({err.strerror or err})")
    argv, env, build_notes = launch.build_command(ctx.args, config, python=sys.executable,
                                                  current_env=os.environ)
    _notes(notes + build_notes)
    if own_config is None:
        typer.echo(f"adaptive config {config}: depths {depth_list}", err=True)
    typer.echo(f"admin URL for the daemon: {url}  (POST {url}/set_internal_state)", err=True)
    raise typer.Exit(subprocess.call(argv, env={**os.environ, **env, **env_extra}))


def _serve_shapes(ctx: typer.Context, text: str, policy_file: Path | None,
                  dry_run: bool) -> None:
    """A shape server: SGLang static at the dominating shape, SPECCTL_SHAPES for the plugin."""
    try:
        listed = parse_shapes(text)
        plan = shape_launch(listed, ctx.args)
        argv, env, notes = launch.build_command([*ctx.args, *plan.args], None,
                                                python=sys.executable, current_env=os.environ)
    except (ShapeError, ValueError) as err:
        _fail(f"--shapes: {err}" if isinstance(err, ShapeError) else str(err))
    notes = plan.notes + notes
    env = {**env, **plan.env}
    if policy_file is not None:
        table = _shapes_table(policy_file, listed)
        notes.append(f"start-up table from {policy_file}: {table.describe()} "
                     f"[{table_fingerprint(table)}]")
        env[POLICY_FILE_ENV] = str(policy_file.resolve())
    url = launch.admin_url(ctx.args)
    _notes(notes)
    if dry_run:
        typer.echo(launch.render(argv, env))
        typer.echo(f"# admin URL for the daemon: {url}")
        return
    typer.echo(f"shapes {','.join(label(s) for s in listed)}: SGLang starts at "
               f"{plan.start.label}", err=True)
    typer.echo(f"admin URL for the daemon: {url}  (POST {url}/set_internal_state)", err=True)
    raise typer.Exit(subprocess.call(argv, env={**os.environ, **env}))


def _shapes_table(policy_file: Path, listed: list[Shape]) -> PolicyTable:
    """The start-up table checked against what a shape server captures: its chains' depths
    and trees, and depth 0 (off) only when plain is listed."""
    depths, trees = depths_and_trees(listed)
    if 0 not in depths:
        # Its own fix: on a shape server depth 0 is captured by listing plain.
        where = off_field(_startup_table(policy_file, None, []).tiers)
        if where is not None:
            _fail(f"--policy-file {policy_file}: table.{where}: off (depth 0) is captured on a "
                  f"shape server only when plain is listed; add plain to --shapes")
    return _startup_table(policy_file, depths, trees)


def _startup_table(policy_file: Path, depths: list[int] | None,
                   trees: list[DraftShape]) -> PolicyTable:  # fmt: skip
    if not policy_file.is_file():
        _fail(f"--policy-file {policy_file}: no such file")
    try:
        return load_policy_file(policy_file, captured_depths=depths, captured_trees=trees)
    except PolicyError as err:
        where = "" if err.field == POLICY_FILE_ENV else f" {err.field}"
        _fail(f"--policy-file{where}: {err.message}")


def _write_config(config_out: Path | None, depths: list[int]) -> Path:
    if config_out is not None:
        return launch.write_config(config_out, depths)
    # A fresh file per launch: two servers on one host must not share (or race on) one path.
    fd, name = tempfile.mkstemp(prefix="specctl-adaptive-", suffix=".json")
    os.close(fd)
    return launch.write_config(Path(name), depths)


def _notes(notes: list[str]) -> None:
    for note in notes:
        typer.echo(f"note: {note}", err=True)


def _fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)
