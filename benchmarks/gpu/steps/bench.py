"""`bench`: `specctl bench` over the bench depths with the plain server beside, into bench/
(a later bench of the run into bench_2/, ...), then, with --bench-families, one more bench per
named seeded family into bench_NAME/ (what each depth does on prompts the first bench never
sent); and how every step runs `specctl bench` (one command line, pinned to --bench-cpus, with
a timeout).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.gpu import servers
from benchmarks.gpu.context import Run, StepError
from benchmarks.gpu.cpus import pinned_argv
from benchmarks.gpu.options import int_list, trace_datasets
from benchmarks.gpu.subproc import Finished, run_logged

DRAIN_S = 40.0  # a level's wait for the server to finish what it holds, at most


def bench_argv(run: Run, out_dir: Path, extra: Sequence[str],
               level_seconds: float | None = None,
               warmup_seconds: float | None = None) -> list[str]:
    """`specctl bench` against the speculative server with the run's admin key and load
    options, writing to `out_dir`; `extra` adds to it (depths, levels, dataset, pairing)."""
    o = run.opts
    argv = [sys.executable, "-m", "controller.cli", "bench", "--url", run.url(servers.SPEC),
            "--admin-key", run.admin_key,
            "--duration-per-level", f"{level_seconds or o.level_seconds:g}",
            "--warmup-per-level",
            f"{o.warmup_seconds if warmup_seconds is None else warmup_seconds:g}",
            "--client-processes", str(o.client_processes),
            "--prompt-tokens", str(o.prompt_tokens), "--out", str(out_dir), *extra]
    return pinned_argv(o.bench_cpus, argv)


def run_bench(run: Run, argv: list[str], levels: int, log: Path,
              level_seconds: float | None = None) -> tuple[Finished, dict[str, Any] | None]:
    """Run a bench of `levels` levels, its output to `log`; its bench.json, if it wrote one.
    The timeout allows each level its warm-up, window and drain, cut to the --budget."""
    o = run.opts
    timeout = levels * ((level_seconds or o.level_seconds) + o.warmup_seconds + DRAIN_S) + 60
    if run.time_left() < timeout:
        run.say(f"  warning: the --budget leaves {run.time_left():.0f} s of the {timeout:.0f} "
                "this bench may take: it is cut then, and the levels measured by that time "
                "are kept")
    done = run_logged(argv, log, run.cap(timeout))
    bench_json = Path(argv[argv.index("--out") + 1]) / "bench.json"
    data = json.loads(bench_json.read_text()) if bench_json.is_file() else None
    return done, data


def fresh_folder(path: Path) -> Path:
    """`path`, or path_2, path_3, ... where an earlier bench of the run wrote there."""
    out, n = path, 2
    while out.exists():
        out, n = path.with_name(f"{path.name}_{n}"), n + 1
    return out


def levels_summary(data: dict[str, Any]) -> dict[str, Any]:
    rows = data.get("results", [])
    return {
        "levels": len(rows),
        "levels_without_finished_requests": [f"{r['series']} c={r['concurrency']}"
                                             for r in rows if r["requests"] == 0],
        "levels_with_errors": [f"{r['series']} c={r['concurrency']}: {r['errors']}"
                               for r in rows if r["errors"]],
        "tok_per_s": {f"{r['series']} c={r['concurrency']}": r["output_tok_per_s"]
                      for r in rows},
    }


def family_files(run: Run) -> dict[str, Path]:
    """The prompt file of each --bench-families name (the trace's dataset of that name, else
    the seeded family), checked before any bench starts."""
    names = [n.strip() for n in run.opts.bench_families.split(",") if n.strip()]
    families = {**run.families(),
                **{k: Path(v) for k, v in trace_datasets(run.opts.trace_datasets).items()}}
    missing = [n for n in names if n not in families]
    if missing:
        raise StepError(f"--bench-families: no family {missing[0]!r} in this run (it has: "
                        f"{', '.join(sorted(families)) or 'none'}); name one of the seeded "
                        "families or of --trace-datasets")
    return {n: families[n] for n in names}


def run(run: Run) -> dict[str, Any]:
    # The plain server's series where the run started one (--start-order spec: none).
    plain = [servers.PLAIN] if run.state.url(servers.PLAIN) is not None else []
    run.require_servers(servers.SPEC, *plain)
    more = family_files(run)
    result = bench_once(run, plain, run.dataset(), fresh_folder(run.dir / "bench"))
    failed = [] if result["returncode"] == 0 else [result["folder"]]
    for name, path in more.items():
        run.say(f"  family {name} ({path.name}):")
        family = bench_once(run, plain, path, fresh_folder(run.dir / f"bench_{name}"))
        result.setdefault("families", {})[name] = family
        failed += [] if family["returncode"] == 0 else [family["folder"]]
    if failed:
        raise StepError(f"bench: {', '.join(failed)} cut short (see its .txt log); the levels "
                        "measured by then are kept", result)
    return result


def bench_once(run: Run, plain: list[str], dataset: Path | None, out: Path) -> dict[str, Any]:
    """One `specctl bench` of the run's depths and levels on `dataset`, into `out`."""
    o = run.opts
    depths = o.bench_depths or o.depths
    levels = len(int_list(o.bench_concurrency, "bench-concurrency")) * (
        len(int_list(depths, "bench-depths")) + len(plain))
    extra = [*(["--no-spec-url", run.url(servers.PLAIN)] if plain else []),
             "--concurrency", o.bench_concurrency,
             "--depths", depths, "--output-tokens", str(o.output_tokens), "--freeze-gc"]
    if dataset is not None:
        extra += ["--dataset", str(dataset)]
    run.say(f"  {levels} levels of {o.level_seconds:g} s after {o.warmup_seconds:g} s of "
            f"warm-up each, into {out.name}/")
    done, data = run_bench(run, bench_argv(run, out, extra), levels,
                           out.with_name(out.name + ".txt"))
    if data is None:
        raise StepError(f"bench wrote no bench.json into {out.name}/: {done.describe()}")
    result = {"folder": out.name, "dataset": str(dataset) if dataset else None,
              "returncode": done.returncode,
              "seconds": round(done.seconds, 1), "levels_planned": levels,
              **levels_summary(data),
              "crossovers": data.get("crossovers"),
              "recommended_table": data.get("recommended_table_text"),
              "interrupted": data.get("interrupted")}
    if result["levels_without_finished_requests"]:
        run.say(f"  warning: no request finished within {o.level_seconds:g} s at "
                f"{', '.join(result['levels_without_finished_requests'])}: raise "
                "--level-seconds or lower --output-tokens")
    if done.returncode != 0:
        run.say(f"  bench {out.name}: {done.describe()}; {result['levels']} of {levels} "
                "levels measured")
    return result
