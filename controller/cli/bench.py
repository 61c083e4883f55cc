"""`specctl bench`: a sweep per forced depth on a live server, without restarts.

This module declares the command and checks its options (every mistake is one `error:` line
naming the option, exit 2, before anything is pushed); controller/cli/bench_run.py runs the
sweep and prints it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from controller.cli import app
from controller.cli.args import ADMIN_KEY_ENV, fail, parse_int_list, parse_positive_list
from sglang_hooks.contract import MAX_DEPTH

if TYPE_CHECKING:
    from controller.bench.latency import Slo
    from controller.bench.prompts import Prompt

DEFAULT_CONCURRENCY = "1,2,4,8,16,32,64,128,256"
DEFAULT_DURATION_S = 20.0
DEFAULT_OUTPUT_TOKENS = 256


def _slo(items: list[str] | None) -> Slo | None:
    from controller.bench.latency import SloError, parse_slo

    if not items:
        return None
    try:
        return parse_slo(items)
    except SloError as err:
        raise typer.BadParameter(str(err), param_hint="--goodput") from None


def _prompts(
    dataset: Path | None, prompt_tokens: int, output_tokens: int | None
) -> tuple[list[Prompt], str]:
    """The prompts to send and how to describe them; a one-line error if the dataset is bad."""
    from controller.bench.prompts import DatasetError, read_dataset, synthetic_prompts

    if dataset is None:
        out = output_tokens or DEFAULT_OUTPUT_TOKENS
        prompts = synthetic_prompts(4096, prompt_tokens, out)
        return prompts, f"synthetic, {prompt_tokens} prompt tokens, {out} output tokens"
    try:
        data = read_dataset(dataset, DEFAULT_OUTPUT_TOKENS, fixed_output_tokens=output_tokens)
    except DatasetError as err:
        raise fail(f"--dataset: {err}") from None
    source = data.describe()
    if output_tokens is not None:
        source += f", every output fixed at {output_tokens} tokens (--output-tokens)"
    return data.prompts, source


def _only_with_rate(request_rate: str | None, **given: object) -> None:
    for option, value in given.items():
        if value is not None and request_rate is None:
            raise typer.BadParameter(
                "applies to open-loop load only; add --request-rate RATES (requests/s), or "
                "drop it to keep a fixed number of streams per level (--concurrency)",
                param_hint=option,
            )


def _warn_if_more_than_cores(processes: int) -> None:
    from controller.bench.report import available_cores

    cores = available_cores()
    if processes > cores:
        typer.secho(
            f"warning: --client-processes {processes} is more than the {cores} cores here: the "
            "processes share them (each level's client CPU share in bench.json tells)",
            err=True,
            fg=typer.colors.YELLOW,
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
        str | None,
        typer.Option(
            help="Comma-separated concurrency levels: streams kept in flight, each sending its "
            f"next request when one ends. Default {DEFAULT_CONCURRENCY}.",
        ),
    ] = None,
    request_rate: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated request rates (requests/s), instead of --concurrency: "
            "requests arrive at that rate whatever the server does (open loop).",
        ),
    ] = None,
    burstiness: Annotated[
        float | None,
        typer.Option(
            help="With --request-rate: shape of the gamma-distributed gaps between arrivals; "
            "1 = Poisson (default), below 1 burstier, above 1 more regular.",
        ),
    ] = None,
    max_concurrency: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="With --request-rate: at most this many requests in flight (an arrival then "
            "waits for a free stream). Default: no cap.",
        ),
    ] = None,
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
    paired: Annotated[
        bool,
        typer.Option(
            "--paired",
            help="With --no-spec-url: run each load's levels back to back, every depth and then "
            "the plain server, on the same requests in the same order (default: one series "
            "after another, each level on fresh prompts). For comparing the servers level by "
            "level: no drift between series, no different draw of prompts.",
        ),
    ] = False,
    plain_first: Annotated[
        bool,
        typer.Option(
            "--plain-first",
            help="With --paired: the plain server first at every load, then each depth. "
            "Alternating it between runs tells an order effect from a gap between the servers.",
        ),
    ] = False,
    admin_key: Annotated[
        str | None,
        typer.Option(
            envvar=ADMIN_KEY_ENV, help="The server's --admin-api-key (needed to force depths)."
        ),
    ] = None,
    requests_per_level: Annotated[
        int | None,
        typer.Option(min=1, help="End each level's window after this many completed requests."),
    ] = None,
    duration_per_level: Annotated[
        float | None,
        typer.Option(
            min=0.01,
            help=f"End each level's window after this many seconds "
            f"(default {DEFAULT_DURATION_S:g} unless --requests-per-level).",
        ),
    ] = None,
    warmup_per_level: Annotated[
        float | None,
        typer.Option(
            min=0.0,
            help="Seconds of unmeasured load before each level's window. Default: 10% of "
            "--duration-per-level, or 1 s with --requests-per-level.",
        ),
    ] = None,
    goodput: Annotated[
        list[str] | None,
        typer.Option(
            help="Latency SLO in ms, e.g. ttft:500,tpot:50 (keys ttft, tpot, e2el; repeat or "
            "comma-separate): adds goodput, the requests/s that met every bound.",
        ),
    ] = None,
    dataset: Annotated[
        Path | None,
        typer.Option(
            help='Prompts: JSONL lines {"prompt": "...", "output_tokens": N} (output_tokens '
            "optional), or a ShareGPT dump (JSON array or JSONL of conversations; the reply "
            "sets the output length).",
        ),
    ] = None,
    prompt_tokens: Annotated[
        int, typer.Option(min=1, help="Synthetic prompt length (tokens), when no --dataset.")
    ] = 256,
    output_tokens: Annotated[
        int | None,
        typer.Option(
            min=1,
            help=f"Tokens generated per request, EOS ignored. Default {DEFAULT_OUTPUT_TOKENS}, "
            "or each record's own length with --dataset; given, it fixes every request's.",
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(help="Model name sent in requests. Default: the server's /v1/models."),
    ] = None,
    temperature: Annotated[float, typer.Option(min=0.0, help="Sampling temperature.")] = 0.0,
    out: Annotated[
        Path | None,
        typer.Option(help="Folder for bench.csv, bench.json, bench.png. Default: ./bench-<time>."),
    ] = None,
    client_processes: Annotated[
        int,
        typer.Option(
            min=1,
            help="Split each level's load across this many load-generator processes (its "
            "streams, or its open-loop arrivals, dealt among them), for levels that one process "
            "cannot read fast enough (flagged client-bound). 1: the load runs in this process; "
            "so does a level of fewer streams than processes.",
        ),
    ] = 1,
    freeze_gc: Annotated[
        bool,
        typer.Option(
            "--freeze-gc",
            help="Before the first level, ask each server to freeze its garbage collector "
            "(SGLang's /freeze_gc; needs the admin key): a collection of the objects a server "
            "holds after start-up can stall every request for half a second.",
        ),
    ] = False,
    flush_cache: Annotated[
        bool,
        typer.Option(
            "--flush-cache",
            help="Before each level, empty that server's prefix cache (SGLang's /flush_cache; "
            "needs the admin key where the server has one): each level then starts from an "
            "empty cache and a fresh KV pool, whatever the levels before it left. A level the "
            "server would not flush for is run anyway and says so (cache_flushed).",
        ),
    ] = False,
    client_bound_share: Annotated[
        float | None,
        typer.Option(
            hidden=True,
            help="The CPU share of a core (busiest load-generator process) at which a level "
            "counts as client-bound. Default 0.7.",
        ),
    ] = None,
) -> None:
    """Measure tok/s and latency per speculation depth and load level.

    For each depth, forces it through the admin RPC (read back from /server_info), loads
    /v1/completions at each level (N streams in flight, or requests arriving at a rate), and
    restores the server's previous table at the end (also on errors, Ctrl-C and SIGTERM).
    Each level has an unmeasured warm-up, then a measured window; it reports tok/s, TTFT,
    TPOT and inter-token latency (p50/p99), goodput under --goodput, the crossovers and the
    table it recommends. Stop the specctl daemon first, or it will push over the forced depths.

    \b
    Examples:
      specctl bench --url http://127.0.0.1:30000 --admin-key $KEY
      specctl bench --url http://gpu1:30000 --depths 0,1,3 \\
          --concurrency 1,4,16,64,256 --no-spec-url http://gpu1:30001 \\
          --duration-per-level 60 --warmup-per-level 10 --out bench-k2
      specctl bench --url http://gpu1:30000 --request-rate 1,2,4,8 \\
          --burstiness 0.5 --max-concurrency 128 --goodput ttft:500,tpot:50 \\
          --dataset ShareGPT_V3_unfiltered_cleaned_split.json
      specctl sim serve --profile h200-moe-eagle3 --port 30000 --admin-key k &
      specctl bench --url http://127.0.0.1:30000 --admin-key k \\
          --concurrency 1,8,64 --requests-per-level 64 --output-tokens 64
    """
    from controller.daemon.config import url_problem

    for option, value in (("--url", url), ("--no-spec-url", no_spec_url)):
        if value is not None and (problem := url_problem(value)) is not None:
            raise typer.BadParameter(problem, param_hint=option)
    if concurrency is not None and request_rate is not None:
        raise typer.BadParameter(
            "give --concurrency (streams in flight) or --request-rate (arrivals per second), "
            "not both",
            param_hint="--request-rate",
        )
    _only_with_rate(request_rate, **{"--burstiness": burstiness,
                                     "--max-concurrency": max_concurrency})  # fmt: skip
    if burstiness is not None and not burstiness > 0:
        raise typer.BadParameter(
            f"must be > 0 (1 = Poisson arrivals), got {burstiness:g}", param_hint="--burstiness"
        )
    rates = () if request_rate is None else parse_positive_list(request_rate, "--request-rate")
    levels = () if rates else parse_int_list(concurrency or DEFAULT_CONCURRENCY, "--concurrency", 1)
    if requests_per_level is not None and duration_per_level is not None:
        raise typer.BadParameter(
            "give --requests-per-level or --duration-per-level, not both",
            param_hint="--requests-per-level",
        )
    if client_bound_share is not None and not client_bound_share > 0:
        raise typer.BadParameter(
            f"must be > 0 (a share of one core), got {client_bound_share:g}",
            param_hint="--client-bound-share",
        )
    if paired and no_spec_url is None:
        raise typer.BadParameter(
            "pairs each level with the same level on a server without speculation: give "
            "--no-spec-url too",
            param_hint="--paired",
        )
    if plain_first and not paired:
        raise typer.BadParameter(
            "orders the servers within each paired load: give --paired too",
            param_hint="--plain-first",
        )
    forced = None if depths is None else parse_int_list(depths, "--depths", 0, MAX_DEPTH)
    slo = _slo(goodput)
    prompts, source = _prompts(dataset, prompt_tokens, output_tokens)

    from controller.bench.loadgen import StopRule
    from controller.bench.server_client import ServerClient, ServerError
    from controller.bench.sweep import CLIENT_BOUND_SHARE, SweepPlan
    from controller.cli.bench_run import prepare_out_dir, run_bench

    if requests_per_level is not None:
        stop = StopRule(requests=requests_per_level, warmup_s=warmup_per_level)
    else:
        duration_s = duration_per_level or DEFAULT_DURATION_S
        stop = StopRule(duration_s=duration_s, warmup_s=warmup_per_level)
    # Reached before anything is written: an unreachable --url leaves no empty --out folder.
    try:
        with ServerClient(url, admin_key=admin_key) as probe:
            captured = probe.state().captured_depths
    except ServerError as err:
        raise fail(str(err)) from None
    if forced is None:
        forced = captured
    out_dir = out or Path(f"bench-{time.strftime('%Y%m%d-%H%M%S')}")
    # Before the first push: a sweep whose results cannot be written is time lost.
    problem = prepare_out_dir(out_dir)
    if problem is not None:
        raise fail(problem)
    plan = SweepPlan(
        url=url, depths=tuple(forced), concurrencies=levels, stop=stop, prompts=prompts,
        prompt_source=source, admin_key=admin_key, no_spec_url=no_spec_url, model=model,
        temperature=temperature, request_rates=rates, burstiness=burstiness or 1.0,
        max_concurrency=max_concurrency, slo=slo, client_processes=client_processes,
        client_bound_share=client_bound_share or CLIENT_BOUND_SHARE, freeze_gc=freeze_gc,
        paired=paired, plain_first=plain_first, flush_cache=flush_cache,
    )  # fmt: skip
    _warn_if_more_than_cores(client_processes)
    code = run_bench(plan, out_dir)
    if code:
        raise typer.Exit(code)
