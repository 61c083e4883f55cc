"""The work behind `specctl bench`: run the sweep with a progress display, print and write it.

The progress bar covers the whole sweep and moves inside a level as its time passes (levels
with a fixed duration), with an estimate of the time left; above it, one line per finished
level. When the output is not a terminal the bar is not drawn, only those lines.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import (
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
)
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from controller.bench.loadgen import LiveCounters, LoadError, LoadShape, StopRule
from controller.bench.report import (
    best_depths,
    client_bound_hint,
    crossovers,
    eviction_hint,
    paired_lines,
    plot,
    prompts_came_round,
    recommendation_text,
    repeat_hint,
    stall_hint,
    stream_interval_hint,
    too_short_hint,
    undecided_levels,
    write_csv,
    write_json,
)
from controller.bench.server_client import ServerError
from controller.bench.sweep import LevelObserver, LevelResult, SweepOutcome, SweepPlan, run_sweep
from controller.cli.args import fail, write_problem
from controller.cli.tables import print_table

FOREIGN_NOTE = "batch above concurrency: other traffic on the server"

# soft_wrap: an error stays one line even when stderr is a file or a pipe (80 columns).
err_console = Console(stderr=True, soft_wrap=True)


def level_fraction(live: LiveCounters | None, stop: StopRule) -> float:
    """How far the running level is, in [0, 1): by time when levels have a fixed duration
    (warm-up included); 0 when they end after a number of requests (not known in advance)."""
    if live is None or stop.duration_s is None:
        return 0.0
    return min(live.elapsed_s() / (stop.warmup + stop.duration_s), 0.999)


class _SweepBar(ProgressColumn):
    """The whole sweep's bar: finished levels plus the running level's share."""

    def __init__(self, stop: StopRule, width: int = 30) -> None:
        super().__init__()
        self.stop = stop
        self.width = width

    def render(self, task: Task) -> ProgressBar:
        done = task.completed + level_fraction(task.fields.get("live"), self.stop)
        return ProgressBar(total=task.total or 1, completed=done, width=self.width)


class _TimeLeft(ProgressColumn):
    """The sweep's remaining time when levels have a fixed duration (drains not counted)."""

    def __init__(self, stop: StopRule) -> None:
        super().__init__()
        self.stop = stop

    def render(self, task: Task) -> Text:
        if self.stop.duration_s is None or task.total is None:
            return Text("")
        level_s = self.stop.warmup + self.stop.duration_s
        left = task.total - task.completed - level_fraction(task.fields.get("live"), self.stop)
        minutes, seconds = divmod(round(max(left, 0.0) * level_s), 60)
        return Text(f"~{minutes}:{seconds:02d} left", style="progress.remaining")


class _LiveColumn(ProgressColumn):
    """The running level's own numbers, read from the load generator's counters."""

    def render(self, task: Task) -> Text:
        live: LiveCounters | None = task.fields.get("live")
        if live is None:
            return Text("")
        t = live.elapsed_s()
        rate = live.tokens / t if t > 0 else 0.0
        phase = "warm-up" if live.warming_up else "measuring"
        return Text(
            f"{task.fields.get('level', '')} {phase} {t:5.1f} s  {live.completed} req  "
            f"{live.errors} err  {rate:,.0f} tok/s",
            style="cyan",
        )


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.1f} ms"


def level_line(r: LevelResult) -> str:
    """One finished level, as printed above the progress bar."""
    batch = "" if r.mean_batch is None else f"  batch {r.mean_batch:.1f}"
    errors = f"  [red]{r.errors} errors[/red]" if r.errors else ""
    good = (
        ""
        if r.goodput_req_per_s is None
        else f"  goodput {r.goodput_req_per_s:.2f} req/s"
        + ("" if r.slo_attainment is None else f" ({r.slo_attainment:.0%} in SLO)")
    )
    notes = [FOREIGN_NOTE] if r.foreign_traffic else []
    if r.too_short:
        notes.append("too short: no request finished in the window")
    if r.client_bound:
        share = r.client_process_cpu_share or r.client_cpu_share
        who = "its busiest load process" if r.client_processes > 1 else "the load generator"
        notes.append(f"client-bound: {who} used {share:.2f} of a core")
    flags = "".join(f"  [yellow]{n}[/yellow]" for n in notes)
    if r.too_few:
        notes.append(f"too few requests ({r.requests})")
    load = r.label if r.request_rate is None else f"{r.label} (c<={r.concurrency})"
    ci = r.ci95.get("output_tok_per_s")
    spread = "" if ci is None else f" ±{ci:.1f}"
    return (
        f"  {r.series:>7} {load:<10}{r.output_tok_per_s:9.1f}{spread} tok/s  "
        f"TTFT {_ms(r.ttft_p50_ms)}  TPOT {_ms(r.tpot_p50_ms)}  ITL p99 {_ms(r.itl_p99_ms)}"
        f"{batch}{good}{errors}{flags}"
    )


class _ProgressObserver(LevelObserver):
    def __init__(self, progress: Progress, total_windows: int) -> None:
        self.progress = progress
        self.task = progress.add_task("sweep", total=total_windows)
        self.outcome: SweepOutcome | None = None

    def sweep_started(self, outcome: SweepOutcome) -> None:
        self.outcome = outcome
        self.message(f"server table before the sweep: {outcome.before.describe()}")

    def level_started(self, series: str, shape: LoadShape, live: LiveCounters) -> None:
        self.progress.update(self.task, live=live, level=f"{series} {shape.describe()}")

    def window_finished(self, result: LevelResult) -> None:
        self.progress.update(self.task, live=None)
        self.progress.advance(self.task)

    def level_finished(self, result: LevelResult) -> None:
        self.progress.console.print(level_line(result), highlight=False)

    def message(self, text: str) -> None:
        self.progress.console.print(f"[dim]{text}[/dim]")

    def warning(self, text: str) -> None:
        self.progress.console.print(f"[yellow]warning:[/yellow] {text}", soft_wrap=True)


def _pair(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"{a:.1f} / {b:.1f}"


def _batch(r: LevelResult) -> str:
    """The plugin's mean batch; else (a server without it) the mean of SGLang's running-request
    gauge over the window, marked `~`."""
    if r.mean_batch is None:
        return "-" if r.running_mean is None else f"~{r.running_mean:.1f}"
    return f"{r.mean_batch:.1f}" + ("!" if r.foreign_traffic else "")


def _busy(r: LevelResult) -> str:
    if r.gpu_prefill_busy is None or r.gpu_decode_busy is None:
        return "-"
    return f"{r.gpu_prefill_busy:.2f} / {r.gpu_decode_busy:.2f}"


def _tok(r: LevelResult, name: str) -> str:
    """A throughput, with its 95% interval where the level was repeated."""
    ci = r.ci95.get(name)
    return f"{getattr(r, name):.1f}" + ("" if ci is None else f" ±{ci:.1f}")


def results_table(results: list[LevelResult], depths: Sequence[int] | None = None) -> Table:
    """One row per level; p90s and the rest are in bench.csv / bench.json."""
    best = best_depths(results, depths=depths)
    rate = any(r.request_rate is not None for r in results)
    slo = any(r.goodput_req_per_s is not None for r in results)
    flagged = any(r.flags for r in results)
    gpu = any(r.gpu_prefill_busy is not None for r in results)
    repeated = max((r.repeats for r in results), default=1)
    title = "per (depth, level); * = best forced depth"
    if repeated > 1:
        title += f"; mean of {repeated} repeats ± 95% confidence interval"
    table = Table(title=title, box=None)
    names = ["series", *(["rate/s", "max conc"] if rate else ["conc"])]
    names += ["out tok/s", "in tok/s", "total tok/s"]
    names += ["req/s"] if rate else []
    names += ["TTFT p50/p99 ms", "TPOT p50/p99 ms", "ITL p50/p99 ms"]
    names += ["goodput req/s"] if slo else []
    names += ["batch", "accept", "req"]
    names += ["GPU prefill/decode"] if gpu else []
    names += ["left out"] if flagged else []
    for name in names:
        table.add_column(name, justify="left" if name in ("series", "left out") else "right")
    for r in results:
        star = "*" if r.depth is not None and best.get(r.level) == r.depth else " "
        row = [r.series]
        row += [f"{r.request_rate:g}", str(r.concurrency)] if rate else [str(r.concurrency)]
        row += [_tok(r, "output_tok_per_s") + star, _tok(r, "input_tok_per_s"),
                _tok(r, "total_tok_per_s")]  # fmt: skip
        if rate:
            row.append(f"{r.request_per_s:.2f}")
        row += [
            _pair(r.ttft_p50_ms, r.ttft_p99_ms),
            _pair(r.tpot_p50_ms, r.tpot_p99_ms),
            _pair(r.itl_p50_ms, r.itl_p99_ms),
        ]
        if slo:
            good = "-" if r.goodput_req_per_s is None else f"{r.goodput_req_per_s:.2f}"
            if r.slo_attainment is not None:
                good += f" ({r.slo_attainment:.0%})"
            row.append(good)
        row += [
            _batch(r),
            "-" if r.accept_length is None else f"{r.accept_length:.2f}",
            f"{r.requests}" + (f" ({r.errors} err)" if r.errors else ""),
        ]
        if gpu:
            row.append(_busy(r))
        if flagged:
            row.append(", ".join(r.flags))
        table.add_row(*row)
    return table


def _stat(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def latency_table(results: list[LevelResult], percentiles: Sequence[float]) -> Table:
    """Per level and latency: mean ± standard deviation over the window's requests, then the
    percentiles asked for (bench.json and bench.csv hold the same figures)."""
    from controller.bench.latency import LATENCY_METRICS, percentile_key

    keys = [percentile_key(q) for q in percentiles]
    table = Table(
        title=f"latency (ms) per (depth, level): mean ±std, then {' / '.join(keys)}",
        box=None,
    )
    rate = any(r.request_rate is not None for r in results)
    table.add_column("series")
    table.add_column("rate/s" if rate else "conc", justify="right")
    for metric in LATENCY_METRICS:
        table.add_column(metric.upper(), justify="right")
    for r in results:
        load = str(r.concurrency) if r.request_rate is None else f"{r.request_rate:g}"
        row = [r.series, load]
        for metric in LATENCY_METRICS:
            stats = r.latency_ms.get(metric, {})
            if stats.get("mean") is None:
                row.append("-")
                continue
            row.append(
                f"{_stat(stats.get('mean'))} ±{_stat(stats.get('std'))}\n"
                + " / ".join(_stat(stats.get(k)) for k in keys)
            )
        table.add_row(*row)
    return table


def prompt_size_line(plan: SweepPlan, results: Sequence[LevelResult]) -> str | None:
    """The prompt size the servers counted (their usage), where bench sized them approximately
    or the server adds tokens of its own (a BOS, a chat template)."""
    counted = [r.prompt_tokens for r in results if r.prompt_tokens]
    if not counted:
        return None
    low, high = min(counted), max(counted)
    span = f"{low:.0f}" if round(low) == round(high) else f"{low:.0f} to {high:.0f}"
    line = f"prompt tokens as the servers counted them (their usage, mean per level): {span}"
    asked = plan.asked_prompt_tokens
    if asked is None:
        return line
    if plan.exact_prompt_size:
        return line + f", for {asked:.0f} asked (the rest is the server's own: BOS, template)"
    return line + (
        f", for ~{asked:.0f} asked: without --tokenizer a word counts as a token, so the size "
        "asked is approximate; the server's count is the one to quote"
    )


def prepare_out_dir(path: Path) -> str | None:
    """Create the output folder and prove it is writable; why not, if it is not."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        return f"--out {path}: cannot write there ({err.strerror or err}); pick another folder"
    return write_problem(path, "--out", path)


def mean_output_tokens(plan: SweepPlan) -> float:
    return sum(p.output_tokens for p in plan.prompts) / max(len(plan.prompts), 1)


def report(outcome: SweepOutcome, out_dir: Path, console: Console) -> None:
    results = outcome.results
    plan = outcome.plan
    print_table(console, results_table(results, plan.depths))
    print_table(console, latency_table(results, plan.percentiles))
    size = prompt_size_line(plan, results)
    if size is not None:
        console.print(size, highlight=False)
    foreign = [r for r in results if r.foreign_traffic]
    if foreign:
        levels = ", ".join(f"{r.series} {r.label}" for r in foreign)
        console.print(
            f"[yellow]![/yellow] {FOREIGN_NOTE} ({levels}); those levels measure more than this "
            "sweep's load: rerun them on an idle server"
        )
    frozen = bool(outcome.gc_frozen) and all(v is True for v in outcome.gc_frozen.values())
    hints = (
        too_short_hint(results, mean_output_tokens(outcome.plan)),
        client_bound_hint(results, outcome.plan.client_bound_share),
        stall_hint(results, frozen),
        stream_interval_hint(outcome.servers),
        repeat_hint(prompts_came_round(results, len(outcome.plan.prompts), outcome.servers)),
        eviction_hint(results, outcome.plan.flush_cache),
    )
    for hint in hints:
        if hint is not None:
            console.print(f"[yellow]![/yellow] {hint}")
    if outcome.plan.paired:
        for line in paired_lines(results):
            console.print(line, highlight=False)
    cross = crossovers(results, depths=plan.depths)
    console.print("crossovers: " + ("; ".join(c.describe() for c in cross) or "none measured"))
    for undecided in undecided_levels(results, plan.depths):
        console.print(f"[yellow]![/yellow] {undecided.describe()}", highlight=False)
    verdict = recommendation_text(outcome)
    if verdict is not None:
        console.print(f"[bold]{verdict}[/bold]")
    elif results:
        console.print("[bold]no table recommended[/bold]: no level could choose a depth "
                      "(see the lines above)")  # fmt: skip
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        write_json(outcome, out_dir / "bench.json")
        write_csv(results, out_dir / "bench.csv")
        plot(outcome, out_dir / "bench.png")
    except OSError as err:
        raise fail(f"--out {out_dir}: cannot write the results ({err.strerror or err})") from None
    console.print(
        f"wrote {out_dir / 'bench.csv'}, {out_dir / 'bench.json'}, {out_dir / 'bench.png'}"
    )


def describe_plan(plan: SweepPlan) -> str:
    if plan.request_rates:
        cap = "" if plan.max_concurrency is None else f", at most {plan.max_concurrency} in flight"
        load = (
            f"request rate [{', '.join(f'{r:g}' for r in plan.request_rates)}] req/s "
            f"(burstiness {plan.burstiness:g}{cap})"
        )
    else:
        load = f"concurrency {list(plan.concurrencies)}"
    slo = "" if plan.slo is None else f", goodput SLO {plan.slo.describe()}"
    split = (
        ""
        if plan.client_processes == 1
        else f", load split across {plan.client_processes} client processes"
    )
    order = ", the plain server first" if plan.plain_first else ""
    paired = (
        f", each load's levels back to back on the same requests (paired{order})"
        if plan.paired
        else ""
    )
    flush = ", the prefix cache emptied before each level" if plan.flush_cache else ""
    repeats = f", each level {plan.repeats} times" if plan.repeats > 1 else ""
    endpoint = f", {plan.style.path}"
    extra = (
        f" + {', '.join(sorted(plan.style.extra_body))} (--extra-request-body)"
        if plan.style.extra_body
        else ""
    )
    return (
        f"bench {plan.url}: depths {list(plan.depths)} x {load}, {plan.stop.describe()}{repeats}"
        f"{slo}{split}{paired}{flush}{endpoint}{extra}, prompts: {plan.prompt_source}"
    )


def run_bench(plan: SweepPlan, out_dir: Path) -> int:
    """Run the sweep, print and write what finished; the exit status (130: interrupted)."""
    console = Console(soft_wrap=True)
    console.print(describe_plan(plan), highlight=False)
    progress = Progress(
        TextColumn("[bold]levels"), _SweepBar(plan.stop),
        TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn(), _TimeLeft(plan.stop),
        _LiveColumn(), console=console, transient=True,
    )  # fmt: skip
    observer = _ProgressObserver(progress, len(plan.levels()) * plan.repeats)
    code = 0
    try:
        with progress:
            run_sweep(plan, observer)
    except (KeyboardInterrupt, asyncio.CancelledError):
        err_console.print("[yellow]interrupted[/yellow]: writing the levels that finished")
        code = 130
    except (ServerError, LoadError) as err:
        err_console.print(f"[red]error:[/red] {err}")
        code = 2
    outcome = observer.outcome
    if outcome is not None:
        if outcome.pushed and outcome.restored is not None:
            console.print(f"server table restored: {outcome.restored}")
        elif outcome.pushed:
            err_console.print(
                "[red]the previous table could not be restored[/red]; check the server"
            )
        if outcome.results:
            try:
                report(outcome, out_dir, console)
            except typer.Exit as exit_:
                return int(exit_.exit_code or 2)
    return code
