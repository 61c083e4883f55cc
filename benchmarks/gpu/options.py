"""The harness's options: defaults for the full 8B run, the `--tiny` preset, and layering.

Options given on a command are saved in DIR/state.json; a later command of the same run
starts from them, so only `--run-dir` must be repeated. Precedence: the defaults, then the
tiny preset (when `--tiny` was given now or before), then the saved options, then this
command's.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, fields
from typing import Any

from benchmarks.gpu.cpus import CpuListError, parse_cpu_list

PHASES = ("models", "start", "smoke", "greedy", "switch", "bench", "daemon", "summary", "stop")
SERVER_PHASES = ("smoke", "greedy", "switch", "bench", "daemon")


@dataclass
class Options:
    backend: str = "sglang"
    models: str = "dummy"
    shape: str = "llama8b"
    target: str | None = None
    draft: str | None = None
    dataset: str | None = None
    seeded_args: str = ""
    seeded_timeout: float = 540.0
    tiny: bool = False
    spec_port: int = 30000
    plain_port: int = 30001
    depths: str = "0,1,2,3"
    mem_fraction_first: float = 0.4
    mem_fraction_second: float = 0.6
    start_order: str = "spec,plain"
    start_timeout: float = 420.0
    server_args: str = ""
    plain_with_plugin: bool = False
    spec_cpus: str = ""
    plain_cpus: str = ""
    sim_speedup: float = 1.0
    smoke_seconds: float = 15.0
    greedy_prompts: int = 8
    greedy_tokens: int = 256
    greedy_interval: float = 0.1
    greedy_switch_depths: str = "0,3,1"
    greedy_fixed_depths: str = "0,3"
    switches: int = 1000
    switch_interval: float = 0.05
    switch_depths: str = "0,3"
    switch_load: int = 8
    switch_probe_every: int = 100
    gpu_growth_limit_mib: float = 256.0
    rss_growth_limit_mib: float = 512.0
    bench_concurrency: str = "1,4,16,64,128"
    bench_depths: str | None = None  # default: --depths
    bench_duration: float = 10.0
    output_tokens: int = 128
    prompt_tokens: int = 256
    daemon_seconds: float = 90.0
    daemon_concurrency: str = "4,64"
    daemon_segment: float = 15.0


TINY_PRESET: dict[str, Any] = {
    "shape": "tiny",
    "start_timeout": 300.0,
    "smoke_seconds": 4.0,
    "greedy_prompts": 4,
    "greedy_tokens": 64,
    "greedy_fixed_depths": "3",
    "switches": 200,
    "switch_interval": 0.02,
    "switch_probe_every": 50,
    "bench_concurrency": "1,16,128",
    "bench_depths": "0,3",
    "bench_duration": 2.0,
    "output_tokens": 32,
    "prompt_tokens": 64,
    "daemon_seconds": 25.0,
    "daemon_segment": 5.0,
}

HELP = {
    "backend": "sglang: real servers; sim: `specctl sim serve` stand-ins (CPU tests)",
    "models": "dummy: write configs for --load-format dummy; seeded: call the seeded builder",
    "shape": "dummy target shape: llama8b or tiny",
    "target": "an existing target folder (weights, tokenizer); needs --draft",
    "draft": "an existing EAGLE-3 head folder; needs --target",
    "dataset": "JSONL prompts for bench, daemon load and greedy prompts",
    "seeded_args": "extra arguments for `python -m benchmarks.gpu.seeded.build` (one "
                   "shell-quoted string)",
    "tiny": "the tiny preset: a tiny model and short phases (about 3 minutes in all)",
    "server_args": "extra SGLang arguments for both servers (one shell-quoted string)",
    "plain_with_plugin": "load the specctl plugin into the plain server too (inactive there, "
                         "hooks installed; runs 1-13 did); default: no plugin, stock SGLang",
    "spec_cpus": "CPU cores for the speculative server and every process it starts, like "
                 "0-5 (benchmarks/gpu/cpus.py); '' for no pinning",
    "plain_cpus": "CPU cores for the plain server, like 6-11; '' for no pinning",
    "start_order": "which server starts first (gets --mem-fraction-first): spec,plain or "
                   "plain,spec",
    "smoke_seconds": "seconds per forced depth in sglang_hooks.smoke",
    "greedy_switch_depths": "depths the pusher cycles through during the greedy check",
    "greedy_fixed_depths": "depths also checked with a fixed table ('' for none)",
    "switches": "pushes in the on/off stress",
    "switch_depths": "off,on depths of the stress",
    "switch_load": "/generate requests kept in flight during the stress",
    "bench_depths": "depths the bench forces (default: --depths)",
    "bench_duration": "seconds per bench level",
    "output_tokens": "tokens generated per bench/daemon request",
    "daemon_concurrency": "load levels cycled during the daemon run",
    "daemon_segment": "seconds per daemon load level",
}


def option_names() -> list[str]:
    return [f.name for f in fields(Options)]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for f in fields(Options):
        flag = "--" + f.name.replace("_", "-")
        default = Options.__dataclass_fields__[f.name].default
        helptext = HELP.get(f.name, "") + f" (default: {default!r})"
        type_name = str(f.type)  # a string: this module postpones annotations
        if type_name == "bool":
            parser.add_argument(flag, dest=f.name, action="store_true",
                                default=argparse.SUPPRESS, help=helptext)
            continue
        kind: type = {"int": int, "float": float}.get(type_name, str)
        parser.add_argument(flag, dest=f.name, type=kind, default=argparse.SUPPRESS,
                            help=helptext)


def resolve(saved: dict[str, Any], explicit: dict[str, Any]) -> Options:
    known = set(option_names())
    saved = {k: v for k, v in saved.items() if k in known}
    tiny = bool(explicit.get("tiny", saved.get("tiny", False)))
    merged = {**dataclasses.asdict(Options()), **(TINY_PRESET if tiny else {}), **saved,
              **explicit}
    return Options(**merged)


class OptionError(ValueError):
    """An option value is unusable; the message names the option and the fix."""


def int_list(text: str, option: str, minimum: int = 0) -> tuple[int, ...]:
    try:
        values = tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise OptionError(f"--{option}: expected comma-separated integers like 0,1,3, got "
                          f"{text!r}") from None
    if any(v < minimum for v in values):
        raise OptionError(f"--{option}: every value must be >= {minimum}, got {text!r}")
    return values


def validate(opts: Options) -> None:
    """Refuse contradictory or malformed options before anything starts."""
    if opts.backend not in ("sglang", "sim"):
        raise OptionError(f"--backend: expected sglang or sim, got {opts.backend!r}")
    if opts.models not in ("dummy", "seeded"):
        raise OptionError(f"--models: expected dummy or seeded, got {opts.models!r}")
    if (opts.target is None) != (opts.draft is None):
        raise OptionError("--target and --draft go together: give both folders, or neither")
    if opts.target is not None and opts.models == "seeded":
        raise OptionError("--models seeded builds its own folders: drop --target/--draft, or "
                          "pass the seeded folders as --target/--draft without --models")
    if opts.shape not in ("llama8b", "tiny"):
        raise OptionError(f"--shape: expected llama8b or tiny, got {opts.shape!r}")
    if opts.start_order not in ("spec,plain", "plain,spec"):
        raise OptionError(f"--start-order: expected spec,plain or plain,spec, got "
                          f"{opts.start_order!r}")
    for name in ("spec_cpus", "plain_cpus"):
        if getattr(opts, name):
            try:
                parse_cpu_list(getattr(opts, name), name.replace("_", "-"))
            except CpuListError as err:
                raise OptionError(str(err)) from None
    for name in ("depths", "greedy_switch_depths", "switch_depths", "bench_concurrency",
                 "daemon_concurrency"):
        if not int_list(getattr(opts, name), name.replace("_", "-")):
            raise OptionError(f"--{name.replace('_', '-')}: give at least one value")
    int_list(opts.greedy_fixed_depths, "greedy-fixed-depths")
    if opts.bench_depths is not None:
        int_list(opts.bench_depths, "bench-depths")
    if len(int_list(opts.switch_depths, "switch-depths")) != 2:
        raise OptionError(f"--switch-depths: expected two depths (off,on) like 0,3, got "
                          f"{opts.switch_depths!r}")
    captured = set(int_list(opts.depths, "depths"))
    for name in ("greedy_switch_depths", "greedy_fixed_depths", "switch_depths"):
        extra = set(int_list(getattr(opts, name), name)) - captured
        if extra:
            raise OptionError(f"--{name.replace('_', '-')}: depth {sorted(extra)[0]} is not in "
                              f"--depths {opts.depths}; the server only runs captured depths")
    for name in ("mem_fraction_first", "mem_fraction_second"):
        value = getattr(opts, name)
        if not 0 < value < 1:
            raise OptionError(f"--{name.replace('_', '-')}: a share of free GPU memory "
                              f"between 0 and 1, got {value:g}")
    for name in ("greedy_prompts", "greedy_tokens", "switches", "switch_load",
                 "switch_probe_every", "output_tokens", "prompt_tokens"):
        if getattr(opts, name) < 1:
            raise OptionError(f"--{name.replace('_', '-')}: must be >= 1")
    for name in ("bench_duration", "daemon_seconds", "daemon_segment", "smoke_seconds",
                 "start_timeout", "sim_speedup", "seeded_timeout"):
        if getattr(opts, name) <= 0:
            raise OptionError(f"--{name.replace('_', '-')}: must be > 0")
