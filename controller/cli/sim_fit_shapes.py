"""`specctl sim fit --shapes SHAPES_DIR`: static draft shapes fitted onto a base profile from a
bench of shapes (the GPU harness's `shapes` step); what `sim fit` runs when given --shapes."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console

from controller.cli.args import fail


def fit_shapes_command(folder: Path, out: Path, base: str, name: str, as_json: bool) -> None:
    """Fit, write `out`, print the shapes' terms, every level replayed and the checks."""
    from controller.bench.level_flags import level_flags
    from sims.fit.bench_file import BenchFileError
    from sims.fit.framing import FitError
    from sims.fit.profile_file import with_shape_provenance, write_profile
    from sims.fit.shape_check import render, replay_rows, to_json
    from sims.fit.shape_fit import fit_shapes
    from sims.fit.shape_folder import load_shapes
    from sims.profile import ProfileError, load_profile

    try:
        base_profile = load_profile(base)
    except ProfileError as err:
        raise fail(f"--base: {err}") from None
    try:
        bench = load_shapes(folder, level_flags)
    except BenchFileError as err:
        raise fail(f"--shapes: {err}") from None
    console = Console(stderr=as_json)
    try:
        with console.status("fitting the shapes", spinner="dots") as status:
            fit = fit_shapes(bench, base_profile, name, progress=lambda m: status.update(m))
    except FitError as err:
        raise fail(f"--shapes: {err}") from None
    fit.profile = with_shape_provenance(fit, bench, base_profile)
    try:
        write_profile(fit.profile, out)
    except OSError as err:
        raise fail(f"--out {out}: cannot write it ({err.strerror or err})") from None
    with console.status(f"replaying {len(bench.levels)} levels", spinner="dots"):
        rows = replay_rows(fit.profile, bench)
    if as_json:
        typer.echo(json.dumps({**to_json(rows, fit), "profile": str(out)}))
        return
    for line in render(rows, fit):
        console.print(line, highlight=False, soft_wrap=True)
    for note in fit.notes:
        console.print(f"[yellow]note[/yellow]: {note}")
    console.print(f"wrote {out} ({fit.rounds} rounds, {fit.seconds:.1f} s)")
