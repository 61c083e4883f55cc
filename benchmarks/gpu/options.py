"""The harness's options: one typed field each, with its default, its help line and the step
it belongs to; the `--tiny` preset; how options layer over a run's commands; their checks.

Options given on a command are saved in DIR/state.json; a later command of the same run
starts from them, so only `--run-dir` must be repeated. Precedence: the defaults, then the
tiny preset (when `--tiny` was given now or before), then the saved options, then this
command's. A new option is one field here (`opt(default, help, group)`) and, if its value
can be wrong, a check in `validate`.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field, fields
from typing import Any

from benchmarks.gpu.cpus import CpuListError, parse_cpu_list

GROUPS = {
    "run": "the run",
    "setup": "setup: models and servers",
    "acceptance": "acceptance: the head's accept length per family and depth",
    "check": "check: smoke test, greedy check, on/off switches",
    "load": "load: what bench and parity send",
    "bench": "bench",
    "parity": "parity: depth 0 against the plain server",
    "trace": "trace: a closed-loop load trace per policy",
    "compare": "compare: specctl bench beside SGLang's bench_serving",
    "shapes": "shapes: SGLang's static draft shapes and a plain server, one at a time",
    "daemon": "daemon",
    "treeswitch": "treeswitch: draft shapes switched inside one server",
}


def opt(default: Any, help: str, group: str) -> Any:
    """A field of `Options`: its default, its help line and its group in `--help`."""
    return field(default=default, metadata={"help": help, "group": group})


@dataclass
class Options:
    # the run
    backend: str = opt("sglang", "sglang: real SGLang servers; sim: `specctl sim serve` "
                       "stand-ins (CPU tests of the harness)", "run")
    tiny: bool = opt(False, "the tiny preset: a tiny model and short steps (minutes in all)",
                     "run")
    # setup
    models: str = opt("dummy", "dummy: configs for --load-format dummy (random weights); "
                      "seeded: the seeded pair built by benchmarks.gpu.seeded.build", "setup")
    shape: str = opt("llama8b", "target shape of dummy and seeded models: llama8b or tiny",
                     "setup")
    target: str | None = opt(None, "an existing target folder (weights, tokenizer); needs "
                             "--draft", "setup")
    draft: str | None = opt(None, "an existing EAGLE-3 head folder; needs --target", "setup")
    dataset: str | None = opt(None, "JSONL prompts for every step's load and the greedy "
                              "prompts (default: the seeded family a, or synthetic prompts)",
                              "setup")
    seeded_args: str = opt("", "extra arguments for `python -m benchmarks.gpu.seeded.build` "
                           "(one shell-quoted string)", "setup")
    seeded_timeout: float = opt(540.0, "seconds the seeded build may take", "setup")
    spec_port: int = opt(30000, "port of the speculative server", "setup")
    plain_port: int = opt(30001, "port of the plain server", "setup")
    depths: str = opt("0,1,3", "depths the speculative server captures (`specctl serve "
                      "--depths`)", "setup")
    mem_fraction_first: float = opt(0.4, "--mem-fraction-static of the server started first",
                                    "setup")
    mem_fraction_second: float = opt(0.6, "--mem-fraction-static of the server started "
                                     "second", "setup")
    spec_shapes: str = opt("", "draft shapes the speculative server switches between, a tree "
                           "among them and plain (off) if wanted (`specctl serve --shapes`, "
                           "like 3x4x16,3x1x4,plain), in place of --depths; then `trace` can "
                           "hold a tree (static:3x4x16), and off (static:0) with plain listed",
                           "setup")
    start_order: str = opt("spec,plain", "which server starts first (gets "
                           "--mem-fraction-first): spec,plain or plain,spec; spec starts the "
                           "speculative server alone (steps that need the plain server refuse)",
                           "setup")
    start_timeout: float = opt(420.0, "seconds a server may take to answer /health", "setup")
    server_args: str = opt("", "extra SGLang arguments for both servers (one shell-quoted "
                           "string, e.g. \"--sleep-on-idle --max-total-tokens 65536\")",
                           "setup")
    plain_with_plugin: bool = opt(False, "load the specctl plugin into the plain server too "
                                  "(inactive there, hooks installed); default: stock SGLang",
                                  "setup")
    spec_cpus: str = opt("", "CPU cores for the speculative server and every process it "
                         "starts, like 0-5; '' for no pinning", "setup")
    plain_cpus: str = opt("", "CPU cores for the plain server, like 6-11; '' for no pinning",
                          "setup")
    off_path: str = opt("specctl", "the speculative server's depth 0 (SPECCTL_OFF_PATH): "
                        "specctl (the plugin's own) or sglang (SGLang's own)", "setup")
    device_timer: bool = opt(False, "start both servers with SGLang's device timer "
                             "(SGLANG_ENABLE_METRICS_DEVICE_TIMER=1): GPU seconds per forward "
                             "kind in every bench level", "setup")
    setup_servers: bool = opt(True, "start both servers in setup (--no-setup-servers: the "
                              "model folders only, e.g. before the shapes step, which starts "
                              "its own)", "setup")
    sim_speedup: float = opt(1.0, "--backend sim: the stand-ins' clock speed-up", "setup")
    sim_profile: str = opt("h200-llama8b-eagle3", "--backend sim: the stand-ins' profile (the "
                           "treeswitch step's needs shapes, e.g. "
                           "benchmarks/results/shape_sim_run30.yaml)", "setup")
    # acceptance
    acceptance_depths: str = opt("1,3", "draft depths measured per prompt family",
                                 "acceptance")
    acceptance_requests: int = opt(32, "requests per family and depth", "acceptance")
    acceptance_concurrency: int = opt(8, "requests in flight", "acceptance")
    acceptance_off_spell: int = opt(64, "also the accept length after this many tokens at "
                                    "depth 0 against the same requests on all along (0: "
                                    "skip)", "acceptance")
    # check
    smoke_seconds: float = opt(4.0, "seconds per forced depth in sglang_hooks.smoke", "check")
    greedy_prompts: int = opt(4, "prompts of the greedy check", "check")
    greedy_tokens: int = opt(128, "tokens generated per greedy prompt", "check")
    greedy_interval: float = opt(0.1, "seconds between the pusher's depth switches during "
                                 "the greedy check", "check")
    greedy_switch_depths: str = opt("0,3,1", "depths the pusher cycles through during the "
                                    "greedy check", "check")
    greedy_fixed_depths: str = opt("0,3", "depths also checked with a fixed table ('' for "
                                   "none)", "check")
    switches: int = opt(1000, "depth pushes in the on/off stress", "check")
    switch_interval: float = opt(0.02, "seconds between two pushes of the stress", "check")
    switch_depths: str = opt("0,3", "off,on depths of the stress", "check")
    switch_load: int = opt(8, "/generate requests kept in flight during the stress", "check")
    switch_probe_every: int = opt(100, "pushes between two health and memory probes",
                                  "check")
    gpu_growth_limit_mib: float = opt(256.0, "GPU memory the stress may add (MiB)", "check")
    rss_growth_limit_mib: float = opt(512.0, "server RSS the stress may add (MiB)", "check")
    # load
    level_seconds: float = opt(8.0, "seconds of each bench level's measured window (bench "
                               "and parity)", "load")
    warmup_seconds: float = opt(2.0, "seconds of unmeasured load before each window", "load")
    client_processes: int = opt(4, "load-generator processes each level's streams are dealt "
                                "over (`specctl bench --client-processes`)", "load")
    bench_cpus: str = opt("", "CPU cores for the bench client and its load processes, like "
                          "12-15; '' for no pinning", "load")
    output_tokens: int = opt(128, "tokens generated per request (bench, daemon load; parity "
                             "without --output-spread)", "load")
    prompt_tokens: int = opt(256, "synthetic prompt length, where no dataset is given", "load")
    # bench
    bench_concurrency: str = opt("1,4,16,64,128", "streams of each bench level", "bench")
    bench_depths: str | None = opt(None, "depths the bench forces (default: --depths)",
                                   "bench")
    bench_families: str = opt("", "prompt families benched after the run's dataset, each "
                              "into bench_NAME/ (e.g. b: --trace-datasets' b, else the seeded "
                              "family b); the trace's bench policies still start from bench/",
                              "bench")
    # parity
    parity_series: int = opt(3, "paired series of depth 0 and the plain server this command "
                             "adds (the verdict pools every series of the run)", "parity")
    parity_streams: str = opt("1,4,16,64,128", "streams of each series' levels", "parity")
    output_spread: str = opt("64:192", "LOW:HIGH: each request's output length drawn over "
                             "that range, so requests end one by one ('' for "
                             "--output-tokens each)", "parity")
    fresh_prompts: int = opt(20000, "prompts freshly drawn from the dataset's words for each "
                             "series, so none repeats while a prefix cache holds it (0: the "
                             "dataset's own)", "parity")
    parity_order: str = opt("alternate", "which server goes first at each load: alternate "
                            "(depth 0 in odd series, plain in even ones), spec-first or "
                            "plain-first", "parity")
    parity_tag: str = opt("", "keeps these series apart from the run's others (folder "
                          "parity_TAG), e.g. after a restart with other settings", "parity")
    # trace
    trace_policies: str = opt("static:3 sglang daemon plain", "policies run one after "
                              "another: static:D, static:D+scrape (static:D while /metrics is "
                              "read as the daemon does), sglang, daemon (learns from nothing), "
                              "daemon-warm (from the daemon run's store), bench-table (the "
                              "bench's recommended table, kept), daemon-from-bench (the daemon "
                              "from that bench), plain", "trace")
    trace_repeats: int = opt(1, "runs of every policy, the order reversed in every other "
                             "repeat", "trace")
    trace_bench: str = opt("", "the bench of bench-table and daemon-from-bench (a `specctl "
                           "bench --out` folder; default: the run's bench step's)", "trace")
    trace_phases: str = opt("10:2:a,12:16:a,15:128:a,15:4:b,20:128:b,10:4:b",
                            "the trace: seconds:streams:dataset, ...", "trace")
    trace_daemon_cpus: str = opt("", "CPU cores for the trace's daemons, like 11 (default: "
                                 "the bench's, which the load processes use)", "trace")
    trace_datasets: str = opt("", "NAME=FILE,... for the trace's dataset names (default: the "
                              "seeded families a and b; without them, the run's prompts under "
                              "every name)", "trace")
    # compare
    compare_concurrency: str = opt("1,16,64", "streams of each level both clients run",
                                   "compare")
    compare_waves: int = opt(4, "requests per stream at each level", "compare")
    compare_min_requests: int = opt(16, "requests at each level, at least", "compare")
    compare_input_tokens: int = opt(256, "prompt tokens of every request (exact, in the "
                                    "server's tokenizer)", "compare")
    compare_output_tokens: int = opt(256, "output tokens of every request, EOS ignored",
                                     "compare")
    compare_depth: int | None = opt(None, "depth both clients run at (default: the largest "
                                    "the server captured)", "compare")
    compare_sglang_cmd: str = opt("", "how to run SGLang's client ('': this Python's "
                                  "-m benchmarks.gpu.sglang_client)", "compare")
    # treeswitch
    switch_shapes: str = opt("3x4x16,3x1x4", "the shape server's shapes: it starts at the one "
                             "that dominates (a tree) and captures the others, plain (off) "
                             "among them if listed, like 3x4x16,3x1x4,plain", "treeswitch")
    switch_streams: str = opt("1,16,64", "streams of each held shape's bench levels",
                              "treeswitch")
    switch_bench_shapes: str = opt("3x1x4", "stock servers benched beside the held shapes "
                                   "('' for none)", "treeswitch")
    switch_greedy_prompts: int = opt(8, "prompts of each greedy pass (batch 1)", "treeswitch")
    switch_greedy_switches: int = opt(1000, "greedy passes while the shapes switch at random "
                                      "go on until this many switches (40 passes at most)",
                                      "treeswitch")
    switch_stress_streams: int = opt(16, "streams kept in flight while the shapes switch at "
                                     "random", "treeswitch")
    switch_stress_seconds: float = opt(60.0, "seconds of that load", "treeswitch")
    switch_greedy_only: bool = opt(False, "the greedy passes alone: no held benches, table, "
                                   "stress or stock servers", "treeswitch")
    switch_reference: str = opt("", "the plain server's greedy outputs from an earlier run of "
                                "the same models, prompts and tokens (its treeswitch/"
                                "reference.json), in place of starting a plain server",
                                "treeswitch")
    switch_keep_server: bool = opt(False, "leave the shape server up at the step's end as the "
                                   "run's speculative server, for a `trace` step after it "
                                   "(one server start fewer; needs --switch-reference and "
                                   "--switch-bench-shapes '')", "treeswitch")
    # shapes
    shapes: str = opt("3x1x4,3x4x16,5x8x32,4x2x8,plain,1x1x2,5x1x6", "draft "
                      "shapes STEPSxTOPKxDRAFT (topk 1: a chain) and plain, each benched on its "
                      "own server in this order (a command cut by its --budget leaves the last)",
                      "shapes")
    shape_streams: str = opt("1,4,16,64,128,256", "streams of each shape's levels (the largest "
                             "is also the servers' request cap and largest CUDA graph)",
                             "shapes")
    shape_families: str = opt("", "prompt families benched, like a,b (default: every family "
                              "of the seeded build, or the run's prompts)", "shapes")
    shape_output_spread: str = opt("128:384", "LOW:HIGH: each request's output length, "
                                   "drawn once per family ('' for --output-tokens)", "shapes")
    shape_attention_backend: str = opt("fa3", "--attention-backend of every shape's server "
                                       "('' lets SGLang pick: FlashInfer for trees on Hopper)",
                                       "shapes")
    shape_fallback_backend: str = opt("flashinfer", "a tree whose server does not start on "
                                      "--shape-attention-backend is tried on this one (with a "
                                      "2 GiB FlashInfer workspace); '' for no second try",
                                      "shapes")
    shape_mem_fraction: float = opt(0.8, "--mem-fraction-static of each shape's server (it "
                                    "has the GPU alone)", "shapes")
    shape_kv_tokens: int = opt(196608, "--max-total-tokens of each shape's server: the same "
                               "KV pool for every shape, 768 tokens a request at 256 streams",
                               "shapes")
    # daemon
    daemon_seconds: float = opt(90.0, "seconds of the daemon run", "daemon")
    daemon_concurrency: str = opt("4,64", "load levels cycled during the daemon run",
                                  "daemon")
    daemon_segment: float = opt(15.0, "seconds per daemon load level", "daemon")


TINY_PRESET: dict[str, Any] = {
    "shape": "tiny",
    "start_timeout": 300.0,
    "greedy_tokens": 64,
    "greedy_fixed_depths": "3",
    "switches": 200,
    "switch_probe_every": 50,
    "level_seconds": 2.0,
    "warmup_seconds": 0.5,
    "output_tokens": 32,
    "prompt_tokens": 64,
    "bench_concurrency": "1,16,128",
    "bench_depths": "0,3",
    "acceptance_requests": 16,
    "acceptance_off_spell": 16,
    "parity_streams": "1,16,128",
    "output_spread": "16:48",
    "fresh_prompts": 2000,
    "trace_phases": "4:2:a,4:16:a,4:4:b",
    "compare_concurrency": "1,4",
    "compare_waves": 2,
    "compare_min_requests": 4,
    "compare_input_tokens": 24,
    "compare_output_tokens": 8,
    "shapes": "plain,3x1x4,2x2x4",
    "shape_streams": "1,8",
    "shape_output_spread": "16:48",
    "shape_kv_tokens": 16384,
    "daemon_seconds": 25.0,
    "daemon_segment": 5.0,
}


class OptionError(ValueError):
    """An option value is unusable; the message names the option and the fix."""


def option_names() -> list[str]:
    return [f.name for f in fields(Options)]


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    groups = {key: parser.add_argument_group(title) for key, title in GROUPS.items()}
    for f in fields(Options):
        group = groups[f.metadata["group"]]
        helptext = f"{f.metadata['help']} (default: {f.default!r})"
        type_name = str(f.type)  # a string: this module postpones annotations
        if type_name == "bool":
            group.add_argument(flag(f.name), dest=f.name, action=argparse.BooleanOptionalAction,
                               default=argparse.SUPPRESS, help=helptext)
            continue
        kind: type = {"int": int, "float": float}.get(type_name, str)
        group.add_argument(flag(f.name), dest=f.name, type=kind, default=argparse.SUPPRESS,
                           metavar=f.name.split("_")[-1].upper(), help=helptext)


def resolve(saved: dict[str, Any], explicit: dict[str, Any]) -> Options:
    known = set(option_names())
    saved = {k: v for k, v in saved.items() if k in known}
    tiny = bool(explicit.get("tiny", saved.get("tiny", False)))
    merged = {**dataclasses.asdict(Options()), **(TINY_PRESET if tiny else {}), **saved,
              **explicit}
    return Options(**merged)


def int_list(text: str, option: str, minimum: int = 0) -> tuple[int, ...]:
    try:
        values = tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise OptionError(f"--{option}: expected comma-separated integers like 0,1,3, got "
                          f"{text!r}") from None
    if any(v < minimum for v in values):
        raise OptionError(f"--{option}: every value must be >= {minimum}, got {text!r}")
    return values


def output_span(text: str, option: str = "--output-spread") -> tuple[int, int] | None:
    """LOW:HIGH (--output-spread, or the `option` named) as (LOW, HIGH); None for ''."""
    if not text:
        return None
    low, sep, high = text.partition(":")
    try:
        span = int(low), int(high) if sep else int(low)
    except ValueError:
        span = (0, -1)
    if not 1 <= span[0] <= span[1]:
        raise OptionError(f"{option}: expected LOW:HIGH with 1 <= LOW <= HIGH, like "
                          f"64:192 ('' for none), got {text!r}")
    return span


def trace_datasets(text: str) -> dict[str, str]:
    """--trace-datasets NAME=FILE,... as {name: file}."""
    out: dict[str, str] = {}
    for item in (p.strip() for p in text.split(",") if p.strip()):
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise OptionError(f"--trace-datasets: write NAME=FILE,..., e.g. a=fa.jsonl,"
                              f"b=fb.jsonl; got {item!r}")
        out[name] = path
    return out


# The trace step's own policy names, as the trace runner's policies they run.
HARNESS_POLICIES = {"daemon-warm": "daemon", "daemon-from-bench": "daemon",
                    "bench-table": "table"}


def _trace_checks(opts: Options, captured: set[int]) -> None:
    from benchmarks.gpu.seeded.trace import TraceError, parse_phases, parse_policy
    from sglang_hooks.draft_shape import DraftShape, ShapeError, chain, label, parse_shapes

    try:
        phases = parse_phases(opts.trace_phases)
        policies = opts.trace_policies.split()
        if not policies:
            raise TraceError("--trace-policies: give at least one policy, e.g. static:3")
        for name in policies:
            _, held = parse_policy(HARNESS_POLICIES.get(name, name))
            if held is None:
                continue
            if opts.spec_shapes:  # a shape server runs the listed shapes, chains and trees
                listed = {label(s) for s in parse_shapes(opts.spec_shapes)}
                # static:0 is off: `plain` in the list
                text = held.label if isinstance(held, DraftShape) else label(chain(held))
                if text not in listed:
                    raise TraceError(f"--trace-policies: {name} needs {text} in --spec-shapes "
                                     f"{opts.spec_shapes}")
            elif isinstance(held, DraftShape):
                raise TraceError(f"--trace-policies: {name} needs a shape server: list the "
                                 "tree in --spec-shapes")
            elif held not in captured:
                raise TraceError(f"--trace-policies: static:{held} needs depth {held} in "
                                 f"--depths {opts.depths}")
    except (TraceError, ShapeError) as err:
        raise OptionError(str(err).replace("--phases", "--trace-phases")
                          .replace("--policy", "--trace-policies")) from None
    names = trace_datasets(opts.trace_datasets)
    missing = sorted({p.dataset for p in phases} - set(names)) if names else []
    if missing:
        raise OptionError(f"--trace-datasets: the trace uses dataset {missing[0]!r}: name a "
                          "file for it")


def _spec_shape_checks(opts: Options) -> None:
    """--spec-shapes: a list `specctl serve --shapes` takes (on the stand-ins, `specctl sim
    serve --shapes`, which the --sim-profile's shapes bound when it starts)."""
    from sglang_hooks.draft_shape import ShapeError, parse_shapes
    from sglang_hooks.shape_launch import shape_launch

    try:
        shape_launch(parse_shapes(opts.spec_shapes), ["--speculative-algorithm", "EAGLE3"])
    except ShapeError as err:
        raise OptionError(f"--spec-shapes: {err}") from None


def _kept_shape_checks(opts: Options) -> None:
    """The kept shape server is the trace's speculative server: its shapes (--switch-shapes)
    are those the trace's policies are checked against (--spec-shapes)."""
    from sglang_hooks.draft_shape import ShapeError, label, parse_shapes

    try:
        kept = {label(s) for s in parse_shapes(opts.switch_shapes)}
    except ShapeError as err:
        raise OptionError(f"--switch-shapes: {err}") from None
    if kept != {label(s) for s in parse_shapes(opts.spec_shapes)}:
        raise OptionError(f"--switch-keep-server: the kept server runs --switch-shapes "
                          f"{opts.switch_shapes}, which --spec-shapes {opts.spec_shapes} must "
                          f"list alike (the trace's policies are checked against it)")


def _shape_checks(opts: Options) -> None:
    from benchmarks.gpu.draft_shapes import ShapeError, parse_shapes

    try:
        parse_shapes(opts.shapes)
    except ShapeError as err:
        raise OptionError(f"--shapes: {err}") from None
    if not int_list(opts.shape_streams, "shape-streams", minimum=1):
        raise OptionError("--shape-streams: give at least one value")
    if not 0 < opts.shape_mem_fraction < 1:
        raise OptionError(f"--shape-mem-fraction: a share of GPU memory between 0 and 1, got "
                          f"{opts.shape_mem_fraction:g}")
    if opts.shape_kv_tokens < 1:
        raise OptionError(f"--shape-kv-tokens: must be >= 1, got {opts.shape_kv_tokens}")


def validate(opts: Options) -> None:
    """Refuse contradictory or malformed options before anything starts."""
    choices = {"backend": ("sglang", "sim"), "models": ("dummy", "seeded"),
               "shape": ("llama8b", "tiny"), "start_order": ("spec,plain", "plain,spec", "spec"),
               "off_path": ("specctl", "sglang"),
               "parity_order": ("alternate", "spec-first", "plain-first")}
    for name, allowed in choices.items():
        if getattr(opts, name) not in allowed:
            raise OptionError(f"{flag(name)}: expected {' or '.join(allowed)}, got "
                              f"{getattr(opts, name)!r}")
    if (opts.target is None) != (opts.draft is None):
        raise OptionError("--target and --draft go together: give both folders, or neither")
    if opts.target is not None and opts.models == "seeded":
        raise OptionError("--models seeded builds its own folders: drop --target/--draft, or "
                          "pass the seeded folders as --target/--draft without --models")
    if opts.spec_shapes:
        _spec_shape_checks(opts)
    for name in ("spec_cpus", "plain_cpus", "bench_cpus", "trace_daemon_cpus"):
        if getattr(opts, name):
            try:
                parse_cpu_list(getattr(opts, name), name.replace("_", "-"))
            except CpuListError as err:
                raise OptionError(str(err)) from None
    for name in ("depths", "greedy_switch_depths", "switch_depths", "bench_concurrency",
                 "daemon_concurrency", "parity_streams", "acceptance_depths",
                 "compare_concurrency"):
        if not int_list(getattr(opts, name), name.replace("_", "-")):
            raise OptionError(f"{flag(name)}: give at least one value")
    for name in ("bench_concurrency", "daemon_concurrency", "parity_streams",
                 "acceptance_depths", "compare_concurrency"):
        int_list(getattr(opts, name), name.replace("_", "-"), minimum=1)
    int_list(opts.greedy_fixed_depths, "greedy-fixed-depths")
    if len(int_list(opts.switch_depths, "switch-depths")) != 2:
        raise OptionError(f"--switch-depths: expected two depths (off,on) like 0,3, got "
                          f"{opts.switch_depths!r}")
    captured = set(int_list(opts.depths, "depths"))
    for name in ("greedy_switch_depths", "greedy_fixed_depths", "switch_depths",
                 "acceptance_depths", "bench_depths"):
        value = getattr(opts, name)
        extra = set() if value is None else set(int_list(value, name.replace("_", "-"))) - captured
        if extra:
            raise OptionError(f"{flag(name)}: depth {sorted(extra)[0]} is not in --depths "
                              f"{opts.depths}; the server only runs captured depths")
    if opts.compare_depth is not None and opts.compare_depth not in captured:
        raise OptionError(f"--compare-depth: depth {opts.compare_depth} is not in --depths "
                          f"{opts.depths}; the server only runs captured depths")
    if opts.compare_input_tokens < 2 or opts.compare_output_tokens < 4:
        raise OptionError("--compare-input-tokens must be >= 2 and --compare-output-tokens "
                          ">= 4 (SGLang's custom dataset refuses shorter outputs)")
    if 0 not in captured:
        raise OptionError(f"--depths: include 0 (off): the checks, parity and the daemon "
                          f"need it, got {opts.depths!r}")
    for name in ("mem_fraction_first", "mem_fraction_second"):
        value = getattr(opts, name)
        if not 0 < value < 1:
            raise OptionError(f"{flag(name)}: a share of free GPU memory between 0 and 1, "
                              f"got {value:g}")
    for name in ("greedy_prompts", "greedy_tokens", "switches", "switch_load",
                 "switch_probe_every", "output_tokens", "prompt_tokens", "client_processes",
                 "parity_series", "acceptance_requests", "acceptance_concurrency",
                 "compare_waves", "compare_min_requests", "trace_repeats"):
        if getattr(opts, name) < 1:
            raise OptionError(f"{flag(name)}: must be >= 1, got {getattr(opts, name)}")
    for name in ("fresh_prompts", "acceptance_off_spell", "warmup_seconds"):
        if getattr(opts, name) < 0:
            raise OptionError(f"{flag(name)}: must be >= 0, got {getattr(opts, name)}")
    for name in ("level_seconds", "daemon_seconds", "daemon_segment", "smoke_seconds",
                 "start_timeout", "sim_speedup", "seeded_timeout", "switch_interval",
                 "greedy_interval"):
        if getattr(opts, name) <= 0:
            raise OptionError(f"{flag(name)}: must be > 0, got {getattr(opts, name):g}")
    if opts.parity_tag and not opts.parity_tag.replace("-", "").replace("_", "").isalnum():
        raise OptionError(f"--parity-tag: letters, digits, - and _ only (it names a folder), "
                          f"got {opts.parity_tag!r}")
    if opts.switch_keep_server and (not opts.switch_reference or opts.switch_bench_shapes):
        # the kept server holds the GPU: no plain or stock server can start beside it
        raise OptionError("--switch-keep-server starts no other server after the shape "
                          "server: give --switch-reference FILE and --switch-bench-shapes ''")
    if opts.switch_keep_server and opts.spec_shapes:
        _kept_shape_checks(opts)
    output_span(opts.output_spread)
    output_span(opts.shape_output_spread, "--shape-output-spread")
    _shape_checks(opts)
    _trace_checks(opts, captured)
