"""Bench one server as it runs, nothing forced: closed-loop levels of a dataset's prompts.

    python -m benchmarks.gpu.shape_bench --url URL --series 3x4x16 --dataset family_a.jsonl \
        --streams 1,4,16,64,128,256 --out a.json [--level-seconds 6] [--warmup-seconds 2] \
        [--client-processes 4] [--admin-key K]

The server needs no plugin (SGLang's own static draft shape, a tree among them, or a plain
server): `controller.bench.sweep.sweep_as_is` runs the levels, and a level's accept length
comes from SGLang's own counters. Writes {"series", "url", "dataset", "levels": [...]} (each
level as `specctl bench` reports it, with the flags that keep it from deciding anything) and
prints a line per level.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from controller.bench.loadgen import StopRule
from controller.bench.prompts import DatasetError, load_dataset
from controller.bench.server_client import ServerError
from controller.bench.sweep import LevelObserver, LevelResult, SweepPlan, sweep_as_is


class Progress(LevelObserver):
    def level_finished(self, result: LevelResult) -> None:
        accept = "-" if result.accept_length is None else f"{result.accept_length:.2f}"
        tpot = "-" if result.tpot_p50_ms is None else f"{result.tpot_p50_ms:.2f}"
        flags = f" ({', '.join(result.flags)})" if result.flags else ""
        print(f"  {result.series} c={result.concurrency}: {result.output_tok_per_s:,.0f} tok/s, "
              f"TPOT p50 {tpot} ms, accept {accept}, {result.requests} requests{flags}",
              flush=True)

    def warning(self, text: str) -> None:
        print(f"  ! {text}", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu.shape_bench",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--series", required=True, help="the levels' name, e.g. the shape")
    ap.add_argument("--dataset", required=True, type=Path)
    ap.add_argument("--streams", required=True, help="closed-loop levels, e.g. 1,4,16")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--level-seconds", type=float, default=6.0)
    ap.add_argument("--warmup-seconds", type=float, default=2.0)
    ap.add_argument("--client-processes", type=int, default=1)
    ap.add_argument("--output-tokens", type=int, default=256,
                    help="output tokens of rows that name none")
    ap.add_argument("--admin-key", default=None)
    args = ap.parse_args(argv)
    try:
        streams = tuple(int(s) for s in args.streams.split(",") if s.strip())
        prompts = load_dataset(args.dataset, args.output_tokens)
        plan = SweepPlan(
            url=args.url, depths=(), concurrencies=streams,
            stop=StopRule(duration_s=args.level_seconds, warmup_s=args.warmup_seconds),
            prompts=prompts, prompt_source=str(args.dataset), admin_key=args.admin_key,
            client_processes=args.client_processes, freeze_gc=args.admin_key is not None,
        )  # fmt: skip
        results = asyncio.run(sweep_as_is(plan, args.series, Progress()))
    except (ValueError, DatasetError, ServerError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "series": args.series, "url": args.url, "dataset": str(args.dataset),
        "levels": [{**r.to_json(), "flags": r.flags} for r in results]}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
