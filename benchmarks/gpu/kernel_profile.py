"""Where a decode iteration's GPU time goes: kernel time per step from SGLang's own profiler.

    python -m benchmarks.gpu.kernel_profile capture --url SPEC --admin-key K --depth 0 \
        --label d0 --streams 1,16 --dataset family_a.jsonl --out DIR
    python -m benchmarks.gpu.kernel_profile capture --url PLAIN --label plain --streams 1,16 \
        --dataset family_a.jsonl --out DIR
    python -m benchmarks.gpu.kernel_profile compare DIR/plain-c1.json DIR/d0-c1.json

`capture` keeps N closed-loop streams on the server (a depth forced first through the admin RPC
on a speculative server, its table restored after), asks SGLang's `/start_profile` for GPU
activity over `--steps` scheduler iterations once the load is warm, waits for the trace, and
writes `<label>-c<N>.json`: per kernel (name cut to `NAME_CHARS`) its launches and GPU time
per iteration, the GPU's busy time (union of kernel intervals) and the trace's span. The raw
trace stays in `--trace-dir` (tens of MB). `compare A B` prints where B's iteration spends
more GPU time than A's, kernel by kernel. `capture --host` also records CPU activity: per
iteration the aten operators the server dispatches (`host_ops`) and its CUDA runtime calls
(`runtime_calls`), compared with `compare --part host_ops|runtime_calls`; the profiler's own
overhead inflates host times, so their counts per iteration are what compares cleanly.
Each capture also records where the GPU idles between kernels (all streams merged): `gaps FILE`
prints the idle time per iteration and the kernel boundaries (which kernel ends, which one
starts after) where it idles longest, for iterations slower than their kernel time explains.

The same iteration count on both servers is what makes the numbers comparable: at depth 0
each iteration of the speculative server emits one token per request, as a plain decode does.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import json
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from controller.bench.loadgen import ClosedLoop, StopRule, WindowHooks, make_client, run_level
from controller.bench.prompts import read_dataset, synthetic_prompts
from controller.bench.server_client import ServerClient, ServerError
from sglang_hooks.contract import single_depth_table

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
# With --host: the host side of an iteration. `cpu_op` are the aten operators the Python code
# dispatches (nested, so their busy union is the host time inside operators, not their sum);
# `cuda_runtime` the launches and copies they issue.
HOST_SECTIONS = {"host_ops": ("cpu_op",), "runtime_calls": ("cuda_runtime", "cuda_driver")}
NAME_CHARS = 90  # template arguments make kernel names kilobytes long; the head tells them apart
GAP_NAME_CHARS = 45  # each side of a "before -> after" boundary in the gaps table
MIN_GAP_US = 2.0  # shorter gaps are launch jitter, not a stall worth naming
TRACE_WAIT_S = 90.0


class ProfileError(RuntimeError):
    """The server cannot be profiled, or its trace cannot be read; the message says why."""


@dataclass(frozen=True)
class KernelRow:
    name: str
    launches: int
    total_us: float


def short_name(name: str) -> str:
    head = name.removeprefix("void ").strip()
    return head if len(head) <= NAME_CHARS else head[: NAME_CHARS - 1] + "~"


def read_trace(path: Path) -> list[dict[str, Any]]:
    """The events of a Chrome trace as torch.profiler writes it (gzip or plain JSON)."""
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rt") as f:
                raw = f.read()
        else:
            raw = path.read_text()
        data = json.loads(raw)
    except (OSError, ValueError, EOFError) as err:
        raise ProfileError(f"{path}: not a readable Chrome trace ({err})") from None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ProfileError(f"{path}: no traceEvents list; is this a torch.profiler trace?")
    return [e for e in events if isinstance(e, dict)]


def _intervals(
    events: Iterable[dict[str, Any]], categories: Sequence[str]
) -> list[tuple[float, float, str]]:
    """(start, duration, short name) of the complete ('X') events in `categories`."""
    out: list[tuple[float, float, str]] = []
    for event in events:
        if event.get("ph") != "X" or event.get("cat") not in categories:
            continue
        try:
            start, dur = float(event["ts"]), float(event["dur"])
        except (KeyError, TypeError, ValueError):
            continue
        out.append((start, dur, short_name(str(event.get("name", "?")))))
    if not out:
        raise ProfileError(
            f"no events of category {', '.join(categories)} in the trace: was GPU activity "
            "recorded (activities GPU, or CPU for host events), and did the server run any "
            "iteration while profiling?"
        )
    return out


@dataclass
class _Busy:
    """A stretch where some stream runs a kernel; the names are what bound the idle around it."""

    start: float
    end: float
    first: str  # the kernel that starts the stretch
    last: str  # the kernel that ends it last


def _busy_stretches(intervals: list[tuple[float, float, str]]) -> list[_Busy]:
    """All streams merged: a kernel overlapping or touching the current stretch extends it."""
    merged: list[_Busy] = []
    for start, dur, name in sorted(intervals):
        stop = start + dur
        if merged and start <= merged[-1].end:
            cur = merged[-1]
            if stop > cur.end:
                cur.end, cur.last = stop, name
        else:
            merged.append(_Busy(start, stop, name, name))
    return merged


def summarize(
    events: Iterable[dict[str, Any]], steps: int, categories: Sequence[str] = GPU_CATEGORIES
) -> dict[str, Any]:
    """Kernel time per iteration over `steps` iterations, from complete ('X') events."""
    intervals = _intervals(events, categories)
    return _summary_of(intervals, _busy_stretches(intervals), steps)


def _summary_of(
    intervals: list[tuple[float, float, str]], stretches: list[_Busy], steps: int
) -> dict[str, Any]:
    if steps < 1:
        raise ValueError("steps must be >= 1")
    rows: dict[str, list[float]] = {}
    for _, dur, key in intervals:
        row = rows.setdefault(key, [0, 0.0])
        row[0] += 1
        row[1] += dur
    kernels = sorted(
        (KernelRow(name, int(n), us) for name, (n, us) in rows.items()),
        key=lambda r: -r.total_us,
    )
    # Stretches are in time order and the last ends last (a merge only extends an end).
    span = stretches[-1].end - stretches[0].start
    busy = sum(b.end - b.start for b in stretches)
    return {
        "steps": steps,
        "kernel_us_per_step": sum(r.total_us for r in kernels) / steps,
        "busy_us_per_step": busy / steps,
        "span_us_per_step": span / steps,
        "busy_share": busy / span if span > 0 else 1.0,
        "kernels": [
            {
                "name": r.name,
                "launches_per_step": r.launches / steps,
                "us_per_step": r.total_us / steps,
            }
            for r in kernels
        ],
    }


def _quantile(values: list[float], q: float) -> float:
    return float(np.quantile(values, q)) if values else 0.0


def idle_gaps(
    events: Iterable[dict[str, Any]],
    steps: int,
    top: int = 10,
    min_gap_us: float = MIN_GAP_US,
    categories: Sequence[str] = GPU_CATEGORIES,
) -> dict[str, Any]:
    """Where the GPU idles between kernels over `steps` iterations, per kernel boundary.

    Idle is time no stream runs anything, so a kernel overlapping another on a second stream
    hides the gap; `idle_us_per_step` counts every gap, the rest only gaps >= `min_gap_us`.
    """
    return _idle_of(_busy_stretches(_intervals(events, categories)), steps, top, min_gap_us)


def _idle_of(stretches: list[_Busy], steps: int, top: int = 10,
             min_gap_us: float = MIN_GAP_US) -> dict[str, Any]:
    if steps < 1:
        raise ValueError("steps must be >= 1")
    idle = 0.0
    gaps: list[float] = []
    boundaries: dict[tuple[str, str], list[float]] = defaultdict(list)
    for prev, nxt in pairwise(stretches):
        gap = nxt.start - prev.end
        idle += gap
        if gap >= min_gap_us:
            gaps.append(gap)
            boundaries[(prev.last, nxt.first)].append(gap)
    ranked = sorted(boundaries.items(), key=lambda kv: (-sum(kv[1]), kv[0]))
    gaps.sort()
    return {
        "min_gap_us": min_gap_us,
        "idle_us_per_step": idle / steps,
        "gaps_per_step": len(gaps) / steps,
        "gap_us_quantiles": {
            "p50": _quantile(gaps, 0.5),
            "p90": _quantile(gaps, 0.9),
            "max": gaps[-1] if gaps else 0.0,
        },
        "by_boundary": [
            {
                "before": before,
                "after": after,
                "gaps_per_step": len(found) / steps,
                "us_per_step": sum(found) / steps,
                "mean_us": sum(found) / len(found),
            }
            for (before, after), found in ranked[:top]
        ],
    }


def _cut(name: str, chars: int) -> str:
    return name if len(name) <= chars else name[: chars - 1] + "~"


def format_gaps(summary: dict[str, Any], top: int, source: str | None = None) -> str:
    """A text table of a capture's idle gaps: totals, then the costliest kernel boundaries."""
    idle = summary.get("idle")
    if not isinstance(idle, dict):
        where = source or f"capture {summary.get('label', '?')!r}"
        raise ProfileError(
            f"{where} has no 'idle': it was captured before idle gaps were recorded; "
            "capture it again"
        )
    q = idle["gap_us_quantiles"]
    min_gap = idle.get("min_gap_us", MIN_GAP_US)
    width = 2 * GAP_NAME_CHARS + 4
    lines = [
        f"{summary.get('label', '?')}, {summary.get('streams', '?')} streams: "
        f"{idle['idle_us_per_step']:.1f} us GPU idle per iteration, "
        f"{idle['gaps_per_step']:.3g} gaps >= {min_gap:g} us per iteration "
        f"(p50 {q['p50']:.1f}, p90 {q['p90']:.1f}, max {q['max']:.1f} us)",
        "",
        f"{'before -> after':<{width}} {'gaps/iter':>9} {'us/iter':>9} {'mean us':>9}",
    ]
    for row in idle["by_boundary"][:top]:
        pair = f"{_cut(row['before'], GAP_NAME_CHARS)} -> {_cut(row['after'], GAP_NAME_CHARS)}"
        lines.append(
            f"{pair:<{width}} {row['gaps_per_step']:>9.3g} {row['us_per_step']:>9.1f} "
            f"{row['mean_us']:>9.1f}"
        )
    return "\n".join(lines)


def _us(rows: dict[str, Any], name: str) -> float:
    return float(rows.get(name, {}).get("us_per_step", 0.0))


def _section(summary: dict[str, Any], part: str, path: str) -> dict[str, Any]:
    """A host section of a capture, labelled as its capture; an error if it has none."""
    section = summary.get(part)
    if not isinstance(section, dict):
        raise ProfileError(f"{path} has no {part!r}: capture it with --host")
    return section | {"label": summary.get("label", "?")}


def compare(
    base: dict[str, Any], other: dict[str, Any], top: int = 20, what: str = "kernels"
) -> str:
    """A text table: per kernel (or host operator), base's and other's us per iteration,
    largest changes first."""
    a = {k["name"]: k for k in base["kernels"]}
    b = {k["name"]: k for k in other["kernels"]}
    names = sorted(
        set(a) | set(b),
        key=lambda n: -abs(_us(b, n) - _us(a, n)),
    )
    la, lb = base.get("label", "A"), other.get("label", "B")

    def total(what: str, key: str) -> str:
        x, y = base[key], other[key]
        return f"{what:<40} {x:>12.1f} {y:>12.1f} {y - x:>+10.1f}"

    gpu = what == "kernels"
    unit = "kernel (launches per iteration)" if gpu else f"{what} (calls per iteration)"
    lines = [
        f"{'per iteration':<40} {la:>12} {lb:>12} {'change':>10}",
        total("GPU kernel time (us)" if gpu else "time, summed (us)", "kernel_us_per_step"),
        total("GPU busy time (us)" if gpu else "busy time, union (us)", "busy_us_per_step"),
        total("wall span (us)", "span_us_per_step"),
        "",
        f"{unit:<60} {la + ' us':>10} {lb + ' us':>10} {'change':>9}",
    ]
    for name in names[:top]:
        ka, kb = a.get(name, {}), b.get(name, {})
        ua, ub = ka.get("us_per_step", 0.0), kb.get("us_per_step", 0.0)
        launches = kb.get("launches_per_step", ka.get("launches_per_step", 0.0))
        label = f"{name[:52]} ({launches:.3g})"
        lines.append(f"{label:<60} {ua:>10.1f} {ub:>10.1f} {ub - ua:>+9.1f}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- capture


class _StartProfileAtWindow(WindowHooks):
    """Asks for the profile once the level's warm-up is over, so it sees steady decode."""

    def __init__(self, http: httpx.AsyncClient, body: dict[str, Any], headers: dict[str, str]):
        self._http, self._body, self._headers = http, body, headers
        self.error: str | None = None

    async def window_started(self) -> None:
        resp = await self._http.post("/start_profile", json=self._body, headers=self._headers)
        if resp.status_code != 200:
            self.error = f"/start_profile answered {resp.status_code}: {resp.text[:200]}"


def _wait_for_trace(trace_dir: Path, prefix: str, timeout_s: float) -> Path:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = sorted(trace_dir.glob(f"{prefix}-*.trace.json.gz"))
        if found:
            size = found[0].stat().st_size
            time.sleep(1.0)  # written in one go, but do not read it while it grows
            if found[0].stat().st_size == size:
                return found[0]
        time.sleep(0.5)
    raise ProfileError(
        f"no trace {prefix}-*.trace.json.gz in {trace_dir} after {timeout_s:g} s: the server "
        "writes it on its own machine; give --trace-dir as a folder the server can write"
    )


async def _profiled_level(
    url: str, prompts: list[Any], streams: int, body: dict[str, Any], headers: dict[str, str],
    seconds: float, warmup_s: float, model: str, prompt_offset: int,
) -> str | None:  # fmt: skip
    async with make_client(url, streams) as http:
        hooks = _StartProfileAtWindow(http, body, headers)
        await run_level(
            http, prompts, ClosedLoop(streams), StopRule(duration_s=seconds, warmup_s=warmup_s),
            model=model, hooks=hooks, prompt_offset=prompt_offset,
        )  # fmt: skip
        return hooks.error


def capture(args: argparse.Namespace) -> list[Path]:
    headers = {"Authorization": f"Bearer {args.admin_key}"} if args.admin_key else {}
    if args.dataset:
        prompts = read_dataset(Path(args.dataset), args.output_tokens, args.output_tokens).prompts
    else:
        prompts = synthetic_prompts(64, args.prompt_tokens, args.output_tokens)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    trace_dir = Path(args.trace_dir or out / "traces").resolve()
    written: list[Path] = []
    with ServerClient(args.url, args.admin_key) as server:
        model = server.model_id() or "default"
        before = server.state() if args.depth is not None else None
        try:
            if args.depth is not None and before is not None:
                server.push(single_depth_table(args.depth, version=before.version + 1))
            for level, streams in enumerate(args.streams):
                # Each level starts at its own share of the prompts: a level replaying the
                # last one's would profile whole-prompt cache hits instead of admissions.
                offset = level * len(prompts) // len(args.streams)
                prefix = f"{args.label}-c{streams}"
                body = {
                    "output_dir": str(trace_dir), "num_steps": args.steps,
                    "activities": ["CPU", "GPU"] if args.host else ["GPU"],
                    "with_stack": False, "record_shapes": False, "profile_prefix": prefix,
                }  # fmt: skip
                print(
                    f"== {prefix}: {streams} streams, {args.steps} iterations profiled", flush=True
                )
                error = asyncio.run(_profiled_level(
                    args.url, prompts, streams, body, headers, args.seconds, args.warmup, model,
                    offset,
                ))  # fmt: skip
                if error:
                    raise ProfileError(f"{args.url}{error}")
                trace = _wait_for_trace(trace_dir, prefix, args.trace_wait)
                events = read_trace(trace)
                gpu = _intervals(events, GPU_CATEGORIES)  # read once for both summaries
                stretches = _busy_stretches(gpu)
                summary = _summary_of(gpu, stretches, args.steps)
                summary["idle"] = _idle_of(stretches, args.steps)
                if args.host:
                    for section, categories in HOST_SECTIONS.items():
                        try:
                            summary[section] = summarize(events, args.steps, categories)
                        except ProfileError:
                            summary[section] = None
                            print(f"   no {section} in the trace (CPU activity recorded?)")
                summary.update(
                    label=args.label, streams=streams, depth=args.depth, trace=str(trace)
                )
                path = out / f"{prefix}.json"
                path.write_text(json.dumps(summary, indent=1) + "\n")
                print(f"   {summary['busy_us_per_step']:.0f} us GPU busy per iteration, "
                      f"{summary['busy_share']:.0%} of the span -> {path}", flush=True)  # fmt: skip
                written.append(path)
        finally:
            if before is not None:
                server.push(before.table)
    return written


def streams_option(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--streams {text!r}: give integers, e.g. 1,16") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"--streams {text!r}: give integers >= 1, e.g. 1,16")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu.kernel_profile")
    sub = parser.add_subparsers(dest="cmd", required=True)
    cap = sub.add_parser("capture", help="profile N iterations under closed-loop load")
    cap.add_argument("--url", required=True)
    cap.add_argument("--admin-key")
    cap.add_argument("--depth", type=int, help="force this depth first (a speculative server)")
    cap.add_argument("--label", required=True, help="file prefix, e.g. d0 or plain")
    cap.add_argument("--streams", type=streams_option, default=[1, 16])
    cap.add_argument("--steps", type=int, default=60)
    cap.add_argument("--seconds", type=float, default=6.0, help="the level's measured window")
    cap.add_argument("--warmup", type=float, default=2.0)
    cap.add_argument("--dataset")
    cap.add_argument("--prompt-tokens", type=int, default=128)
    cap.add_argument("--output-tokens", type=int, default=128)
    cap.add_argument("--out", required=True)
    cap.add_argument("--trace-dir", help="where the server writes traces (default OUT/traces)")
    cap.add_argument("--trace-wait", type=float, default=TRACE_WAIT_S)
    cap.add_argument("--host", action="store_true",
                     help="also record CPU activity: aten operators and CUDA runtime calls per "
                     "iteration (the profiler's own overhead inflates their times; their counts "
                     "per iteration compare as they are)")  # fmt: skip
    cmp_ = sub.add_parser("compare", help="kernel by kernel, where B spends more than A")
    cmp_.add_argument("base")
    cmp_.add_argument("other")
    cmp_.add_argument("--top", type=int, default=20)
    cmp_.add_argument(
        "--part", choices=["kernels", *HOST_SECTIONS], default="kernels",
        help="GPU kernels (default), or a host section of a --host capture",
    )  # fmt: skip
    gap_cmd = sub.add_parser("gaps", help="where a capture's GPU idles between kernels")
    gap_cmd.add_argument("file", help="a capture's <label>-c<N>.json")
    gap_cmd.add_argument("--top", type=int, default=10, help="boundaries shown (captures keep 10)")
    args = parser.parse_args(argv)
    try:
        if args.cmd == "capture":
            if args.steps < 1:
                parser.error("--steps must be >= 1")
            capture(args)
        elif args.cmd == "gaps":
            summary = json.loads(Path(args.file).read_text())
            if not isinstance(summary, dict):
                raise ProfileError(f"{args.file}: not a capture summary (a JSON object)")
            print(format_gaps(summary, args.top, source=args.file))
        else:
            base, other = (json.loads(Path(p).read_text()) for p in (args.base, args.other))
            if args.part != "kernels":
                base, other = (_section(d, args.part, p)
                               for d, p in ((base, args.base), (other, args.other)))  # fmt: skip
            print(compare(base, other, args.top, what=args.part))
    except (ProfileError, ServerError, OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
