"""How many streams, requests/s and streamed tokens/s `specctl bench`'s load generator sustains.

Runs `controller.bench.loadgen.run_level` (the code `specctl bench` uses) against
`specctl sim serve` started in a separate process with a very high clock speedup, so that
simulated GPU time is negligible and what remains is HTTP, SSE and the two processes' CPU.
Prints, per concurrency: requests/s, tokens/s, SSE events/s, and the client's CPU use (CPU
seconds per wall second; 1.0 = one core saturated). On a machine where the client's CPU use
stays well below 1.0 while the server process saturates its core, the number measured is the
server's ceiling and the load generator's is higher.

    .venv/bin/python benchmarks/loadgen_ceiling.py [--seconds 8] [--levels 1,16,64,256]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import socket
import subprocess
import sys
import time

import httpx

from controller.bench.loadgen import ClosedLoop, LiveCounters, StopRule, make_client, run_level
from controller.bench.prompts import synthetic_prompts


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"simulator at {url} did not become healthy")


def server_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(url: str, concurrency: int, seconds: float, output_tokens: int, pid: int):
    prompts = synthetic_prompts(2048, 64, output_tokens)
    live = LiveCounters()
    async with make_client(url, concurrency) as http:
        # Warm the keep-alive pool so connection set-up is not counted.
        shape = ClosedLoop(concurrency)
        await run_level(http, prompts, shape, StopRule(requests=concurrency, warmup_s=0))
        cpu0 = server_cpu_s(pid)
        stop = StopRule(duration_s=seconds, warmup_s=0)  # the run above was the warm-up
        load = await run_level(http, prompts, shape, stop, live=live)
        srv = (server_cpu_s(pid) - cpu0) / load.elapsed_s
    done = len(load.completed)
    return {
        "concurrency": concurrency,
        "req_per_s": done / load.elapsed_s,
        "tok_per_s": load.output_tok_per_s,
        "events_per_s": live.chunks / load.elapsed_s,
        "client_cpu": load.client_cpu_s / load.elapsed_s,
        "server_cpu": srv,
        "errors": len(load.errors),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=8.0)
    ap.add_argument("--levels", default="1,16,64,256")
    ap.add_argument("--output-tokens", type=int, default=128)
    ap.add_argument("--speedup", type=float, default=1000.0)
    args = ap.parse_args()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "controller.cli", "sim", "serve", "--profile",
         "kimi-k25-8x-rtxpro6000-pcie", "--port", str(port), "--speedup", str(args.speedup),
         "--no-speculative"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_ready(url)
        print(
            f"# loadgen ceiling: {platform.python_implementation()} {platform.python_version()}, "
            f"{os.cpu_count()} CPUs, httpx {httpx.__version__}; server: specctl sim serve "
            f"--no-speculative --speedup {args.speedup:g} (separate process); "
            f"{args.output_tokens} output tokens per request, {args.seconds:g} s per level"
        )
        print(f"{'streams':>8} {'req/s':>8} {'tok/s':>9} {'events/s':>9} "
              f"{'client CPU':>10} {'server CPU':>10} {'errors':>6}")  # fmt: skip
        for c in (int(x) for x in args.levels.split(",")):
            r = asyncio.run(measure(url, c, args.seconds, args.output_tokens, server.pid))
            print(
                f"{r['concurrency']:>8} {r['req_per_s']:>8.1f} {r['tok_per_s']:>9.0f} "
                f"{r['events_per_s']:>9.0f} {r['client_cpu']:>10.2f} {r['server_cpu']:>10.2f} "
                f"{r['errors']:>6}",
                flush=True,
            )
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    main()
