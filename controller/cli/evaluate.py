"""`specctl sim evaluate`: the daemon against the simulator, against the oracle and statics."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from controller.cli.sim import _profile, scenario_option, sim_app

if TYPE_CHECKING:
    from rich.console import Console

TRACE_KEYS = ("score_trace", "recent_score_trace", "tok_trace", "push_log", "lag_score_trace")


@sim_app.command("evaluate")
def evaluate_command(
    profile: Annotated[str, typer.Option(help="Built-in profile name or profile YAML path")] = (
        "kimi-k25-8x-rtxpro6000-pcie"
    ),
    scenario: Annotated[str, typer.Option(help="Built-in scenario name or YAML path")] = "ramp",
    seed: Annotated[int, typer.Option(min=0, help="Seed of the simulator and the learner")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object")] = False,
    traces: Annotated[
        bool, typer.Option(help="With --json: include per-tick traces and the push log")
    ] = False,
    http_speedup: Annotated[
        float | None,
        typer.Option(
            "--http",
            help="Run the daemon over loopback HTTP against a served simulator (what `specctl "
            "sim serve` runs) whose clock goes this many times wall time; default in-process",
        ),
    ] = None,
    seed_bench: Annotated[
        Path | None,
        typer.Option(
            help="Start the daemon's store from this `specctl bench` of the server (its --out "
            "folder or bench.json), as targets[].seed_bench does; default an empty store",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run the daemon on an accelerated simulated clock; compare with the oracle and statics.

    \b
    Examples:
      specctl sim evaluate
      specctl sim evaluate --profile h200-moe-eagle3 --scenario bursty --seed 3
      specctl sim evaluate --scenario drift --json | jq .ratio_to_oracle
      specctl sim evaluate --http 50    # the daemon over loopback HTTP
      specctl sim evaluate --profile mine.yaml --seed-bench bench-mine  # seeded
    """
    if http_speedup is not None and not (http_speedup > 0 and math.isfinite(http_speedup)):
        raise typer.BadParameter(
            "the served simulator's clock must run > 0 times wall time (e.g. --http 50), "
            f"got {http_speedup:g}",
            param_hint="--http",
        )
    # Named in a usage error before the run (evaluate() would only say what is wrong).
    _profile(profile)
    scenario_option(scenario)
    from rich.console import Console

    from controller.daemon.bench_seed import BenchSeedError, read_bench
    from controller.evaluation.evaluate import evaluate
    from sims.profile import ProfileError
    from sims.workload import ScenarioError

    if seed_bench is not None:
        try:
            read_bench(seed_bench)  # named before the run, not after its baselines
        except BenchSeedError as err:
            # the message names the config key; here it is the option
            text = str(err).replace("seed_bench", "--seed-bench", 1)
            typer.secho(f"error: {text}", err=True, fg=typer.colors.RED)
            raise typer.Exit(2) from None

    console = Console(stderr=True)
    try:
        with console.status("evaluating", spinner="dots") as status:
            report = evaluate(
                profile,
                scenario,
                seed,
                http_speedup=http_speedup,
                on_progress=lambda m: status.update(f"running {m}"),
                seed_bench=seed_bench,
            )
    except (ProfileError, ScenarioError) as err:
        typer.secho(f"error: {err}", err=True, fg=typer.colors.RED)
        raise typer.Exit(2) from None
    if as_json:
        out = report if traces else {k: v for k, v in report.items() if k not in TRACE_KEYS}
        typer.echo(json.dumps(out))
        return
    print_report(report, Console())


def print_report(r: dict[str, Any], console: Console) -> None:
    from rich.table import Table

    from controller.cli.tables import print_table

    console.print(
        f"[bold]{r['profile']}[/bold] x [bold]{r['scenario']}[/bold] "
        f"({r['duration_s']:.0f} simulated s, seed {r['seed']}, {r['wall_s']:.1f} s wall)"
    )
    t = Table(show_header=True, header_style="bold")
    t.add_column("policy")
    t.add_column("tok/s", justify="right")
    t.add_column("vs oracle", justify="right")
    oracle = r["oracle_tok_per_s"]
    t.add_row("oracle", f"{oracle:.1f}", "1.000")
    t.add_row(
        "[bold]specctl daemon[/bold]",
        f"{r['achieved_tok_per_s']:.1f}",
        f"{r['ratio_to_oracle']:.3f}",
    )
    for name, v in sorted(r["static"].items(), key=lambda kv: -kv[1]):
        t.add_row(name, f"{v:.1f}", f"{v / oracle:.3f}")
    print_table(console, t)
    ttg = r["time_to_good_table_s"]
    console.print(
        f"exploration share {r['exploration_share']:.1%}; "
        f"time to first good table {'never' if ttg is None else f'{ttg:.0f} s'}; "
        f"{r['pushes']} pushes, {r['rollbacks']} rollbacks"
    )
    lag = r["table_lag"]
    console.print(
        f"not within 2% of the oracle on the load of the moment: cold start "
        f"{lag['cold_start_s']:.0f} s, longest after a change {lag['worst_change_lag_s']:.0f} s, "
        f"{lag['bad_time_share']:.1%} of the run"
    )
    if "drift_at_s" in r:
        rec = r.get("drift_recovery_s")
        console.print(
            f"drift at {r['drift_at_s']:.0f} s; recovery "
            f"{'not within the run' if rec is None else f'{rec:.0f} s'}"
        )
    if "served_clock_lead_s" in r:
        lead = r["served_clock_lead_s"]
        # A lead past one scrape interval: the daemon saw longer intervals than it scheduled.
        style = "yellow" if lead > r["scrape_interval_s"] else ""
        console.print(
            f"served clock at {r['served_clock_speedup']:g}x wall time, at most {lead:.0f} "
            f"simulated s ahead of the daemon's ticks",
            style=style,
        )
    console.print(f"table at 10 min: {r['table_at_10min_text']}")
    console.print(f"final table:     {r['final_table_text']}")
    for e in r["thresholds_vs_oracle_at_10min"]:
        err = "-" if e["rel_error"] is None else f"{e['rel_error']:.0%}"
        console.print(
            f"  crossover d{e['from']}->d{e['to']}: oracle {e['oracle']}, "
            f"table {e['table']}, error {err}"
        )
