"""What `specctl serve` adds to an SGLang command line (pure functions, tested without SGLang).

The plugin steers depth only among depths SGLang captured at start-up, and a depth is usable
at every batch size only if every batch-size slot of the adaptive config lists it (SGLang
captures CUDA graphs per slot candidate). So the launch writes a one-slot config listing every
allowed depth.

It sets no plugin variable: the plugin runs the same hooks whether `specctl serve` started the
server or SGLANG_PLUGINS alone loaded it (sglang_hooks/settings.py lists what it reads).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

DEFAULT_DEPTHS = (0, 1, 2, 3, 4, 5)
DEFAULT_PORT = 30000
# SGLang 0.5.17-0.5.23 cap a server without speculation at, per DP worker,
#   min(clamp(512 * kv_tokens / context_len, 2048, 4096), kv_tokens // 2)
# (KVCacheConfigurator.resolve_max_num_reqs), but lower a speculative one to 48 when the flag is
# absent (arg_groups/speculative_hook.py). An explicit value is capped by the same
# kv_tokens // 2, so passing the estimate's ceiling gives the speculative server the plain
# server's cap whenever the KV pool holds at least 8 full contexts (512 * kv / ctx >= 4096).
PLAIN_REQUEST_CAP = 4096


def adaptive_config(depths: Sequence[int]) -> dict[str, Any]:
    """An adaptive config with one slot (batch size 1 and up) that captures every depth."""
    steps = sorted(set(int(d) for d in depths))
    if not steps or steps[0] < 0:
        raise ValueError(f"depths must be non-negative integers, got {list(depths)}")
    return {"1": {"candidate_steps": steps}}


def user_config(sglang_args: Sequence[str]) -> str | None:
    """The user's own --speculative-adaptive-config, if the SGLang arguments carry one."""
    return flag_value(sglang_args, "--speculative-adaptive-config")


def config_depths(path: Path) -> tuple[int, ...]:
    """Depths a table may use under an adaptive config: those listed in every batch-size slot
    (SGLang's digit keys). Raises ValueError naming the file if it cannot be read."""
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise ValueError(f"--speculative-adaptive-config {path}: cannot read it "
                         f"({err.strerror or err})") from None
    except ValueError as err:
        raise ValueError(f"--speculative-adaptive-config {path}: not valid JSON ({err})") from None
    slots = [v for k, v in cfg.items() if str(k).isdigit()] if isinstance(cfg, dict) else []
    steps: list[list[Any]] = [
        v["candidate_steps"]
        for v in slots
        if isinstance(v, dict) and isinstance(v.get("candidate_steps"), list)
    ]
    if not steps or len(steps) != len(slots) or not all(steps):
        raise ValueError(f"--speculative-adaptive-config {path}: expected batch-size slots like "
                         '{"1": {"candidate_steps": [0, 1, 3]}}')
    common = set(steps[0]).intersection(*steps[1:])
    return tuple(sorted(d for d in common if isinstance(d, int)))


def node_count(sglang_args: Sequence[str]) -> int:
    """SGLang's --nnodes (1 when absent or unreadable: SGLang reports a bad value itself)."""
    try:
        return max(1, int(flag_value(sglang_args, "--nnodes") or 1))
    except ValueError:
        return 1


def has_flag(args: Sequence[str], flag: str) -> bool:
    """Whether `flag` is among these arguments, alone or as `flag=value`."""
    return any(a == flag or a.startswith(flag + "=") for a in args)


def flag_value(args: Sequence[str], flag: str) -> str | None:
    """The value of `flag` in these arguments (`flag v` or `flag=v`), or None."""
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def build_command(
    sglang_args: Sequence[str], config_path: Path | None, python: str = "python3",
    current_env: Mapping[str, str] | None = None,
) -> tuple[list[str], dict[str, str], list[str]]:
    """(argv, extra environment, notes for the user) for launching SGLang with the plugin.

    `config_path` is the adaptive config of a depth server; None launches a shape server,
    which runs without SGLang's adaptive mode (its size flags are in `sglang_args`).
    `current_env` is the environment the server would inherit: its SGLANG_PLUGINS is extended
    (the only variable the launch sets)."""
    current_env = {} if current_env is None else current_env
    args = list(sglang_args)
    notes: list[str] = []
    if not has_flag(args, "--speculative-algorithm"):
        raise ValueError("add --speculative-algorithm EAGLE3 (or EAGLE) and its draft model: "
                         "specctl steers speculative decoding")
    if config_path is not None:
        if has_flag(args, "--speculative-adaptive-config"):
            notes.append("kept your --speculative-adaptive-config: only depths listed in every "
                         "slot can be pushed")
        else:
            args += ["--speculative-adaptive-config", str(config_path)]
        if not has_flag(args, "--speculative-adaptive"):
            args.append("--speculative-adaptive")
    if not has_flag(args, "--enable-metrics"):
        args.append("--enable-metrics")
    if not has_flag(args, "--max-running-requests"):
        args += ["--max-running-requests", str(PLAIN_REQUEST_CAP)]
        notes.append(request_cap_note())
    notes += _cuda_graph_notes(args)
    argv = [python, "-m", "sglang.launch_server", *args]
    env = plugins_env(current_env.get(PLUGINS_ENV))
    return argv, env, notes


def request_cap_note() -> str:
    return (f"added --max-running-requests {PLAIN_REQUEST_CAP}: SGLang lowers the request cap "
            f"to 48 when speculation is on; {PLAIN_REQUEST_CAP} is the cap of a server without "
            f"speculation (SGLang caps both at half the KV pool's tokens; the plain server stays "
            f"lower only when its KV pool holds fewer than 8 full contexts); pass "
            f"--max-running-requests to choose")


# Flags that size the decode CUDA graphs. The short spellings are 0.5.17's deprecated aliases;
# SGLang 0.5.23 no longer has them and argparse refuses them as ambiguous prefixes of the
# -decode/-prefill pair.
DECODE_GRAPH_FLAGS = ("--cuda-graph-max-bs-decode", "--cuda-graph-bs-decode",
                      "--cuda-graph-config")
_LEGACY_GRAPH_FLAGS = {"--cuda-graph-max-bs": "--cuda-graph-max-bs-decode",
                       "--cuda-graph-bs": "--cuda-graph-bs-decode"}


def chooses_decode_graph_sizes(args: Sequence[str]) -> bool:
    """Whether these SGLang arguments size the decode CUDA graphs (a legacy spelling counts)."""
    return any(has_flag(args, f) for f in (*DECODE_GRAPH_FLAGS, *_LEGACY_GRAPH_FLAGS))


def _cuda_graph_notes(args: Sequence[str]) -> list[str]:
    notes = [f"{old} is a deprecated alias in SGLang 0.5.17 and refused as ambiguous by 0.5.23: "
             f"use {new}" for old, new in _LEGACY_GRAPH_FLAGS.items() if has_flag(args, old)]
    if not notes and not chooses_decode_graph_sizes(args):
        notes.append("set --cuda-graph-max-bs-decode to at least the batch sizes you serve: "
                     "above it decode runs without CUDA graphs at every depth")
    return notes


PLUGINS_ENV = "SGLANG_PLUGINS"
PLUGIN_NAME = "specctl"


def plugins_env(current: str | None) -> dict[str, str]:
    """SGLANG_PLUGINS for the launch, given the value already in the environment.

    SGLang loads every installed plugin when the variable is unset or blank (specctl
    included), and only the listed ones otherwise: a list gets specctl appended, never
    replaced, so the user's other plugins keep loading.
    """
    names = [n.strip() for n in (current or "").split(",") if n.strip()]
    if not names or PLUGIN_NAME in names:
        return {}
    return {PLUGINS_ENV: ",".join([*names, PLUGIN_NAME])}


def check_num_steps(sglang_args: Sequence[str], depths: Sequence[int]) -> None:
    """SGLang refuses to start when --speculative-num-steps is not a captured depth; say so
    before launching. Raises ValueError naming both flags."""
    value = flag_value(sglang_args, "--speculative-num-steps")
    if value is None:
        return
    try:
        steps = int(value)
    except ValueError:
        raise ValueError(f"--speculative-num-steps {value!r}: expected an integer") from None
    if steps not in depths:
        raise ValueError(f"--speculative-num-steps {steps} is not one of --depths "
                         f"{sorted(set(depths))}: SGLang refuses to start when the initial depth "
                         f"is not captured; add {steps} to --depths or pick one of them")


def admin_url(sglang_args: Sequence[str]) -> str:
    host = flag_value(sglang_args, "--host") or "127.0.0.1"
    host = "127.0.0.1" if host in ("0.0.0.0", "::") else host
    port = flag_value(sglang_args, "--port") or str(DEFAULT_PORT)
    return f"http://{host}:{port}"


def render(argv: Sequence[str], env: dict[str, str]) -> str:
    prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    return f"{prefix} {shlex.join(argv)}".strip()


def write_config(path: Path, depths: Sequence[int]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(adaptive_config(depths), indent=2) + "\n", encoding="utf-8")
    return path
