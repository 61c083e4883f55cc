"""`specctl sim ...`: run the simulator (profiles, sweep, serve)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from controller.cli import app
from controller.cli.args import parse_int_list, parse_length
from sglang_hooks.contract import MAX_DEPTH

if TYPE_CHECKING:
    from sglang_hooks.draft_shape import DraftShape
    from sims.profile import Profile
    from sims.workload import Scenario

sim_app = typer.Typer(help="Simulated SGLang server: sweeps, a served stand-in, evaluations.")
app.add_typer(sim_app, name="sim")


def finite_positive(value: float, option: str, what: str) -> None:
    """A usage error naming `option` unless `value` is a finite number > 0."""
    if not (value > 0 and math.isfinite(value)):
        raise typer.BadParameter(f"must be a finite number > 0 ({what}), got {value:g}",
                                 param_hint=option)  # fmt: skip


def _profile(name_or_path: str) -> Profile:
    from sims.profile import ProfileError, load_profile

    try:
        return load_profile(name_or_path)
    except ProfileError as err:
        raise typer.BadParameter(str(err), param_hint="--profile") from None


def scenario_option(name_or_path: str, option: str = "--scenario") -> Scenario:
    """A built-in scenario or a scenario YAML; a usage error naming `option` otherwise."""
    from sims.workload import ScenarioError, load_scenario

    try:
        return load_scenario(name_or_path)
    except ScenarioError as err:
        raise typer.BadParameter(
            f"{err}; pass a built-in scenario (specctl sim scenarios) or a scenario YAML",
            param_hint=option,
        ) from None


@sim_app.command("profiles")
def list_profiles() -> None:
    """List the built-in profiles.

    \b
    Examples:
      specctl sim profiles
      specctl sim sweep --profile "$(specctl sim profiles | head -1)"
    """
    from sims.profile import builtin_profiles

    for name in builtin_profiles():
        typer.echo(name)


@sim_app.command("scenarios")
def list_scenarios() -> None:
    """List the built-in scenarios with their duration.

    \b
    Examples:
      specctl sim scenarios
      specctl sim evaluate --scenario bursty
    """
    from sims.workload import builtin_scenarios, load_scenario

    for name in builtin_scenarios():
        sc = load_scenario(name)
        typer.echo(
            f"{name}\t{sc.duration_s / 60:.0f} min\t{sc.description.strip().splitlines()[0]}"
        )


def _fits(prof: Profile, prompt_tokens: int, output_tokens: int) -> None:
    """A request the profile's server would refuse (longer than its context or its KV pool)
    would be refused at every turn and the sweep would never end: refuse it here."""
    sched = prof.scheduler
    limit = min(sched.context_length, sched.max_total_tokens)
    if prompt_tokens + output_tokens > limit:
        which = "context length" if limit == sched.context_length else "KV pool"
        raise typer.BadParameter(
            f"{prompt_tokens} prompt + {output_tokens} output tokens exceed the profile's "
            f"{which} ({limit:,} tokens); ask for less",
            param_hint="--prompt-tokens",
        )


@sim_app.command("sweep")
def sweep(
    profile: Annotated[str, typer.Option(help="Built-in profile name or path to a YAML file")],
    concurrency: Annotated[
        str, typer.Option(help="Closed-loop client counts, comma-separated")
    ] = "1,2,4,8,16,32,64,128,256",
    depths: Annotated[
        str | None, typer.Option(help="Depths to sweep (default: the profile's captured depths)")
    ] = None,
    duration: Annotated[float, typer.Option(help="Simulated seconds per point")] = 300.0,
    warmup: Annotated[float, typer.Option(help="Simulated seconds not scored per point")] = 30.0,
    prompt_tokens: Annotated[
        int | None,
        typer.Option(
            min=1, help="Prompt length of every request (default: the profile's reference)"
        ),
    ] = None,
    output_tokens: Annotated[
        str | None,
        typer.Option(
            help="Output length of every request, or LOW:HIGH to draw each evenly from that "
            "range (requests then end one by one, as in a bench with spread outputs; "
            "default: the profile's reference)"
        ),
    ] = None,
    phase: Annotated[
        str | None, typer.Option(help="Acceptance phase (default: the profile's default)")
    ] = None,
    seed: Annotated[int, typer.Option(min=0, help="Random seed")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object")] = False,
) -> None:
    """Closed-loop throughput, step time and acceptance per (depth, concurrency), the no-spec
    baseline and the oracle's best depth per concurrency.

    \b
    Examples:
      specctl sim sweep --profile h200-llama8b-eagle3 --concurrency 1,16,256
      specctl sim sweep --profile h200-moe-eagle3 --depths 0,1,3 --duration 120
      specctl sim sweep --profile h200-moe-eagle3 --output-tokens 64:192
      specctl sim sweep --profile h200-moe-eagle3 --json | jq .warnings
    """
    from sims.sweep import SweepSpec, render_table, run_sweep

    prof = _profile(profile)
    conc = list(parse_int_list(concurrency, "--concurrency", 1))
    depth_list = (
        list(parse_int_list(depths, "--depths", 0, MAX_DEPTH))
        if depths
        else list(prof.captured_depths)
    )
    bad = [d for d in depth_list if d not in prof.captured_depths]
    if bad:
        raise typer.BadParameter(
            f"depth {bad[0]} is not captured by profile {prof.name} "
            f"(captured: {prof.captured_depths})",
            param_hint="--depths",
        )
    finite_positive(duration, "--duration", "simulated seconds per point")
    if not 0 <= warmup < duration:
        raise typer.BadParameter(
            f"must be >= 0 and shorter than --duration ({duration:g} s), got {warmup:g}: "
            "the warm-up is the start-up ramp, the scored window must be longer",
            param_hint="--warmup",
        )
    if phase is not None and phase not in prof.acceptance.phases:
        raise typer.BadParameter(
            f"unknown phase {phase!r}; the profile defines {sorted(prof.acceptance.phases)}",
            param_hint="--phase",
        )
    prompt = prompt_tokens or prof.reference_workload.prompt_tokens
    out = (
        parse_length(output_tokens, "--output-tokens")
        if output_tokens is not None
        else prof.reference_workload.output_tokens
    )
    _fits(prof, prompt, out if isinstance(out, int) else out[1])
    spec = SweepSpec(
        concurrency=conc,
        depths=depth_list,
        duration_s=duration,
        warmup_s=warmup,
        prompt_tokens=prompt,
        output_tokens=out,
        phase=phase,
        seed=seed,
    )
    if as_json:
        result = run_sweep(prof, spec)
        typer.echo(json.dumps(result.to_json(), indent=None))
        return
    from controller.cli.progress import with_progress
    from controller.cli.tables import print_table

    console, result = with_progress(f"sweeping {prof.name}", spec.points(),
                                    lambda tick: run_sweep(prof, spec, on_point=tick))
    for table in render_table(result):
        print_table(console, table)
    for warning in result.warnings():
        console.print(f"[yellow]warning:[/yellow] {warning}", soft_wrap=True)


def _shape_server_list(prof: Profile, text: str, speculative: bool) -> list[str]:
    """The shapes `--shapes` names, checked as `specctl serve --shapes` checks them: shapes of
    the profile, plain (off) among them or not, one drafting shape dominating the others."""
    from sglang_hooks.draft_shape import PLAIN, ShapeError, dominating, label, parse_shapes
    from sims.shape_server import ShapeQuestionError, known_shapes, require_plain

    if not speculative:
        raise typer.BadParameter("a shape server drafts; drop --no-speculative",
                                 param_hint="--shapes")  # fmt: skip
    try:
        parsed = parse_shapes(text)
        known = known_shapes(prof)
        if None in parsed:
            require_plain(prof)  # off is costed by the profile's plain shape
    except (ShapeError, ShapeQuestionError) as err:
        raise typer.BadParameter(str(err), param_hint="--shapes") from None
    names = [label(s) for s in parsed]
    for name in names:
        if name not in known:
            raise typer.BadParameter(f"shape {name} is not in the profile (it has "
                                     f"{', '.join(known)})", param_hint="--shapes")  # fmt: skip
    try:
        top = dominating(parsed)  # SGLang starts at it: every other shape must fit what it sizes
    except ShapeError as err:
        raise typer.BadParameter(str(err), param_hint="--shapes") from None
    if top is None:
        raise typer.BadParameter(f"a shape server drafts: list a drafting shape beside {PLAIN}",
                                 param_hint="--shapes")  # fmt: skip
    return names


def _captured(prof: Profile, shapes: list[str] | None,
              speculative: bool) -> tuple[list[int], list[DraftShape]]:  # fmt: skip
    """(depths, trees) a table may name on the server these options start (on a shape
    server, plain captured as depth 0)."""
    from sglang_hooks.draft_shape import depths_and_trees, parse_shape

    if not speculative:
        return [], []
    if shapes is None:
        return list(prof.captured_depths), []
    return depths_and_trees(list(map(parse_shape, shapes)))


@sim_app.command("serve")
def serve(
    profile: Annotated[str, typer.Option(help="Built-in profile name or path to a YAML file")],
    host: Annotated[str, typer.Option(help="Address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port (0: pick a free one)")] = 30000,
    speedup: Annotated[float, typer.Option(help="Simulated seconds per wall second")] = 1.0,
    admin_key: Annotated[
        str | None, typer.Option(help="Admin API key for /set_internal_state")
    ] = None,
    api_key: Annotated[str | None, typer.Option(help="API key for the other endpoints")] = None,
    seed: Annotated[int, typer.Option(min=0, help="Random seed")] = 0,
    concurrency: Annotated[
        float, typer.Option(min=0.0, help="Background closed-loop clients (synthetic load)")
    ] = 0.0,
    scenario: Annotated[
        str | None,
        typer.Option(help="Drive the background load from a scenario instead of --concurrency"),
    ] = None,
    speculative: Annotated[
        bool, typer.Option("--speculative/--no-speculative", help="EAGLE-3 on, or a plain server")
    ] = True,
    device_timer: Annotated[
        bool,
        typer.Option(
            help="Export GPU seconds per forward kind (sglang:forward_execution_seconds_total), "
            "as SGLang does with SGLANG_ENABLE_METRICS_DEVICE_TIMER=1"
        ),
    ] = False,
    policy_file: Annotated[
        Path | None,
        typer.Option(
            envvar="SPECCTL_POLICY_FILE",
            help="Frozen start-up table (a `specctl freeze` file), as the plugin reads "
            "SPECCTL_POLICY_FILE: the server starts with it (source startup)",
        ),
    ] = None,
    shapes: Annotated[
        str | None,
        typer.Option(help="A shape server, as `specctl serve --shapes` starts one: the "
                     "profile's shapes to capture, STEPSxTOPKxDRAFT comma-separated, and plain "
                     "for off (depth 0); it starts at the drafting shape that dominates the "
                     "others and switches as a table says (the profile needs shapes: specctl "
                     "sim fit --shapes)"),
    ] = None,
) -> None:
    """Serve a simulated SGLang server (SGLang's HTTP API + the specctl plugin's contract).

    \b
    Examples:
      specctl sim serve --profile h200-moe-eagle3 --port 30000 --admin-key k
      specctl sim serve --profile h200-moe-eagle3 --port 30001 --no-speculative
      specctl sim serve --profile h200-llama8b-eagle3 --scenario ramp --speedup 10
      specctl sim serve --profile h200-moe-eagle3 --policy-file policy.yaml
      specctl sim serve --profile shapes.yaml --shapes 3x4x16,3x1x4,plain
    """
    from sims.http import ServedSimulation
    from sims.server import SimulatedServer
    from sims.workload import Workload

    prof = _profile(profile)
    finite_positive(speedup, "--speedup", "simulated seconds per wall second; 1: real time")
    if not math.isfinite(concurrency):
        raise typer.BadParameter(f"must be a finite number, got {concurrency:g}",
                                 param_hint="--concurrency")  # fmt: skip
    if scenario is not None:
        workload = scenario_option(scenario).workload
    else:
        workload = Workload.closed(concurrency)
    shape_list = None if shapes is None else _shape_server_list(prof, shapes, speculative)
    captured, trees = _captured(prof, shape_list, speculative)
    table = None
    if policy_file is not None:
        from sglang_hooks.contract import PolicyError
        from sglang_hooks.policy_file import load_policy_file

        try:
            # Checked against what the server captured, as the plugin checks it at start-up.
            table = load_policy_file(policy_file, captured, trees)
        except PolicyError as err:
            raise typer.BadParameter(str(err), param_hint="--policy-file") from None
    server = SimulatedServer(
        prof,
        workload,
        seed=seed,
        admin_key=admin_key,
        api_key=api_key,
        speculative=speculative,
        device_timer=device_timer,
        table=table,
        shapes=shape_list,
    )
    try:
        served = ServedSimulation(server, host=host, port=port, speedup=speedup, log_level="info")
    except OSError as err:
        typer.echo(
            f"error: cannot listen on {host}:{port} ({err.strerror or err}); pick another "
            "--port (0 picks a free one) or stop what is using it",
            err=True,
        )
        raise typer.Exit(2) from None
    startup = "" if table is None else f", start-up table {table.label()} {table.describe()}"
    mode = "EAGLE-3" if speculative else "no speculation"
    if server.startup_shape is not None:
        mode = f"EAGLE-3 at {server.startup_shape}, shapes {', '.join(shape_list or [])}"
    typer.echo(
        f"simulated {prof.name} ({mode}) on "
        f"{served.base_url}, clock x{speedup:g}{startup}; Ctrl-C to stop"
    )
    served.serve_forever()
