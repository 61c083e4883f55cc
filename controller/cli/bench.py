"""`specctl bench`: a sweep per forced depth on a live server, without restarts.

This module declares the command and checks its options (every mistake is one `error:` line
naming the option, exit 2, before anything is pushed); controller/cli/bench_run.py runs the
sweep and prints it, controller/cli/bench_setup.py builds its prompts and checks its servers.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from controller.cli import app
from controller.cli.args import (
    ADMIN_KEY_ENV,
    API_KEY_ENV,
    API_KEY_HELP,
    fail,
    parse_headers,
    parse_int_list,
    parse_positive_list,
)
from controller.cli.help import PanelCommand
from sglang_hooks.contract import MAX_DEPTH

if TYPE_CHECKING:
    from controller.bench.latency import Slo
    from controller.cli.bench_setup import Keys
    from sglang_hooks.draft_shape import Shape

DEFAULT_CONCURRENCY = "1,2,4,8,16,32,64,128,256"
DEFAULT_DURATION_S = 20.0
DEFAULT_OUTPUT_TOKENS = 256
DEFAULT_PERCENTILES = "50,90,95,99"
DATASET_NAMES = ("random-words", "random-ids", "generated-shared-prefix")

SERVERS, LOAD, LEVELS, REQUESTS, PROMPTS, REPORT, CLIENT = (
    "Servers", "Depths and load", "Levels", "Requests", "Prompts", "Report", "Load generator",
)  # fmt: skip

def _slo(items: list[str] | None) -> Slo | None:
    from controller.bench.latency import SloError, parse_slo

    if not items:
        return None
    try:
        return parse_slo(items)
    except SloError as err:
        raise typer.BadParameter(str(err), param_hint="--goodput") from None


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



def _extra_body(text: str | None) -> dict[str, object]:
    import json

    if text is None:
        return {}
    try:
        body = json.loads(text)
    except json.JSONDecodeError as err:
        raise typer.BadParameter(
            f"not valid JSON ({err.msg} at character {err.pos}); give an object like "
            '\'{"top_p": 0.9}\'',
            param_hint="--extra-request-body",
        ) from None
    if not isinstance(body, dict):
        raise typer.BadParameter(
            f"must be a JSON object of body fields, got {type(body).__name__}",
            param_hint="--extra-request-body",
        )
    return body


def _percentiles(text: str) -> tuple[float, ...]:
    from controller.bench.latency import parse_percentiles

    try:
        return parse_percentiles(text)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--percentiles") from None


def _dataset_options(dataset: str | None, given: dict[str, object]) -> None:
    """The --gsp-* options shape the generated-shared-prefix dataset alone."""
    from controller.cli.bench_setup import SHARED_PREFIX

    for option, value in given.items():
        if value is not None and dataset != SHARED_PREFIX:
            raise typer.BadParameter(
                f"shapes the generated-shared-prefix dataset: add --dataset {SHARED_PREFIX}",
                param_hint=option,
            )


def _shape_list(text: str, instead: dict[str, object]) -> list[Shape]:
    """The shapes `--shapes` names (plain as None); the options it replaces or cannot go
    with. Whether the server captured each is checked once it is reached."""
    from sglang_hooks.draft_shape import ShapeError, parse_shapes

    given = [name for name, value in instead.items() if value is not None]
    if given:
        raise typer.BadParameter(
            f"holds each captured shape in turn on one server, closed loop, once: drop "
            f"{given[0]}", param_hint="--shapes")  # fmt: skip
    try:
        return parse_shapes(text)
    except ShapeError as err:
        raise typer.BadParameter(str(err), param_hint="--shapes") from None


def _check_held(url: str, held: list[Shape], keys: Keys) -> None:
    """Every shape to hold was captured by the server (before --out is made)."""
    from controller.bench.server_client import ServerError
    from controller.bench.shape_sweep import ShapeSweepError, check_captured

    try:
        with keys.client(url) as client:
            check_captured(held, client.state())
    except (ShapeSweepError, ServerError) as err:
        raise fail(f"--url {url}: {err}" if isinstance(err, ServerError) else str(err)) from None


@app.command("bench", cls=PanelCommand)
def bench(
    url: Annotated[
        str,
        typer.Option(
            help="The speculative server (SGLang with the specctl plugin, or `specctl sim serve`).",
            rich_help_panel=SERVERS,
        ),
    ],
    no_spec_url: Annotated[
        str | None,
        typer.Option(
            help="A second server started without speculation, swept at the same levels for "
            "comparison.",
            rich_help_panel=SERVERS,
        ),
    ] = None,
    admin_key: Annotated[
        str | None,
        typer.Option(
            envvar=ADMIN_KEY_ENV,
            help="The server's --admin-api-key (needed to force depths).",
            rich_help_panel=SERVERS,
        ),
    ] = None,
    api_key: Annotated[
        str | None, typer.Option(envvar=API_KEY_ENV, help=API_KEY_HELP, rich_help_panel=SERVERS)
    ] = None,
    header: Annotated[
        list[str] | None,
        typer.Option(
            help="An extra HTTP header for every request, NAME:VALUE (or NAME=VALUE); repeat "
            "for several (a gateway's routing or tenant header).",
            rich_help_panel=SERVERS,
        ),
    ] = None,
    depths: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated depths to force, 0 = drafting off. "
            "Default: every depth the server captured.",
            rich_help_panel=LOAD,
        ),
    ] = None,
    shapes: Annotated[
        str | None,
        typer.Option(
            help="On a shape server (`specctl serve --shapes`): hold each of these captured "
            "shapes in turn (STEPSxTOPKxDRAFT, comma-separated; a chain of depth d is "
            "dx1x(d+1), plain is off where the server captured it) and bench every level as "
            "it runs; writes shapes.json, the best shape per load as shapes-table.yaml and "
            "shapes.png. In place of --depths.",
            rich_help_panel=LOAD,
        ),
    ] = None,
    concurrency: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated concurrency levels: streams kept in flight, each sending its "
            f"next request when one ends. Default {DEFAULT_CONCURRENCY}.",
            rich_help_panel=LOAD,
        ),
    ] = None,
    request_rate: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated request rates (requests/s), instead of --concurrency: "
            "requests arrive at that rate whatever the server does (open loop).",
            rich_help_panel=LOAD,
        ),
    ] = None,
    burstiness: Annotated[
        float | None,
        typer.Option(
            help="With --request-rate: shape of the gamma-distributed gaps between arrivals; "
            "1 = Poisson (default), below 1 burstier, above 1 more regular.",
            rich_help_panel=LOAD,
        ),
    ] = None,
    max_concurrency: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="With --request-rate: at most this many requests in flight (an arrival then "
            "waits for a free stream). Default: no cap.",
            rich_help_panel=LOAD,
        ),
    ] = None,
    seed: Annotated[
        int,
        typer.Option(
            min=0,
            help="Seed of the synthetic prompts and of the open loop's arrival times: the same "
            "seed sends the same prompts at the same times.",
            rich_help_panel=LOAD,
        ),
    ] = 0,
    requests_per_level: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="End each level's window after this many completed requests.",
            rich_help_panel=LEVELS,
        ),
    ] = None,
    duration_per_level: Annotated[
        float | None,
        typer.Option(
            min=0.01,
            help=f"End each level's window after this many seconds "
            f"(default {DEFAULT_DURATION_S:g} unless --requests-per-level).",
            rich_help_panel=LEVELS,
        ),
    ] = None,
    warmup_per_level: Annotated[
        float | None,
        typer.Option(
            min=0.0,
            help="Seconds of unmeasured load before each level's window. Default: 10% of "
            "--duration-per-level, or 1 s with --requests-per-level.",
            rich_help_panel=LEVELS,
        ),
    ] = None,
    repeats: Annotated[
        int,
        typer.Option(
            min=1,
            help="Measure each level this many times back to back (each with its warm-up): "
            "every figure is then the mean of the repeats with a 95% confidence interval "
            "(Student's t across them), and a depth must beat the one below it by more than "
            "the intervals to be chosen.",
            rich_help_panel=LEVELS,
        ),
    ] = 1,
    paired: Annotated[
        bool,
        typer.Option(
            "--paired",
            help="With --no-spec-url: run each load's levels back to back, every depth and then "
            "the plain server, on the same requests in the same order (default: one series "
            "after another, each level on fresh prompts). For comparing the servers level by "
            "level: no drift between series, no different draw of prompts.",
            rich_help_panel=LEVELS,
        ),
    ] = False,
    plain_first: Annotated[
        bool,
        typer.Option(
            "--plain-first",
            help="With --paired: the plain server first at every load, then each depth. "
            "Alternating it between runs tells an order effect from a gap between the servers.",
            rich_help_panel=LEVELS,
        ),
    ] = False,
    freeze_gc: Annotated[
        bool,
        typer.Option(
            "--freeze-gc",
            help="Before the first level, ask each server to freeze its garbage collector "
            "(SGLang's /freeze_gc; needs the admin key): a collection of the objects a server "
            "holds after start-up can stall every request for half a second.",
            rich_help_panel=LEVELS,
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
            rich_help_panel=LEVELS,
        ),
    ] = False,
    endpoint: Annotated[
        str,
        typer.Option(
            help="completions (/v1/completions with a prompt) or chat (/v1/chat/completions "
            "with messages; the server applies the model's chat template, and its usage counts "
            "the templated prompt).",
            rich_help_panel=REQUESTS,
        ),
    ] = "completions",
    model: Annotated[
        str | None,
        typer.Option(
            help="Model name sent in requests. Default: the server's /v1/models.",
            rich_help_panel=REQUESTS,
        ),
    ] = None,
    temperature: Annotated[
        float, typer.Option(min=0.0, help="Sampling temperature.", rich_help_panel=REQUESTS)
    ] = 0.0,
    output_tokens: Annotated[
        int | None,
        typer.Option(
            min=1,
            help=f"Tokens generated per request, EOS ignored. Default {DEFAULT_OUTPUT_TOKENS}, "
            "or each record's own length with a --dataset file; given, it fixes every "
            "request's.",
            rich_help_panel=REQUESTS,
        ),
    ] = None,
    extra_request_body: Annotated[
        str | None,
        typer.Option(
            help='A JSON object merged into every request\'s body, e.g. \'{"top_p": 0.9}\'; '
            "its fields win over bench's own (max_tokens, ignore_eos, ...), as with "
            "sglang.bench_serving.",
            rich_help_panel=REQUESTS,
        ),
    ] = None,
    dataset: Annotated[
        str | None,
        typer.Option(
            help='Prompts: a file of JSONL lines {"prompt": "...", "output_tokens": N} '
            "(output_tokens optional) or a ShareGPT dump (JSON array or JSONL of "
            "conversations; the reply sets the output length); or a synthetic dataset: "
            "random-words (the default), random-ids (random token ids) or "
            "generated-shared-prefix (groups of prompts sharing a system prompt, --gsp-*).",
            rich_help_panel=PROMPTS,
        ),
    ] = None,
    prompt_tokens: Annotated[
        int,
        typer.Option(
            min=1,
            help="Prompt length of random-words and random-ids, in tokens of --tokenizer "
            "(exact), or about that without it (a word per token; the server's own count is "
            "reported).",
            rich_help_panel=PROMPTS,
        ),
    ] = 256,
    tokenizer: Annotated[
        str | None,
        typer.Option(
            help="The served model's tokenizer (its folder or tokenizer.json) to size the "
            "synthetic prompts in its tokens.",
            rich_help_panel=PROMPTS,
        ),
    ] = None,
    gsp_groups: Annotated[
        int | None,
        typer.Option(
            min=1, help="generated-shared-prefix: groups (system prompts). Default 64.",
            rich_help_panel=PROMPTS,
        ),
    ] = None,
    gsp_prompts_per_group: Annotated[
        int | None,
        typer.Option(
            min=1, help="generated-shared-prefix: prompts per group. Default 16.",
            rich_help_panel=PROMPTS,
        ),
    ] = None,
    gsp_system_tokens: Annotated[
        int | None,
        typer.Option(
            min=1, help="generated-shared-prefix: system prompt tokens. Default 2048.",
            rich_help_panel=PROMPTS,
        ),
    ] = None,
    gsp_question_tokens: Annotated[
        int | None,
        typer.Option(
            min=1, help="generated-shared-prefix: question tokens. Default 128.",
            rich_help_panel=PROMPTS,
        ),
    ] = None,
    gsp_output_tokens: Annotated[
        int | None,
        typer.Option(
            min=1, help="generated-shared-prefix: output tokens (--output-tokens wins). "
            "Default 256.",
            rich_help_panel=PROMPTS,
        ),
    ] = None,
    goodput: Annotated[
        list[str] | None,
        typer.Option(
            help="Latency SLO in ms, e.g. ttft:500,tpot:50 (keys ttft, tpot, e2el; repeat or "
            "comma-separate): adds goodput, the requests/s that met every bound.",
            rich_help_panel=REPORT,
        ),
    ] = None,
    percentiles: Annotated[
        str,
        typer.Option(
            help="Latency percentiles reported for TTFT, TPOT, ITL and E2E, beside their mean "
            "and standard deviation (comma-separated, between 0 and 100).",
            rich_help_panel=REPORT,
        ),
    ] = DEFAULT_PERCENTILES,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Folder for bench.csv, bench.json, bench.png. Default: ./bench-<time>.",
            rich_help_panel=REPORT,
        ),
    ] = None,
    client_processes: Annotated[
        int,
        typer.Option(
            min=1,
            help="Split each level's load across this many load-generator processes (its "
            "streams, or its open-loop arrivals, dealt among them), for levels that one process "
            "cannot read fast enough (flagged client-bound). 1: the load runs in this process; "
            "so does a level of fewer streams than processes.",
            rich_help_panel=CLIENT,
        ),
    ] = 1,
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
    /v1/completions (or /v1/chat/completions) at each level (N streams in flight, or requests
    arriving at a rate), and restores the server's previous table at the end (also on errors,
    Ctrl-C and SIGTERM). Each level has an unmeasured warm-up, then a measured window; it
    reports output, input and total tok/s, TTFT, TPOT, inter-token and end-to-end latency
    (mean, standard deviation and --percentiles), goodput under --goodput, the crossovers and
    the table it recommends (or, per level that cannot decide, why not). Stop the specctl
    daemon first, or it will push over the forced depths.

    \b
    Examples:
      specctl bench --url http://127.0.0.1:30000 --admin-key $KEY
      specctl bench --url http://gpu1:30000 --depths 0,1,3 \\
          --concurrency 1,4,16,64,256 --no-spec-url http://gpu1:30001 \\
          --duration-per-level 60 --warmup-per-level 10 --repeats 3 --out bench-k2
      specctl bench --url http://gpu1:30000 --request-rate 1,2,4,8 \\
          --burstiness 0.5 --max-concurrency 128 --goodput ttft:500,tpot:50 \\
          --dataset ShareGPT_V3_unfiltered_cleaned_split.json --endpoint chat
      specctl bench --url http://gpu1:30000 --api-key $API_KEY \\
          --tokenizer /models/k2 --dataset generated-shared-prefix \\
          --gsp-groups 16 --percentiles 50,99,99.9
      specctl bench --url http://gpu1:30000 --shapes 3x4x16,3x1x4 \\
          --concurrency 1,4,16,64 --out bench-shapes
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
    if endpoint not in ("completions", "chat"):
        raise typer.BadParameter(
            f"{endpoint!r}: give completions or chat", param_hint="--endpoint"
        )
    _dataset_options(dataset, {
        "--gsp-groups": gsp_groups, "--gsp-prompts-per-group": gsp_prompts_per_group,
        "--gsp-system-tokens": gsp_system_tokens, "--gsp-question-tokens": gsp_question_tokens,
        "--gsp-output-tokens": gsp_output_tokens,
    })  # fmt: skip
    held = None if shapes is None else _shape_list(shapes, {
        "--depths": depths, "--no-spec-url": no_spec_url, "--request-rate": request_rate,
        "--paired": paired or None, "--repeats": repeats if repeats > 1 else None})  # fmt: skip
    forced = None if depths is None else parse_int_list(depths, "--depths", 0, MAX_DEPTH)
    slo = _slo(goodput)
    headers = parse_headers(header)
    extra_body = _extra_body(extra_request_body)
    wanted_percentiles = _percentiles(percentiles)

    from controller.bench.loadgen import RequestStyle, StopRule
    from controller.bench.prompts import SharedPrefix
    from controller.bench.sweep import CLIENT_BOUND_SHARE, SweepPlan
    from controller.cli.bench_run import prepare_out_dir, run_bench
    from controller.cli.bench_setup import Keys, PromptChoice, build_prompts, check_servers

    default_shape = SharedPrefix()
    shared = SharedPrefix(
        gsp_groups or default_shape.groups,
        gsp_prompts_per_group or default_shape.prompts_per_group,
        gsp_system_tokens or default_shape.system_tokens,
        gsp_question_tokens or default_shape.question_tokens,
        gsp_output_tokens or default_shape.output_tokens,
    )
    chosen = build_prompts(PromptChoice(
        dataset=dataset, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
        default_output_tokens=DEFAULT_OUTPUT_TOKENS, tokenizer=tokenizer, seed=seed,
        shared=shared, endpoint=endpoint,
    ))  # fmt: skip

    if requests_per_level is not None:
        stop = StopRule(requests=requests_per_level, warmup_s=warmup_per_level)
    else:
        duration_s = duration_per_level or DEFAULT_DURATION_S
        stop = StopRule(duration_s=duration_s, warmup_s=warmup_per_level)
    # Reached before anything is written: an unreachable --url leaves no empty --out folder.
    captured = check_servers(url, no_spec_url, Keys(admin_key, api_key, headers))
    if held is not None:
        _check_held(url, held, Keys(admin_key, api_key, headers))
    if forced is None:
        forced = captured
    out_dir = out or Path(f"bench-{time.strftime('%Y%m%d-%H%M%S')}")
    # Before the first push: a sweep whose results cannot be written is time lost.
    problem = prepare_out_dir(out_dir)
    if problem is not None:
        raise fail(problem)
    plan = SweepPlan(
        url=url, depths=tuple(forced), concurrencies=levels, stop=stop, prompts=chosen.prompts,
        prompt_source=chosen.source, admin_key=admin_key, no_spec_url=no_spec_url, model=model,
        temperature=temperature, request_rates=rates, burstiness=burstiness or 1.0,
        max_concurrency=max_concurrency, slo=slo, client_processes=client_processes,
        client_bound_share=client_bound_share or CLIENT_BOUND_SHARE, freeze_gc=freeze_gc,
        paired=paired, plain_first=plain_first, flush_cache=flush_cache, seed=seed,
        api_key=api_key, headers=headers, style=RequestStyle(endpoint, extra_body),
        percentiles=wanted_percentiles, repeats=repeats, asked_prompt_tokens=chosen.asked_tokens,
        exact_prompt_size=chosen.exact,
    )  # fmt: skip
    _warn_if_more_than_cores(client_processes)
    if held is not None:
        from controller.cli.bench_shapes import run_shape_bench

        code = run_shape_bench(plan, held, out_dir)
        if code:
            raise typer.Exit(code)
        return
    code = run_bench(plan, out_dir)
    if code:
        raise typer.Exit(code)
