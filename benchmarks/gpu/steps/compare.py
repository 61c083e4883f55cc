"""`compare`: `specctl bench` beside SGLang's own client (`sglang.bench_serving`) on the
speculative server, the same prompts, concurrency, request count and depth at each level
(benchmarks/gpu/compare_clients.py), into compare/c<streams>/ and compare/compare.txt.

Each level sends --compare-waves requests per stream (at least --compare-min-requests), so a
level at 64 streams runs several waves as one at 1 stream does, and neither client's tail (the
last requests of a run, when fewer than c remain) weighs more at one level than another.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from benchmarks.gpu import servers
from benchmarks.gpu.context import Run, StepError
from benchmarks.gpu.cpus import pinned_argv
from benchmarks.gpu.options import int_list
from benchmarks.gpu.subproc import run_logged

PER_TOKEN_S = 0.03  # a generous bound on one stream's time per token, for the timeout


def requests_at(streams: int, waves: int, minimum: int) -> int:
    """Requests a level sends: `waves` per stream, at least `minimum`."""
    return max(minimum, waves * streams)


def run(run: Run) -> dict[str, Any]:
    run.require_servers(servers.SPEC)
    o = run.opts
    levels = int_list(o.compare_concurrency, "compare-concurrency")
    folder = run.dir / "compare"
    folder.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"levels": {}}
    lines: list[str] = []
    for streams in levels:
        n = requests_at(streams, o.compare_waves, o.compare_min_requests)
        out = folder / f"c{streams}"
        argv = [sys.executable, "-m", "benchmarks.gpu.compare_clients",
                "--url", run.url(servers.SPEC), "--admin-key", run.admin_key,
                "--concurrency", str(streams), "--num-prompts", str(n),
                "--input-tokens", str(o.compare_input_tokens),
                "--output-tokens", str(o.compare_output_tokens), "--out", str(out)]
        if o.compare_depth is not None:
            argv += ["--depth", str(o.compare_depth)]
        models = run.models()
        if models is not None:  # the target's folder holds its tokenizer, which both need
            argv += ["--tokenizer", models.target]
        if o.compare_sglang_cmd:
            argv += ["--sglang-cmd", o.compare_sglang_cmd]
        run.say(f"  {streams} streams: {n} requests of {o.compare_input_tokens} prompt and "
                f"{o.compare_output_tokens} output tokens, each client in turn")
        # both clients, each running n / streams waves of requests
        timeout = 2 * (n / streams) * o.compare_output_tokens * PER_TOKEN_S + 120
        done = run_logged(pinned_argv(o.bench_cpus, argv), folder / f"c{streams}.txt",
                          run.cap(timeout), env={"HF_HUB_OFFLINE": "1"})
        doc_path = out / "compare.json"
        if done.returncode != 0 or not doc_path.is_file():
            result["levels"][str(streams)] = {"error": done.describe()}
            raise StepError(f"compare at {streams} streams: {done.describe()} (see "
                            f"compare/c{streams}.txt)", result)
        doc = json.loads(doc_path.read_text())
        result["depth"] = doc["depth"]
        result["levels"][str(streams)] = {
            r["figure"]: {"specctl": r["specctl"], "sglang": r["sglang"],
                          "relative": r["relative"]} for r in doc["rows"]}
        lines.append((folder / f"c{streams}.txt").read_text())
        run.checkpoint()
    (folder / "compare.txt").write_text("\n".join(lines))
    (folder / "compare.json").write_text(json.dumps(result, indent=2) + "\n")
    return result

