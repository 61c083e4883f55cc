"""`specctl sim fit`: a simulator profile fitted to `specctl bench` results of one server."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from controller.cli.args import write_problem
from controller.cli.sim import sim_app

if TYPE_CHECKING:
    from sims.fit.bench_file import BenchRun
    from sims.fit.report import Report
    from sims.profile import Profile

DEFAULT_BASE = "h200-llama8b-eagle3"

# Options `fit` and `replay` share.
Jobs = Annotated[
    int | None,
    typer.Option(
        min=1,
        help="Processes replaying levels in parallel (default: 1 under 24 levels, else the "
        "CPUs, up to 8)",
        show_default=False,
    ),
]
OffPath = Annotated[
    str | None,
    typer.Option(
        help="What the server's depth 0 ran: specctl (the plugin's off path, no draft extend) "
        "or sglang (SGLang's own, with the draft extend; SPECCTL_OFF_PATH=sglang); default: "
        "what the bench recorded from /server_info, else the profile's assumption",
        show_default=False,
    ),
]
PoolRepeats = Annotated[
    bool,
    typer.Option(
        "--pool-repeats",
        help="Take a level that several of the benches measured alike (same series, streams "
        "and request shape) as their mean, not once per bench",
    ),
]
err_console = Console(stderr=True, soft_wrap=True)


def _fail(message: str) -> typer.Exit:
    err_console.print(f"[red]error:[/red] {message}", highlight=False)
    return typer.Exit(2)


def _inputs(benches: list[Path], profile: str, option: str, off_path: str | None
            ) -> tuple[Profile, list[BenchRun]]:
    """The profile `option` names and the benches, or the error naming what is wrong."""
    from sims.fit.bench_file import BenchFileError, load_bench
    from sims.fit.framing import OFF_PATHS
    from sims.profile import ProfileError, load_profile

    if off_path is not None and off_path not in OFF_PATHS:
        raise _fail(f"--off-path: {off_path!r} is not one of {', '.join(OFF_PATHS)}")
    try:
        loaded = load_profile(profile)
    except ProfileError as err:
        raise _fail(f"{option}: {err}") from None
    try:
        return loaded, [load_bench(path) for path in benches]
    except BenchFileError as err:
        raise _fail(str(err)) from None


def _jobs(jobs: int | None, levels: int) -> int:
    """--jobs, else one process under 24 levels and the CPUs (at most 8) from there."""
    return jobs or (1 if levels < 24 else min(8, os.cpu_count() or 1))


def _out_problem(out: Path) -> str | None:
    if out.is_dir():
        return f"--out {out}: is a folder; give a file name such as {out / 'profile.yaml'}"
    if out.suffix not in (".yaml", ".yml"):
        return f"--out {out}: give a .yaml file name (profiles are YAML)"
    folder = out.parent if str(out.parent) else Path(".")
    if not folder.is_dir():
        return f"--out {out}: folder {folder} does not exist; create it first"
    return write_problem(folder, "--out", out)


@sim_app.command("fit")
def fit(
    out: Annotated[Path, typer.Option(help="Where to write the fitted profile (.yaml)")],
    benches: Annotated[
        list[Path] | None,
        typer.Argument(
            help="bench.json files from `specctl bench` against one server (several: e.g. two "
            "prompt lengths, which pins the context and prefill terms)",
            show_default=False,
            metavar="BENCH.json",
        ),
    ] = None,
    shapes: Annotated[
        Path | None,
        typer.Option(
            help="Instead of bench.json files: a bench of draft shapes (the GPU harness's "
            "shapes folder, one folder per STEPSxTOPKxDRAFT shape and plain), fitted onto "
            "--base: each shape's cost terms and accept length per prompt family",
            show_default=False,
            metavar="SHAPES_DIR",
        ),
    ] = None,
    base: Annotated[
        str,
        typer.Option(help="Profile whose values the fields a bench cannot see keep"),
    ] = DEFAULT_BASE,
    name: Annotated[
        str | None, typer.Option(help="Name of the fitted profile (default: --out's file name)")
    ] = None,
    jobs: Jobs = None,
    off_path: OffPath = None,
    pool_repeats: PoolRepeats = False,
    keep: Annotated[
        list[str] | None,
        typer.Option(
            metavar="FIELD",
            help="Hold this profile field at --base's value instead of fitting it (repeatable; "
            "e.g. draft.prefill_ms)",
            show_default=False,
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object")] = False,
) -> None:
    """Fit a simulator profile to your own server from a `specctl bench` run.

    Reads the levels of BENCH.json (tok/s, TTFT, TPOT, the server's own step and latency
    figures per depth and concurrency, the plain server's too when the bench had
    --no-spec-url) and the servers' limits it recorded, fits the profile's target, draft,
    prefill, host and client costs (least squares on the server's own figures, then a search
    over replays of the bench), names the levels it cannot reproduce, and prints measured
    against simulated tok/s and TPOT.

    With --shapes SHAPES_DIR instead: fits each static draft shape a bench of shapes measured
    (its terms beyond the cost model at the shape, its accept length per prompt family) onto
    --base, leaving out the levels the bench flagged, and prints measured against simulated
    tok/s per shape, family and load (`specctl sim shapes` then asks the what-ifs).

    \b
    Examples:
      specctl bench --url http://gpu:30000 --no-spec-url http://gpu:30001 --out b
      specctl sim fit b/bench.json --out h200-mine.yaml
      specctl sim fit b/bench.json b2/bench.json --pool-repeats --out mine.yaml
      specctl sim sweep --profile h200-mine.yaml --concurrency 1,8,64
      specctl sim fit --shapes run/shapes --base mine.yaml --out shaped.yaml
    """
    from sims.fit.fitting import FitError, fit_profile
    from sims.fit.pool import Replayer
    from sims.fit.profile_file import with_provenance, write_profile
    from sims.fit.report import Report, render, replay_rows

    problem = _out_problem(out)
    if problem is not None:
        raise _fail(problem)
    if shapes is not None:
        _shapes_only(benches, jobs, off_path, pool_repeats, keep)
        from controller.cli.sim_fit_shapes import fit_shapes_command

        fit_shapes_command(shapes, out, base, name or out.stem, as_json)
        return
    if not benches:
        raise _fail("give the bench.json files to fit (specctl bench --out DIR writes "
                    "DIR/bench.json), or --shapes SHAPES_DIR for a bench of draft shapes")
    base_profile, runs = _inputs(benches, base, "--base", off_path)
    console = Console(stderr=as_json)
    profile_name = name or out.stem
    limits = {run.path: run.request_limit for run in runs}
    count = sum(len(run.levels) for run in runs)
    with Replayer(_jobs(jobs, count)) as replayer:
        try:
            with console.status("fitting", spinner="dots") as status:
                result = fit_profile(
                    runs, base_profile, profile_name, replayer=replayer,
                    progress=lambda msg: status.update(msg), off_path=off_path,
                    pool=pool_repeats, keep=keep or (),
                )  # fmt: skip
        except FitError as err:
            raise _fail(str(err)) from None
        result.profile = with_provenance(result, base_profile, runs)
        try:
            write_profile(result.profile, out)
        except OSError as err:
            raise _fail(f"--out {out}: cannot write it ({err.strerror or err})") from None
        rows = replay_rows(
            result.profile, result.levels, limits, replayer, [o.level for o in result.outliers]
        )
    report = Report(result, base_profile, rows, str(out))
    if as_json:
        typer.echo(json.dumps(report.to_json()))
        return
    console.print(fields_table(report))
    for line in kept_lines(report):
        console.print(line, highlight=False)
    for line in render(report):
        console.print(line)
    clocks = {run.spec.speedup for run in runs} | {r.no_spec.speedup for r in runs if r.no_spec}
    if clocks != {1.0}:
        console.print(
            f"times on the server's own clock (the bench ran at --speedup "
            f"{', '.join(f'{c:g}' for c in sorted(clocks))})"
        )
    for note in result.notes:
        console.print(f"[yellow]note[/yellow]: {note}")
    console.print(f"wrote {out} ({result.evaluations} evaluations, {result.seconds:.1f} s)")


def _shapes_only(benches: list[Path] | None, jobs: int | None, off_path: str | None,
                 pool_repeats: bool, keep: list[str] | None) -> None:
    """--shapes fits shapes alone: the options of a fit of bench.json files are refused."""
    if benches:
        raise _fail("--shapes: give bench.json files or --shapes, not both: fit the bench "
                    "first (sim fit BENCH.json --out P.yaml), then the shapes onto it "
                    "(sim fit --shapes DIR --base P.yaml --out P2.yaml)")
    given = [opt for opt, on in (("--jobs", jobs is not None), ("--off-path", off_path),
                                 ("--pool-repeats", pool_repeats), ("--keep", keep)) if on]
    if given:
        raise _fail(f"{given[0]}: applies to a fit of bench.json files, not to --shapes")


def fields_table(report: Report) -> Table:
    from sims.fit.fitting import describe_fields

    table = Table(title="fitted profile fields", box=None)
    for col in ("field", "value", "base", "fitted"):
        table.add_column(col, justify="left" if col == "field" else "right", no_wrap=True)
    for row in describe_fields(report.result, report.base):
        table.add_row(
            row["field"],
            f"{row['value']:.4g}",
            f"{row['base']:.4g}",
            "yes" if row["fitted"] else "kept",
        )
    prof = report.result.profile
    lengths = ", ".join(f"d{d} {v:.2f}" for d, v in report.result.accept_lengths.items())
    table.caption = (
        f"running cap {prof.scheduler.max_running_requests_spec} (spec) / "
        f"{prof.scheduler.max_running_requests_nospec} (plain); accept length {lengths or '-'}"
    )
    return table


def kept_lines(report: Report) -> list[str]:
    return [f"kept {key} (the base's): {why}" for key, why in report.result.kept.items()]


@sim_app.command("replay")
def replay(
    benches: Annotated[
        list[Path],
        typer.Argument(
            help="bench.json files from `specctl bench` against one server",
            show_default=False,
            metavar="BENCH.json",
        ),
    ],
    profile: Annotated[
        str, typer.Option(help="Built-in profile name or profile YAML to replay the benches on")
    ],
    jobs: Jobs = None,
    off_path: OffPath = None,
    pool_repeats: PoolRepeats = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object")] = False,
) -> None:
    """Replay your benches on a profile as it is, without fitting: how far it is from them.

    The profile takes what the benches state outright (the servers' limits, the measured
    acceptance, the request shape, what depth 0 ran), as a fit frames its base; its costs stay
    as written. Each level is replayed with the bench's protocol and set against the measured
    tok/s and TPOT, as `specctl sim fit` reports its fit. Writes nothing.

    \b
    Examples:
      specctl sim replay b/bench.json --profile h200-sglang-llama8b-seeded
      specctl sim replay b*/bench.json --profile mine.yaml --pool-repeats
    """
    from sims.fit.fitting import FitError, framed_only
    from sims.fit.pool import Replayer
    from sims.fit.report import Report, render, replay_rows

    given, runs = _inputs(benches, profile, "--profile", off_path)
    try:
        result = framed_only(runs, given, off_path=off_path, pool=pool_repeats)
    except FitError as err:
        raise _fail(str(err)) from None
    limits = {run.path: run.request_limit for run in runs}
    count = len(result.levels)
    console = Console(stderr=as_json)
    with Replayer(_jobs(jobs, count)) as replayer, \
            console.status(f"replaying {count} levels", spinner="dots"):
        rows = replay_rows(result.profile, result.levels, limits, replayer)
    report = Report(result, given, rows, "", fitted=False)
    if as_json:
        typer.echo(json.dumps(report.to_json()))
        return
    for line in render(report):
        console.print(line)
    for note in result.notes:
        console.print(f"[yellow]note[/yellow]: {note}")
