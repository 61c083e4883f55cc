"""Both schedulers' Python stacks, sampled now and then over a long run, and what grew.

Over the twenty-third H200 run both servers slowed, depth 0's more: at 128 streams its time per
forward pass outside the GPU's forward rose from 0.4 to about 4 ms in 18 minutes while the
forward itself held (docs/h200-runs.md, the twenty-third run). Which host work grew is what this
records: beside a long series of benches, every `--every` seconds, py-spy samples each server's
scheduler for `--seconds` (`--nonblocking`: the scheduler is never paused) and the scheduler's
memory and its prefill batches and decode iterations over the sample (its /metrics, scraped at
both ends) are read; `compare` then sets each server's first sample against its last by busy
host time (`stack_share --busy`), in host milliseconds per decode iteration where both samples
counted passes, the functions that grew first.

    python -m benchmarks.gpu.stack_watch record --run-dir R --py-spy PATH --out DIR \\
        [--every 120] [--seconds 6] [--rate 200]        # until SIGTERM (or --rounds N)
    python -m benchmarks.gpu.stack_watch compare DIR [--top 25]

`record` writes DIR/<server>_<round>.txt (py-spy's raw stacks) and DIR/samples.json (per sample:
server, round, start time, seconds, py-spy's exit status, the scheduler's resident memory, the
passes the server counted and the seconds between the two scrapes).
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.gpu import stack_share
from benchmarks.gpu.host_watch import passes_in, scheduler_pid
from benchmarks.gpu.procs import rss_bytes, session_pids
from benchmarks.gpu.state import RunState
from controller.bench.metrics import Scrape
from controller.bench.server_client import ServerClient

INDEX = "samples.json"


@dataclass
class Sample:
    server: str
    round: int
    start_unix: float
    seconds: float
    file: str | None  # the stacks file, None where the scheduler was not found
    rc: int | str | None  # py-spy's exit status ("timed out", or None where it did not run)
    scheduler_pid: int | None
    scheduler_rss_mb: float | None
    # Over the sample, from the server's /metrics (None: a scrape failed or no pass counter).
    decode_passes: int | None = None
    prefill_passes: int | None = None
    window_s: float | None = None  # between the two scrapes


@dataclass(frozen=True)
class Watched:
    """One server of the run: its scheduler's pid (None: not found) and its URL."""

    pid: int | None
    url: str | None


def schedulers(run_dir: Path, servers: list[str]) -> dict[str, Watched]:
    """Each named server's scheduler and URL, from the harness's state."""
    state = RunState.load(run_dir).data
    out: dict[str, Watched] = {}
    for name in servers:
        info = state.get("servers", {}).get(name)
        if not info:
            raise SystemExit(f"error: no server {name!r} in {run_dir}/state.json "
                             "(start the servers with the harness first)")
        out[name] = Watched(scheduler_pid(session_pids(int(info["pid"]))), info.get("url"))
    return out


def _scraper(url: str | None) -> Callable[[], Scrape | None]:
    def scrape() -> Scrape | None:
        if not url:
            return None
        with ServerClient(url) as server:
            return server.scrape_or_none()

    return scrape


def _sample(py_spy: str, server: str, watched: Watched, n: int, args: argparse.Namespace,
            stop: threading.Event) -> Sample:
    start = time.time()
    pid = watched.pid
    rss = rss_bytes(pid) if pid is not None else None
    sample = Sample(server, n, round(start, 3), args.seconds, None, None, pid,
                    None if rss is None else round(rss / 2**20, 1))
    if pid is None:
        return sample
    began = time.monotonic()
    _, passes = passes_in(_scraper(watched.url), lambda: _spy(py_spy, server, pid, n, args,
                                                               stop, sample))
    if passes is not None:
        sample.decode_passes, sample.prefill_passes = passes.decode, passes.prefill
    sample.window_s = round(time.monotonic() - began, 3)
    return sample


def _spy(py_spy: str, server: str, pid: int, n: int, args: argparse.Namespace,
         stop: threading.Event, sample: Sample) -> None:
    """py-spy over the scheduler for `args.seconds`; its file and exit status into `sample`."""
    name = f"{server}_{n}.txt"
    with open(args.out / f"{server}_{n}.log", "w") as log:
        spy = subprocess.Popen(
            [py_spy, "record", "--pid", str(pid), "--rate", str(args.rate),
             "--duration", str(max(1, round(args.seconds))), "--format", "raw", "--idle",
             "--threads", "--nonblocking", "--output", str(args.out / name)],
            stdout=subprocess.DEVNULL, stderr=log,
        )  # fmt: skip
        deadline = time.monotonic() + args.seconds + 30
        while spy.poll() is None and time.monotonic() < deadline and not stop.is_set():
            time.sleep(0.05)
        if spy.poll() is None:
            spy.kill()
            spy.wait()
            sample.rc = "timed out" if not stop.is_set() else "stopped"
        else:
            sample.rc = spy.returncode
    sample.file = name if (args.out / name).exists() else None


def _round(args: argparse.Namespace, pids: dict[str, Watched], n: int,
           stop: threading.Event) -> list[Sample]:
    """One round: every server's scheduler sampled at once."""
    done: list[Sample] = []

    def take(server: str, watched: Watched) -> None:
        done.append(_sample(args.py_spy, server, watched, n, args, stop))

    threads = [threading.Thread(target=take, args=item) for item in pids.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(done, key=lambda s: s.server)


def record(args: argparse.Namespace) -> int:
    args.out.mkdir(parents=True, exist_ok=True)
    pids = schedulers(args.run_dir, args.servers)
    missing = [name for name, watched in pids.items() if watched.pid is None]
    if missing:
        print(f"stack_watch: no scheduler process found for {', '.join(missing)}; "
              "their rounds record nothing", file=sys.stderr)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    samples: list[Sample] = []
    n = 0
    while not stop.is_set() and (args.rounds is None or n < args.rounds):
        n += 1
        began = time.monotonic()
        samples.extend(_round(args, pids, n, stop))
        _write_index(args.out, samples, args)
        if args.rounds is not None and n >= args.rounds:
            break
        stop.wait(max(0.0, args.every - (time.monotonic() - began)))
    _write_index(args.out, samples, args)
    print(f"stack_watch: {n} rounds, {sum(s.file is not None for s in samples)} stack files "
          f"in {args.out}")
    return 0


def _write_index(out: Path, samples: list[Sample], args: argparse.Namespace) -> None:
    payload: dict[str, Any] = {"every_s": args.every, "seconds": args.seconds,
                               "rate": args.rate, "samples": [asdict(s) for s in samples]}
    (out / INDEX).write_text(json.dumps(payload, indent=1) + "\n")


def compare(folder: Path, top: int) -> list[str]:
    """Per server, its first sample with stacks against its last, by busy host time."""
    try:
        index = json.loads((folder / INDEX).read_text())
    except (OSError, ValueError) as err:
        raise SystemExit(f"error: {folder / INDEX}: {err} (give the folder `record` wrote)"
                         ) from None
    lines: list[str] = []
    by_server: dict[str, list[dict[str, Any]]] = {}
    for s in index.get("samples", []):
        if s.get("file") and (folder / s["file"]).exists():
            by_server.setdefault(s["server"], []).append(s)
    if not by_server:
        raise SystemExit(f"error: {folder} holds no stacks (did py-spy run? see its *.log)")
    for server, found in sorted(by_server.items()):
        found.sort(key=lambda s: s["round"])
        first, last = found[0], found[-1]
        span_min = (last["start_unix"] - first["start_unix"]) / 60
        rss = [s.get("scheduler_rss_mb") for s in (first, last)]
        memory = (f"; scheduler memory {rss[0]:.0f} -> {rss[1]:.0f} MB"
                  if None not in rss else "")
        lines.append(f"== {server}: round {first['round']} against round {last['round']} "
                     f"({span_min:.1f} min later){memory}")
        if first is last:
            lines.append("  one sample only: nothing to compare")
            continue
        try:
            a = stack_share.load(folder / first["file"], busy=True)
            b = stack_share.load(folder / last["file"], busy=True)
        except SystemExit as err:
            lines.append(f"  {err}")
            continue
        names = (f"round {first['round']}", f"round {last['round']}")
        lines.extend(stack_share.compare(a, b, top, names, _windows(first, last)))
    return lines


def _windows(first: dict[str, Any], last: dict[str, Any]
             ) -> tuple[stack_share.Window, stack_share.Window] | None:
    """Both samples' windows where each counted decode iterations (older indices did not)."""
    a, b = (stack_share.Window.read(s, "window_s") for s in (first, last))
    return (a, b) if a is not None and b is not None else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record", help="sample the schedulers every --every seconds")
    rec.add_argument("--run-dir", type=Path, required=True, help="the harness's run folder")
    rec.add_argument("--py-spy", required=True, help="the py-spy binary")
    rec.add_argument("--out", type=Path, required=True)
    rec.add_argument("--servers", default="spec,plain", help="servers of the run, comma-separated")
    rec.add_argument("--every", type=float, default=120.0, help="seconds from round to round")
    rec.add_argument("--seconds", type=float, default=6.0, help="seconds py-spy samples a round")
    rec.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    rec.add_argument("--rounds", type=int, default=None, help="stop after N rounds")
    cmp_ = sub.add_parser("compare", help="each server's first sample against its last")
    cmp_.add_argument("folder", type=Path)
    cmp_.add_argument("--top", type=int, default=25)
    args = ap.parse_args(argv)
    if args.cmd == "compare":
        print("\n".join(compare(args.folder, args.top)))
        return 0
    args.servers = [s for s in args.servers.split(",") if s.strip()]
    if args.every <= 0 or args.seconds <= 0 or args.rate < 1 \
            or (args.rounds is not None and args.rounds < 1):
        print("error: --every, --seconds, --rate and --rounds must be positive", file=sys.stderr)
        return 2
    return record(args)


if __name__ == "__main__":
    sys.exit(main())
