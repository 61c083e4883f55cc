"""`specctl bench`: a concurrency sweep per forced depth on a live server, without restarts."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, Task, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from controller.bench.loadgen import LiveCounters, LoadError, StopRule
from controller.bench.prompts import DatasetError, load_dataset, synthetic_prompts
from controller.bench.report import (
    best_depths,
    crossovers,
    plot,
    recommend_table,
    write_csv,
    write_json,
)
from controller.bench.server_client import ADMIN_KEY_ENV, ServerClient, ServerError
from controller.bench.sweep import LevelObserver, LevelResult, SweepOutcome, SweepPlan, run_sweep
from controller.cli import app
from controller.cli.args import parse_int_list
from controller.daemon.config import url_problem
from sglang_hooks.contract import MAX_DEPTH

DEFAULT_CONCURRENCY = "1,2,4,8,16,32,64,128,256"
DEFAULT_DURATION_S = 20.0
FOREIGN_NOTE = "batch above concurrency: other traffic on the server"

# soft_wrap: an error stays one line even when stderr is a file or a pipe (80 columns).
err_console = Console(stderr=True, soft_wrap=True)


class _LiveColumn(ProgressColumn):
    """The running level's own numbers, read from the load generator's counters."""

    def render(self, task: Task) -> Text:
        live: LiveCounters | None = task.fields.get("live")
        if live is None:
            return Text("")
        t = live.elapsed_s()
        rate = live.tokens / t if t > 0 else 0.0
        return Text(
            f"{task.fields.get('level', '')}  {t:5.1f} s  {live.completed} req  "
            f"{live.errors} err  {rate:,.0f} tok/s",
            style="cyan",
        )


class _ProgressObserver(LevelObserver):
    def __init__(self, progress: Progress, total_levels: int) -> None:
        self.progress = progress
        self.task = progress.add_task("sweep", total=total_levels)
        self.outcome: SweepOutcome | None = None

    def sweep_started(self, outcome: SweepOutcome) -> None:
        self.outcome = outcome
        self.message(f"server table before the sweep: {outcome.before.describe()}")

    def level_started(self, series: str, concurrency: int, live: LiveCounters) -> None:
        self.progress.update(self.task, live=live, level=f"{series} c={concurrency}")

    def level_finished(self, result: LevelResult) -> None:
        self.progress.advance(self.task)
        batch = "" if result.mean_batch is None else f"  batch {result.mean_batch:.1f}"
        errors = f"  [red]{result.errors} errors[/red]" if result.errors else ""
        foreign = f"  [yellow]{FOREIGN_NOTE}[/yellow]" if result.foreign_traffic else ""
        self.progress.console.print(
            f"  {result.series:>7} c={result.concurrency:<4}{result.output_tok_per_s:9.1f} tok/s"
            f"  TPOT {_ms(result.tpot_p50_ms)}  TTFT {_ms(result.ttft_p50_ms)}{batch}{errors}"
            f"{foreign}"
        )

    def message(self, text: str) -> None:
        self.progress.console.print(f"[dim]{text}[/dim]")

    def warning(self, text: str) -> None:
        self.progress.console.print(f"[yellow]warning:[/yellow] {text}", soft_wrap=True)


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f} ms"


def _pair(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"{a:.1f} / {b:.1f}"


def _batch(r: LevelResult) -> str:
    if r.mean_batch is None:
        return "-"
    return f"{r.mean_batch:.1f}" + ("!" if r.foreign_traffic else "")


def results_table(results: list[LevelResult]) -> Table:
    best = best_depths(results)
    table = Table(title="per (depth, concurrency); * = best forced depth", box=None)
    for name in ("series", "conc", "tok/s", "TTFT p50/p90 ms", "TPOT p50/p90 ms", "batch"):
        table.add_column(name, justify="left" if name == "series" else "right", no_wrap=True)
    table.add_column("accept", justify="right", no_wrap=True)
    table.add_column("req", justify="right", no_wrap=True)
    for r in results:
        star = "*" if r.depth is not None and best.get(r.concurrency) == r.depth else " "
        table.add_row(
            r.series,
            str(r.concurrency),
            f"{r.output_tok_per_s:.1f}{star}",
            _pair(r.ttft_p50_ms, r.ttft_p90_ms),
            _pair(r.tpot_p50_ms, r.tpot_p90_ms),
            _batch(r),
            "-" if r.accept_length is None else f"{r.accept_length:.2f}",
            f"{r.requests}" + (f" ({r.errors} err)" if r.errors else ""),
        )
    return table


def prepare_out_dir(path: Path) -> str | None:
    """Create the output folder and prove it is writable; why not, if it is not."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".specctl-write-check"
        probe.touch()
        probe.unlink()
    except OSError as err:
        return f"--out {path}: cannot write there ({err.strerror or err}); pick another folder"
    return None


def report(outcome: SweepOutcome, out_dir: Path, console: Console) -> None:
    console.print(results_table(outcome.results))
    foreign = [r for r in outcome.results if r.foreign_traffic]
    if foreign:
        levels = ", ".join(f"{r.series} c={r.concurrency}" for r in foreign)
        console.print(
            f"[yellow]![/yellow] {FOREIGN_NOTE} ({levels}); those levels measure more than this "
            "sweep's load: rerun them on an idle server",
            soft_wrap=True,
        )
    cross = crossovers(outcome.results)
    console.print("crossovers: " + ("; ".join(c.describe() for c in cross) or "none measured"))
    table = recommend_table(outcome.results, outcome.before.captured_depths)
    if table is not None:
        console.print(f"recommended table (batch size -> depth): [bold]{table.describe()}[/bold]")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        write_json(outcome, out_dir / "bench.json")
        write_csv(outcome.results, out_dir / "bench.csv")
        plot(outcome, out_dir / "bench.png")
    except OSError as err:
        err_console.print(f"[red]error:[/red] cannot write the results to {out_dir}: {err}")
        raise typer.Exit(2) from None
    console.print(
        f"wrote {out_dir / 'bench.csv'}, {out_dir / 'bench.json'}, {out_dir / 'bench.png'}"
    )


@app.command("bench")
def bench(
    url: Annotated[
        str,
        typer.Option(
            help="The speculative server (SGLang with the specctl plugin, or `specctl sim serve`)."
        ),
    ],
    concurrency: Annotated[
        str, typer.Option(help="Comma-separated concurrency levels (streams kept in flight).")
    ] = DEFAULT_CONCURRENCY,
    depths: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated depths to force, 0 = drafting off. "
            "Default: every depth the server captured."
        ),
    ] = None,
    no_spec_url: Annotated[
        str | None,
        typer.Option(
            help="A second server started without speculation, "
            "swept at the same levels for comparison."
        ),
    ] = None,
    admin_key: Annotated[
        str | None,
        typer.Option(
            envvar=ADMIN_KEY_ENV, help="The server's --admin-api-key (needed to force depths)."
        ),
    ] = None,
    requests_per_level: Annotated[
        int | None, typer.Option(min=1, help="End each level after this many completed requests.")
    ] = None,
    duration_per_level: Annotated[
        float | None,
        typer.Option(
            min=0.01,
            help=f"End each level after this many seconds "
            f"(default {DEFAULT_DURATION_S:g} unless --requests-per-level).",
        ),
    ] = None,
    dataset: Annotated[
        Path | None,
        typer.Option(
            help='JSONL prompts: one {"prompt": "...", "output_tokens": N} per line '
            "(output_tokens optional).",
        ),
    ] = None,
    prompt_tokens: Annotated[
        int, typer.Option(min=1, help="Synthetic prompt length (tokens), when no --dataset.")
    ] = 256,
    output_tokens: Annotated[
        int, typer.Option(min=1, help="Tokens generated per request (EOS ignored).")
    ] = 256,
    model: Annotated[
        str | None,
        typer.Option(help="Model name sent in requests. Default: the server's /v1/models."),
    ] = None,
    temperature: Annotated[float, typer.Option(min=0.0, help="Sampling temperature.")] = 0.0,
    out: Annotated[
        Path | None,
        typer.Option(help="Folder for bench.csv, bench.json, bench.png. Default: ./bench-<time>."),
    ] = None,
) -> None:
    """Measure tok/s, TTFT and TPOT per (speculation depth, concurrency) on a live server.

    For each depth, forces it through the admin RPC (read back from /server_info), keeps N
    streams in flight on /v1/completions for each concurrency level, and restores the
    server's previous table at the end (also on errors, Ctrl-C and SIGTERM). Reports the
    crossovers and the table it recommends; stop the specctl daemon first, or it will push
    over the forced depths.

    Examples:

      specctl bench --url http://127.0.0.1:30000 --admin-key $KEY

      specctl bench --url http://gpu1:30000 --depths 0,1,3 --concurrency 1,4,16,64,256 \\
          --no-spec-url http://gpu1:30001 --duration-per-level 60 --out bench-k2

      specctl sim serve --profile kimi-k25-8x-rtxpro6000-pcie --port 30000 --admin-key k &
      specctl bench --url http://127.0.0.1:30000 --admin-key k --concurrency 1,8,64 \\
          --requests-per-level 64 --output-tokens 64
    """
    for option, value in (("--url", url), ("--no-spec-url", no_spec_url)):
        if value is not None and (problem := url_problem(value)) is not None:
            raise typer.BadParameter(problem, param_hint=option)
    levels = parse_int_list(concurrency, "--concurrency", 1)
    if requests_per_level is not None and duration_per_level is not None:
        raise typer.BadParameter("give --requests-per-level or --duration-per-level, not both")
    stop = (
        StopRule(requests=requests_per_level)
        if requests_per_level is not None
        else StopRule(duration_s=duration_per_level or DEFAULT_DURATION_S)
    )
    try:
        if dataset is not None:
            prompts = load_dataset(dataset, output_tokens)
            source = f"{dataset} ({len(prompts)} prompts)"
        else:
            prompts = synthetic_prompts(4096, prompt_tokens, output_tokens)
            source = f"synthetic, {prompt_tokens} prompt tokens, {output_tokens} output tokens"
        if depths is None:
            with ServerClient(url) as probe:
                forced = probe.state().captured_depths
        else:
            forced = parse_int_list(depths, "--depths", 0, MAX_DEPTH)
    except (DatasetError, ServerError) as err:
        err_console.print(f"[red]error:[/red] {err}")
        raise typer.Exit(2) from None
    out_dir = out or Path(f"bench-{time.strftime('%Y%m%d-%H%M%S')}")
    # Before the first push: a sweep whose results cannot be written is time lost.
    problem = prepare_out_dir(out_dir)
    if problem is not None:
        err_console.print(f"[red]error:[/red] {problem}")
        raise typer.Exit(2)
    plan = SweepPlan(
        url=url, depths=tuple(forced), concurrencies=levels, stop=stop, prompts=prompts,
        prompt_source=source, admin_key=admin_key, no_spec_url=no_spec_url, model=model,
        temperature=temperature,
    )  # fmt: skip
    console = Console()
    console.print(
        f"bench {url}: depths {list(forced)} x concurrency {list(levels)}, {stop.describe()}, "
        f"prompts: {source}"
    )
    progress = Progress(
        TextColumn("[bold]levels"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(), _LiveColumn(), console=console, transient=True,
    )  # fmt: skip
    observer = _ProgressObserver(progress, len(plan.levels()))
    code = 0
    try:
        with progress:
            outcome = run_sweep(plan, observer)
    except (KeyboardInterrupt, asyncio.CancelledError):
        err_console.print("[yellow]interrupted[/yellow]: writing the levels that finished")
        code = 130
    except (ServerError, LoadError) as err:
        err_console.print(f"[red]error:[/red] {err}")
        code = 2
    if observer.outcome is not None:
        outcome = observer.outcome
        if outcome.pushed and outcome.restored is not None:
            console.print(f"server table restored: {outcome.restored}")
        elif outcome.pushed:
            err_console.print(
                "[red]the previous table could not be restored[/red]; check the server"
            )
        if outcome.results:
            report(outcome, out_dir, console)
    if code:
        raise typer.Exit(code)
