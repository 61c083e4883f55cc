"""Start and stop the two servers of a run: speculative (`specctl serve`) and plain.

Each server runs in its own process session (setsid) with its output appended to a log file,
so it outlives the command that started it: a later command of the run finds it by the pid
and URL in state.json. `backend="sim"` starts `specctl sim serve` instead of SGLang, for
the CPU tests of the harness; everything downstream talks to both the same way.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from benchmarks.gpu.cpus import pinned_argv
from benchmarks.gpu.draft_shapes import Shape, label
from benchmarks.gpu.model_folders import ModelFolders
from benchmarks.gpu.procs import pid_alive, session_pids
from sglang_hooks.launch import chooses_decode_graph_sizes, has_flag

SPEC, PLAIN = "spec", "plain"
# What the seeded 8B runs needed (docs/sglang.md, "GPU end-to-end harness").
COMMON_SGLANG_FLAGS = (
    "--sampling-backend", "pytorch", "--context-length", "4096",
    "--max-running-requests", "128", "--cuda-graph-max-bs-decode", "128", "--enable-metrics",
)  # fmt: skip
# The decode CUDA graphs' batch sizes, one list for both servers. SGLang 0.5.17 picks a finer
# default for a speculative server (1-8, every 2 to 32, every 4 to 64, then every 8) than for
# a plain one (1, 2, 4, 8, 12, then every 8); a batch between two sizes is padded up to the
# next, so with the defaults the plain server pads more at some loads (60 requests: 64 rows
# against 60), and depth 0's DECODE graphs take the speculative list. Both servers get the
# speculative default up to 128, so that neither pads more than the other.
SHARED_DECODE_GRAPH_BS = (*range(1, 9), *range(10, 33, 2), *range(40, 65, 4), *range(72, 129, 8))
# The KV pool's size in tokens, one cap for both servers. Each sizes its pool from its share of
# GPU memory (0.4 and 0.6 of the card's), and the speculative server's came out larger (305,491
# tokens against 265,545 in the twenty-sixth run). Under a closed loop both pools fill with
# cached prefixes, and SGLang 0.5.17's eviction heaps every evictable leaf on each call, so a
# larger pool holds more leaves to heap: a confounder at 64-128 streams, where depth 0's
# evictions took 0.43 ms a pass against the plain server's 0.39. SGLang lowers a cap above
# what fits to what fits (with a warning in the log), so a server that cannot hold this many
# tokens keeps its own: the setup step then warns that the pools differ and names the cap
# that evens them (an 80 GB card's shares hold fewer; the twenty-seventh run passed 65,536).
SHARED_KV_TOKENS = 262_144
KV_TOKENS_FLAG = "--max-total-tokens"
EAGLE3_FLAGS = (
    "--speculative-algorithm", "EAGLE3", "--speculative-eagle-topk", "1",
    "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "4",
)  # fmt: skip


# SGLang loads only the plugins SGLANG_PLUGINS names, when it is set: a name no plugin has
# leaves the plain server stock SGLang, the baseline "without speculation" should be.
NO_PLUGINS = {"SGLANG_PLUGINS": "none"}


@dataclass(frozen=True)
class LaunchPlan:
    role: str
    url: str
    argv: list[str]
    log: Path
    env: dict[str, str] = field(default_factory=dict)  # set on top of the harness's own

    def describe(self) -> str:
        """The launch as a shell line: its own environment, then the command."""
        return "".join(f"{k}={shlex.quote(v)} " for k, v in self.env.items()) + shlex.join(
            self.argv
        )


@dataclass(frozen=True)
class ServerOptions:
    backend: str  # "sglang" | "sim"
    admin_key: str
    spec_port: int
    plain_port: int
    depths: str = "0,1,2,3"
    mem_fraction_first: float = 0.4
    mem_fraction_second: float = 0.6
    # Start order; the first gets mem_fraction_first. (SPEC,) starts the speculative server
    # alone, with the whole card for a trace of its own policies.
    roles: tuple[str, ...] = (SPEC, PLAIN)
    extra_args: tuple[str, ...] = ()
    sim_profile: str = "h200-llama8b-eagle3"
    sim_speedup: float = 1.0
    python: str = sys.executable
    # Load the specctl plugin into the plain server too (it stays inactive there, but its
    # hooks are installed); by default the plain server runs without any plugin.
    plain_with_plugin: bool = False
    # CPU cores per server ("" for none): the launch goes through benchmarks.gpu.cpus.
    spec_cpus: str = ""
    plain_cpus: str = ""
    off_path: str = "specctl"  # the plugin's depth 0 (SPECCTL_OFF_PATH): specctl or sglang
    # Draft shapes (`specctl serve --shapes`, a tree among them) in place of --depths: the
    # speculative server then starts at the dominating tree and switches shapes ('' for none).
    shapes: str = ""
    device_timer: bool = False  # SGLang times every forward (both servers)


def plans(models: ModelFolders | None, opts: ServerOptions, log_dir: Path) -> list[LaunchPlan]:
    """The launch of each server, in start order (the first gets mem_fraction_first)."""
    out = []
    for i, role in enumerate(opts.roles):
        port = opts.spec_port if role == SPEC else opts.plain_port
        mem = opts.mem_fraction_first if i == 0 else opts.mem_fraction_second
        if opts.backend == "sim":
            argv = _sim_argv(role, port, opts)
        else:
            if models is None:
                raise ValueError("no model folders: run the `setup` step first")
            argv = _sglang_argv(role, port, mem, models, opts)
        argv = pinned_argv(opts.spec_cpus if role == SPEC else opts.plain_cpus, argv,
                           opts.python)
        env = dict(NO_PLUGINS) if role == PLAIN and not opts.plain_with_plugin else {}
        if opts.backend != "sim":
            # Part of the launch, so that a server started with another setting is restarted
            # rather than reused (the stand-ins carry the timer in their argv).
            env |= launch_env(role, opts)
        out.append(LaunchPlan(role, f"http://127.0.0.1:{port}", argv, log_dir / f"{role}.log",
                              env))
    return out


def _sglang_argv(role: str, port: int, mem: float, models: ModelFolders,
                 opts: ServerOptions) -> list[str]:
    args = ["--model-path", models.target, "--host", "127.0.0.1", "--port", str(port),
            *COMMON_SGLANG_FLAGS, "--admin-api-key", opts.admin_key,
            "--mem-fraction-static", f"{mem:g}", *opts.extra_args]
    if not chooses_decode_graph_sizes(opts.extra_args):  # the caller's sizes win
        args += ["--cuda-graph-bs-decode", *map(str, SHARED_DECODE_GRAPH_BS)]
    if not has_flag(opts.extra_args, KV_TOKENS_FLAG):  # the caller's cap wins
        args += [KV_TOKENS_FLAG, str(SHARED_KV_TOKENS)]
    if models.dummy:
        args += ["--load-format", "dummy"]
    if role == PLAIN:
        return [opts.python, "-m", "sglang.launch_server", *args]
    if opts.shapes:  # `specctl serve --shapes` adds the dominating shape's size flags
        return [opts.python, "-m", "controller.cli", "serve", "--shapes", opts.shapes, "--",
                *args, *EAGLE3_FLAGS[:2], "--speculative-draft-model-path", models.draft]
    args += [*EAGLE3_FLAGS, "--speculative-draft-model-path", models.draft]
    return [opts.python, "-m", "controller.cli", "serve", "--depths", opts.depths, "--", *args]


SHAPE = "shape"  # the one server of the shapes step, restarted per draft shape
# FlashInfer's workspace when a tree falls back to it: SGLang 0.5.17's 384 MiB default failed
# to capture a topk-8 tree's CUDA graphs up to batch 256 (803 MB needed).
FLASHINFER_WORKSPACE_ENV = "SGLANG_FLASHINFER_WORKSPACE_SIZE"
FLASHINFER_WORKSPACE_BYTES = 2 * 1024**3


@dataclass(frozen=True)
class ShapeLaunch:
    """One server of the shapes step: SGLang's own static draft shape (or none), stock SGLang
    without any plugin, alone on the GPU."""

    shape: Shape
    max_streams: int  # its request cap and largest decode CUDA graph
    graph_sizes: tuple[int, ...]  # decode CUDA graphs' batch sizes
    mem_fraction: float
    kv_tokens: int
    attention_backend: str  # "" lets SGLang choose


def shape_plan(models: ModelFolders | None, launch: ShapeLaunch, opts: ServerOptions,
               log_dir: Path) -> LaunchPlan:  # fmt: skip
    log = log_dir / f"shape_{label(launch.shape)}.log"
    if opts.backend == "sim":
        argv = _sim_argv(SPEC if launch.shape else PLAIN, opts.spec_port, opts)
        return LaunchPlan(SHAPE, f"http://127.0.0.1:{opts.spec_port}",
                          pinned_argv(opts.spec_cpus, argv, opts.python), log, {})
    if models is None:
        raise ValueError("no model folders: run the `setup` step first")
    args = ["--model-path", models.target, "--host", "127.0.0.1", "--port", str(opts.spec_port),
            "--sampling-backend", "pytorch", "--context-length", "4096", "--enable-metrics",
            "--max-running-requests", str(launch.max_streams),
            "--cuda-graph-max-bs-decode", str(launch.max_streams),
            "--cuda-graph-bs-decode", *map(str, launch.graph_sizes),
            "--admin-api-key", opts.admin_key, "--mem-fraction-static", f"{launch.mem_fraction:g}",
            KV_TOKENS_FLAG, str(launch.kv_tokens), *opts.extra_args]
    if launch.attention_backend:
        args += ["--attention-backend", launch.attention_backend]
    if models.dummy:
        args += ["--load-format", "dummy"]
    if launch.shape is not None:
        args += [*launch.shape.sglang_flags(), "--speculative-draft-model-path", models.draft]
    env = dict(NO_PLUGINS)
    if launch.attention_backend == "flashinfer":
        env[FLASHINFER_WORKSPACE_ENV] = str(FLASHINFER_WORKSPACE_BYTES)
    argv = [opts.python, "-m", "sglang.launch_server", *args]
    return LaunchPlan(SHAPE, f"http://127.0.0.1:{opts.spec_port}",
                      pinned_argv(opts.spec_cpus, argv, opts.python), log, env)


# SGLang's switch for its device timer (GPU seconds per forward kind on /metrics).
DEVICE_TIMER_ENV = "SGLANG_ENABLE_METRICS_DEVICE_TIMER"
# The plugin's one start-up setting: which depth 0 the speculative server runs.
OFF_PATH_ENV = "SPECCTL_OFF_PATH"


def launch_env(role: str, opts: ServerOptions) -> dict[str, str]:
    """The settings a server reads from its environment at start-up, as options set them."""
    env = {DEVICE_TIMER_ENV: "1"} if opts.device_timer else {}
    if role == SPEC:
        env[OFF_PATH_ENV] = opts.off_path
    return env


def _sim_argv(role: str, port: int, opts: ServerOptions) -> list[str]:
    argv = [opts.python, "-m", "controller.cli", "sim", "serve", "--profile", opts.sim_profile,
            "--port", str(port), "--admin-key", opts.admin_key,
            "--speedup", f"{opts.sim_speedup:g}"]
    # SGLang reads its device timer's switch from the environment; the stand-in takes a flag.
    if opts.device_timer:
        argv.append("--device-timer")
    if role == PLAIN:
        return [*argv, "--no-speculative"]
    # `specctl serve --shapes` on the stand-in: a simulated shape server (a --sim-profile with
    # shapes)
    return [*argv, "--shapes", opts.shapes] if opts.shapes else argv


class StartError(RuntimeError):
    """A server did not come up; the message carries the tail of its log."""


def launch(plan: LaunchPlan, env: dict[str, str] | None = None) -> int:
    """Start `plan` in a new session, output appended to its log; return its pid."""
    plan.log.parent.mkdir(parents=True, exist_ok=True)
    with plan.log.open("ab") as log:
        log.write(f"\n===== harness: starting {plan.role} at {time.strftime('%H:%M:%S')}: "
                  f"{plan.describe()}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            plan.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, env={**os.environ, **(env or {}), **plan.env},
        )  # fmt: skip
    return proc.pid


def healthy(url: str, timeout_s: float = 5.0) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=timeout_s).status_code == 200
    except httpx.HTTPError:
        return False


def wait_healthy(url: str, pid: int, log: Path, timeout_s: float) -> float:
    """Seconds until /health answered 200; StartError if the process dies or time runs out."""
    t0 = time.monotonic()
    while True:
        if healthy(url):
            return time.monotonic() - t0
        if not pid_alive(pid):
            raise StartError(f"the server (pid {pid}) exited before {url}/health answered; "
                             f"log tail:\n{log_tail(log)}")
        if time.monotonic() - t0 > timeout_s:
            raise StartError(f"{url}/health did not answer 200 within {timeout_s:g} s "
                             f"(pid {pid} still running); log tail:\n{log_tail(log)}")
        time.sleep(0.25)


def log_tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_bytes()[-20000:].decode(errors="replace")
    except OSError as err:
        return f"(no log: {err})"
    return "\n".join(text.splitlines()[-lines:])


def stop(pid: int, timeout_s: float = 30.0) -> str:
    """SIGTERM to the server's session (the process group it leads), then SIGKILL if needed."""
    members = session_pids(pid)
    if not members and not pid_alive(pid):
        return "not running"
    for sig, wait in ((signal.SIGTERM, timeout_s), (signal.SIGKILL, 10.0)):
        _signal_group(pid, members, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not any(pid_alive(p) for p in members | {pid}):
                return "stopped" if sig == signal.SIGTERM else "killed"
            time.sleep(0.1)
        members |= session_pids(pid)
    return "still running after SIGKILL"


def _signal_group(leader: int, members: Sequence[int] | set[int], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(leader, sig)
    for p in members:  # children that left the leader's group but stayed in its session
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(p, sig)
