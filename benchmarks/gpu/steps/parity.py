"""`parity`: depth 0 against the plain server in paired series, judged pooled over the run.

As the twenty-eighth run measured it: once per start of the servers, an unreported warm pass
(depth 0 and the plain server at every level, so that large batches' kernels compile outside
the measured windows), then both servers' garbage collectors frozen (SGLang's /freeze_gc: a
collection of what a server holds after start-up stalls every request for half a second).
Then --parity-series paired series (`specctl bench --depths 0 --no-spec-url PLAIN --paired`:
at every load depth 0 and the plain server back to back on the same requests), the order
alternating by series (`--plain-first` on even ones) so that an order effect pools out, each
series on prompts drawn afresh from the dataset's words (none repeats while a prefix cache
holds it) with output lengths spread over --output-spread (requests end one by one, not in
waves). Series are numbered on across commands in one folder (parity/, or parity_TAG/), and
the verdict, `python -m benchmarks.gpu.parity` over every series there, is rewritten after
each command: the pooled tok/s ratio per level with its 90% interval.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

from benchmarks.gpu import servers
from benchmarks.gpu.context import Run, StepError
from benchmarks.gpu.options import int_list, output_span
from benchmarks.gpu.seeded.datasets import fresh_prompts, spread_outputs, write_family
from benchmarks.gpu.steps.bench import bench_argv, run_bench
from controller.bench.prompts import DatasetError, load_dataset
from controller.bench.server_client import ServerClient, ServerError

SERIES = "series_"
WARM_SEED = 1000  # the warm pass's draws start here, the series' at their number
WARM_LEVEL_S, WARM_WARMUP_S = 2.0, 0.5


def folder(run: Run) -> Path:
    return run.dir / ("parity_" + run.opts.parity_tag if run.opts.parity_tag else "parity")


def series_numbers(out: Path) -> list[int]:
    return sorted(int(p.name[len(SERIES):]) for p in out.glob(f"{SERIES}*")
                  if p.is_dir() and p.name[len(SERIES):].isdigit())


def plain_first(order: str, number: int) -> bool:
    """Whether series `number` runs the plain server first at each load."""
    return order == "plain-first" or (order == "alternate" and number % 2 == 0)


def source_rows(run: Run) -> tuple[list[dict[str, object]], str]:
    """The prompts the draws start from: the run's dataset, or synthetic prompts."""
    path = run.prompt_file()
    try:
        prompts = load_dataset(path, run.opts.output_tokens)
    except DatasetError as err:
        raise StepError(str(err)) from None
    return [{"prompt": p.text, "output_tokens": p.output_tokens} for p in prompts], str(path)


def draw(run: Run, rows: list[dict[str, object]], base_seed: int) -> tuple[Path, int]:
    """A prompt set for one bench: fresh prompts and spread output lengths, from the first seed
    at or above `base_seed` that no earlier draw of this run used (a server's prefix cache may
    still hold an earlier draw's prompts)."""
    o = run.opts
    prompts = run.dir / "prompts"
    prompts.mkdir(parents=True, exist_ok=True)
    seed = base_seed
    while (prompts / f"draw_{seed}.jsonl").exists():
        seed += 1
    if o.fresh_prompts:
        rows = fresh_prompts(rows, o.fresh_prompts, seed=seed)
    span = output_span(o.output_spread)
    if span is not None:
        rows = spread_outputs(rows, *span, seed=seed)
    path = prompts / f"draw_{seed}.jsonl"
    write_family(path, rows)
    return path, seed


def load_args(run: Run, dataset: Path) -> list[str]:
    """The bench's prompts; every request --output-tokens long unless spread."""
    fixed = [] if output_span(run.opts.output_spread) else [
        "--output-tokens", str(run.opts.output_tokens)]
    return ["--dataset", str(dataset), *fixed]


def series_args(run: Run, number: int, dataset: Path) -> list[str]:
    """`specctl bench` arguments of series `number`: depth 0 and the plain server paired at
    each load, the plain server first where --parity-order says so for this number."""
    o = run.opts
    order = ["--plain-first"] if plain_first(o.parity_order, number) else []
    return ["--depths", "0", "--no-spec-url", run.url(servers.PLAIN), "--paired", *order,
            "--concurrency", o.parity_streams, *load_args(run, dataset)]


def warm_and_freeze(run: Run, out: Path, rows: list[dict[str, object]]) -> dict[str, Any]:
    o = run.opts
    dataset, seed = draw(run, rows, WARM_SEED)
    levels = 2 * len(int_list(o.parity_streams, "parity-streams"))
    level_s, warmup_s = min(WARM_LEVEL_S, o.level_seconds), min(WARM_WARMUP_S, o.warmup_seconds)
    argv = bench_argv(run, out / "warm", [
        "--depths", "0", "--no-spec-url", run.url(servers.PLAIN), "--concurrency",
        o.parity_streams, *load_args(run, dataset)], level_s, warmup_s)
    run.say(f"  warm pass (not reported): depth 0 and plain at {o.parity_streams} streams")
    done, data = run_bench(run, argv, levels, out / "warm.txt", level_s)
    frozen: dict[str, Any] = {}
    for role in (servers.SPEC, servers.PLAIN):
        try:
            with ServerClient(run.url(role), run.admin_key) as client:
                client.freeze_gc()
            frozen[role] = True
        except ServerError as err:
            frozen[role] = str(err)
            run.say(f"  warning: the {role} server's garbage collector is not frozen: {err}")
    run.say(f"  garbage collectors frozen: {frozen}")
    return {"returncode": done.returncode, "seconds": round(done.seconds, 1), "seed": seed,
            "levels": len((data or {}).get("results", [])), "gc_frozen": frozen}


def series_seconds(run: Run) -> float:
    """What one series takes, about: each level's warm-up and window and a little drain."""
    levels = 2 * len(int_list(run.opts.parity_streams, "parity-streams"))
    return levels * (run.opts.level_seconds + run.opts.warmup_seconds + 3.0) + 10.0


def verdict(run: Run, out: Path) -> dict[str, Any]:
    """`python -m benchmarks.gpu.parity` over every series in `out`: parity.txt, parity.json."""
    from benchmarks.gpu import parity as parity_cli  # scipy: loaded when a verdict is due

    found = [out / f"{SERIES}{n}" for n in series_numbers(out)]
    if not found:
        raise StepError(f"no series in {out} to judge")
    text = io.StringIO()
    with contextlib.redirect_stdout(text), contextlib.redirect_stderr(text):
        code = parity_cli.main([*map(str, found), "--json", str(out / "parity.json")])
    (out / "parity.txt").write_text(text.getvalue())
    if code != 0:
        lines = text.getvalue().strip().splitlines()
        raise StepError(f"the verdict failed: {lines[-1] if lines else f'exit status {code}'}")
    data = json.loads((out / "parity.json").read_text())
    levels = [{"concurrency": p["concurrency"], "pooled_ratio": round(p["pooled_ratio"], 4),
               "interval": p.get("interval"), "runs": len(p["ratios"]),
               "tpot_change": round(p["tpot_change"], 4),
               "orders_equal_ratio": p.get("orders_equal_ratio")} for p in data["levels"]]
    for line in text.getvalue().splitlines()[:len(levels) + 5]:
        run.say("  " + line)
    return {"series_judged": len(found), "levels": levels, "left_out": data.get("left_out")}


def run(run: Run) -> dict[str, Any]:
    run.require_servers()
    o = run.opts
    out = folder(run)
    out.mkdir(parents=True, exist_ok=True)
    rows, where = source_rows(run)
    result: dict[str, Any] = {"folder": out.name, "prompts_from": where, "series": []}
    pids = {role: int(run.state.servers[role]["pid"]) for role in (servers.SPEC, servers.PLAIN)}
    if run.state.data.get("parity_warmed_pids") != pids:
        result["warm"] = warm_and_freeze(run, out, rows)
        run.state.data["parity_warmed_pids"] = pids
        run.state.save()
    else:
        run.say("  these servers were warmed and frozen by an earlier parity command")
    first = max(series_numbers(out), default=0) + 1
    failures: list[str] = []
    for number in range(first, first + o.parity_series):
        if run.time_left() < series_seconds(run) + 30:
            result["cut_by_budget"] = f"series {number} on left out: the --budget is spent"
            run.say(f"  {result['cut_by_budget']}")
            break
        dataset, seed = draw(run, rows, number)
        first_server = "plain" if plain_first(o.parity_order, number) else "d0"
        run.say(f"  series {number}: depth 0 and plain at {o.parity_streams} streams, paired, "
                f"{first_server} first (prompts seed {seed})")
        argv = bench_argv(run, out / f"{SERIES}{number}", series_args(run, number, dataset))
        levels = 2 * len(int_list(o.parity_streams, "parity-streams"))
        done, data = run_bench(run, argv, levels, out / f"{SERIES}{number}.txt")
        entry = {"series": number, "first": first_server, "seed": seed,
                 "returncode": done.returncode, "seconds": round(done.seconds, 1),
                 "levels": len((data or {}).get("results", []))}
        result["series"].append(entry)
        if done.returncode != 0 or data is None:
            failures.append(f"series {number}: {done.describe()}")
        run.state.step("parity").update(status="running", result=result)
        run.checkpoint()  # what ran so far comes back if the command is cut after this
    result["verdict"] = verdict(run, out)
    if failures:
        raise StepError("; ".join(failures), result)
    return result
