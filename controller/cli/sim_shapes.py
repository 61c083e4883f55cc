"""`specctl sim shapes`: each static draft shape's tok/s per load on a profile that describes
shapes, and the best shape per load."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from controller.cli.args import (
    fail,
    output_file_problem,
    parse_int_list,
    parse_length,
    plot_path_problem,
)
from controller.cli.sim import _fits, _profile, finite_positive, sim_app

if TYPE_CHECKING:
    from sims.shape_sweep import ShapeSweepResult


def _shape_list(text: str, known: list[str]) -> list[str]:
    """The shapes `--shapes` names, each checked against the notation and the profile."""
    from sglang_hooks.draft_shape import ShapeError, label, parse_shapes

    try:
        names = [label(s) for s in parse_shapes(text)]
    except ShapeError as err:
        raise typer.BadParameter(str(err), param_hint="--shapes") from None
    unknown = [n for n in names if n not in known]
    if unknown:
        raise typer.BadParameter(
            f"shape {unknown[0]} is not in the profile (it has {', '.join(known)}); fit it "
            "from a bench of shapes (specctl sim fit --shapes SHAPES_DIR)",
            param_hint="--shapes",
        )
    return names


def _write_policy(result: ShapeSweepResult, phase: str, path: Path) -> None:
    """The phase's best shape per load as a policy file, with where it came from."""
    import datetime as dt

    from controller.daemon.policy_file import PolicyFile, Provenance, dump

    table = result.table(phase)
    if table is None:
        raise fail(f"--policy-out {path}: no table for phase {phase}: some load has no best "
                   "shape (fewer requests finished than there are streams); lengthen --duration")
    spec = result.spec
    provenance = Provenance(
        created_at=dt.datetime.now(dt.UTC).replace(microsecond=0),
        created_by="specctl sim shapes",
        fingerprint=table.fingerprint,
        profile=result.profile,  # type: ignore[call-arg]  # extra keys are kept
        phase=phase,
        streams=list(spec.streams),
        shapes=list(spec.shapes),
    )
    dump(PolicyFile(table=table, provenance=provenance), path)
    typer.echo(f"wrote {path}: {table.describe()}", err=True)


@sim_app.command("shapes")
def shapes(
    profile: Annotated[
        str, typer.Option(help="Built-in profile or profile YAML that describes draft shapes")
    ],
    streams: Annotated[
        str, typer.Option(help="Closed-loop stream counts, comma-separated")
    ] = "1,4,16,64,128,256",
    shape_names: Annotated[
        str | None,
        typer.Option("--shapes", help="Shapes to run, STEPSxTOPKxDRAFT or plain, "
                     "comma-separated (default: every shape of the profile)"),
    ] = None,
    phase: Annotated[
        str | None,
        typer.Option(help="Acceptance phase (a bench of shapes' prompt family; default: each)"),
    ] = None,
    duration: Annotated[float, typer.Option(help="Simulated seconds per point")] = 120.0,
    warmup: Annotated[float, typer.Option(help="Simulated seconds not scored per point")] = 20.0,
    prompt_tokens: Annotated[
        int | None,
        typer.Option(min=1, help="Prompt length of every request (default: the profile's "
                     "reference)"),
    ] = None,
    output_tokens: Annotated[
        str | None,
        typer.Option(help="Output length of every request, or LOW:HIGH to draw each evenly "
                     "(default: the profile's reference)"),
    ] = None,
    seed: Annotated[int, typer.Option(min=0, help="Random seed")] = 0,
    plot: Annotated[
        Path | None, typer.Option(help="Also draw tok/s per shape against the load (.png)")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object")] = False,
    policy_out: Annotated[
        Path | None,
        typer.Option(help="With --phase: write that phase's best shape per load as a policy "
                     "file (its tree tiers need a shape server that captured the trees, and "
                     "an off tier beside them one started with plain among its shapes)"),
    ] = None,
    closed_loop: Annotated[
        float,
        typer.Option(help="Also step the clients through the loads, up and back down, this "
                     "many simulated seconds each: every static shape and the table on one "
                     "trace (0: not run)"),
    ] = 0.0,
    daemon: Annotated[
        bool,
        typer.Option("--daemon", help="With --closed-loop: also run the daemon on the shape "
                     "server over that trace, from an empty store (it learns each shape's "
                     "tok/s per load as the load moves)"),
    ] = False,
) -> None:
    """Closed-loop tok/s per static draft shape (SGLang started at STEPSxTOPKxDRAFT, chains
    and trees, and the plain server) and load, and the best shape per load: the table a
    shape-aware policy would use. With two or more shapes, one of them drafting, that table
    also runs on a shape server that captured them (the plugin's `specctl serve --shapes`;
    plain is its off), at each load and with --closed-loop over a trace of the loads. The
    profile needs shapes: `specctl sim fit --shapes` fits them from a bench of shapes.

    \b
    Examples:
      specctl sim fit --shapes run30/shapes --base mine.yaml --out shapes.yaml
      specctl sim shapes --profile shapes.yaml --output-tokens 128:384
      specctl sim shapes --profile shapes.yaml --phase b --plot shapes.png
      specctl sim shapes --profile shapes.yaml --shapes 3x1x4,3x4x16,plain --json
      specctl sim shapes --profile shapes.yaml --phase b --policy-out b.yaml
      specctl sim shapes --profile shapes.yaml --phase b --closed-loop 60
      specctl sim shapes --profile s.yaml --phase b --closed-loop 60 --daemon
    """
    from sims.shape_server import ShapeQuestionError, known_shapes
    from sims.shape_sweep import ShapeSweepSpec, render_tables, run_shape_sweep
    from sims.shape_sweep import plot as draw

    prof = _profile(profile)
    try:
        known = known_shapes(prof)
    except ShapeQuestionError as err:
        raise typer.BadParameter(str(err), param_hint="--profile") from None
    names = known if shape_names is None else _shape_list(shape_names, known)
    loads = list(parse_int_list(streams, "--streams", 1))
    phases = prof.shape_phases or [prof.acceptance.default_phase]
    if phase is not None and phase not in phases:
        raise typer.BadParameter(
            f"unknown phase {phase!r}; the profile's shapes were measured on {phases}",
            param_hint="--phase",
        )
    finite_positive(duration, "--duration", "simulated seconds per point")
    if not (math.isfinite(closed_loop) and closed_loop >= 0):
        raise typer.BadParameter(f"must be >= 0 simulated seconds per load, got {closed_loop:g}",
                                 param_hint="--closed-loop")  # fmt: skip
    if not 0 <= warmup < duration:
        raise typer.BadParameter(f"must be >= 0 and shorter than --duration ({duration:g} s), "
                                 f"got {warmup:g}", param_hint="--warmup")  # fmt: skip
    if daemon and closed_loop <= 0:
        raise typer.BadParameter("the daemon runs over the closed loop: give --closed-loop "
                                 "SECONDS too", param_hint="--daemon")  # fmt: skip
    if plot is not None and (problem := plot_path_problem(plot)) is not None:
        raise fail(problem)
    if policy_out is not None:
        if phase is None:
            raise typer.BadParameter("name the phase whose table to write (one table per phase)",
                                     param_hint="--phase")  # fmt: skip
        if (problem := output_file_problem(policy_out, "--policy-out")) is not None:
            raise fail(problem)
    prompt = prompt_tokens or prof.reference_workload.prompt_tokens
    out = (parse_length(output_tokens, "--output-tokens") if output_tokens is not None
           else prof.reference_workload.output_tokens)  # fmt: skip
    _fits(prof, prompt, out if isinstance(out, int) else out[1])
    spec = ShapeSweepSpec(shapes=names, phases=[phase] if phase else phases, streams=loads,
                          duration_s=duration, warmup_s=warmup, prompt_tokens=prompt,
                          output_tokens=out, seed=seed,
                          closed_loop_step_s=closed_loop)  # fmt: skip
    if as_json:
        result = run_shape_sweep(prof, spec)
    else:
        from controller.cli.progress import with_progress
        from controller.cli.tables import print_table

        console, result = with_progress(f"running {prof.name}'s shapes", spec.points(),
                                        lambda tick: run_shape_sweep(prof, spec, on_point=tick))
        for table in render_tables(result):
            print_table(console, table)
    learned = {}
    if daemon and spec.switches:
        from controller.cli.shape_daemon_report import daemon_table, run_daemon_loops

        learned = run_daemon_loops(prof, spec, quiet=as_json)
        if not as_json:
            for ph, run in learned.items():
                print_table(console, daemon_table(result, ph, run))
    if plot is not None:
        draw(result, plot)
    if policy_out is not None and phase is not None:
        _write_policy(result, phase, policy_out)
    if as_json:
        doc = result.to_json()
        if learned:
            from controller.cli.shape_daemon_report import daemon_json

            doc["closed_loop_daemon"] = {ph: daemon_json(result, ph, run)
                                         for ph, run in learned.items()}  # fmt: skip
        typer.echo(json.dumps(doc))
    elif plot is not None:
        typer.echo(f"wrote {plot}")
