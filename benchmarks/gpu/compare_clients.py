"""`specctl bench` beside SGLang's own client on one server, the same prompts and load.

    python -m benchmarks.gpu.compare_clients --url URL --concurrency 1,16,64 --num-prompts N \
        --input-tokens 256 --output-tokens 256 --out DIR [--admin-key K] [--api-key K] \
        [--depth D] [--tokenizer PATH] [--sglang-cmd "python -m benchmarks.gpu.sglang_client"]

Both clients read one prompt file, written here in SGLang's `custom` dataset format (JSONL of
`{"conversations": [{"from": "human", "value": PROMPT}, {"from": "gpt", "value": ...}]}`,
which `specctl bench --dataset` reads as ShareGPT): `--num-prompts` prompts of
`--input-tokens` tokens (exactly, in the tokens of `--tokenizer`), every output fixed at
`--output-tokens` with EOS ignored on both (SGLang's default; specctl bench always). At each
concurrency SGLang's client sends the N prompts through `/v1/completions` (`--backend
sglang-oai`, `--max-concurrency c`, every request at once) and specctl bench measures a window
of N completed requests at c streams (`--requests-per-level N --warmup-per-level 0`), both at
the same forced depth: `--depth`, or the largest the server captured (pushed through the admin
RPC for SGLang's client, and the server's table restored after; specctl bench forces and
restores it itself). SGLang's client needs a tokenizer: `--tokenizer`, else the server's
`tokenizer_path`/`model_path` from `/server_info`.

How the two count differs, and the comparison shows it rather than hides it: SGLang's client
times its whole run, from the first request to the last reply, so its tok/s includes the tail
in which fewer than c requests remain; specctl bench keeps c streams in flight through its
window and cuts the streams still open at its end. Both take TTFT from the first chunk that
carries text, and TPOT as (latency - TTFT) / (output tokens - 1) per request.

Prints, per concurrency, tok/s and TTFT/TPOT mean, p50 and p99 of both clients and the relative
difference (specctl / SGLang - 1), and writes them to DIR/compare.json, beside the prompt file,
SGLang's result lines (DIR/sglang-c<c>.jsonl) and specctl bench's folder (DIR/specctl/).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from controller.bench.prompts import synthetic_prompts
from controller.bench.server_client import ServerClient, ServerError
from controller.bench.tokenizer import TokenizerError, load_tokenizer
from sglang_hooks.contract import single_depth_table

# The figures compared: (name, SGLang's result key, specctl's level -> value).
FIGURES = ("tok_per_s", "ttft_mean_ms", "ttft_p50_ms", "ttft_p99_ms", "tpot_mean_ms",
           "tpot_p50_ms", "tpot_p99_ms")  # fmt: skip
SGLANG_KEYS = {
    "tok_per_s": "output_throughput", "ttft_mean_ms": "mean_ttft_ms",
    "ttft_p50_ms": "median_ttft_ms", "ttft_p99_ms": "p99_ttft_ms", "tpot_mean_ms": "mean_tpot_ms",
    "tpot_p50_ms": "median_tpot_ms", "tpot_p99_ms": "p99_tpot_ms",
}  # fmt: skip
# SGLang's custom dataset refuses fixed outputs shorter than this.
MIN_OUTPUT_TOKENS = 4


class CompareError(RuntimeError):
    """A step failed; the message says which and why."""


def default_sglang_cmd() -> list[str]:
    """SGLang's client in this interpreter, through benchmarks/gpu/sglang_client.py (which lets
    it start where Hugging Face's `datasets`, which 0.5.17's client imports, is missing)."""
    return [sys.executable, "-m", "benchmarks.gpu.sglang_client"]


def write_prompts(path: Path, count: int, input_tokens: int, tokenizer: str | None,
                  seed: int) -> bool:  # fmt: skip
    """The shared prompt file; whether its prompts are exactly `input_tokens` long (with a
    tokenizer) or about that (a word per token)."""
    tok = None
    if tokenizer is not None:
        try:
            tok = load_tokenizer(tokenizer)
        except TokenizerError:
            tok = None  # SGLang's client may still load it (transformers); size approximately
    prompts = synthetic_prompts(count, input_tokens, MIN_OUTPUT_TOKENS, seed=seed, tokenizer=tok)
    with path.open("w") as fh:
        for p in prompts:
            record = {"conversations": [{"from": "human", "value": p.text},
                                        {"from": "gpt", "value": "ok"}]}  # fmt: skip
            fh.write(json.dumps(record) + "\n")
    return tok is not None


@dataclass(frozen=True)
class Plan:
    url: str
    concurrency: tuple[int, ...]
    num_prompts: int
    input_tokens: int
    output_tokens: int
    out: Path
    admin_key: str | None
    api_key: str | None
    depth: int | None
    tokenizer: str | None
    sglang_cmd: tuple[str, ...]
    seed: int

    @property
    def prompts(self) -> Path:
        return self.out / "prompts.jsonl"


def server_facts(plan: Plan) -> tuple[int, str | None, str]:
    """(depth to run, tokenizer for SGLang's client, model name) from the server."""
    with ServerClient(plan.url, plan.admin_key, api_key=plan.api_key) as server:
        info = server.server_info()
        captured = server.state().captured_depths
        model = server.model_id() or str(info.get("served_model_name") or "default")
    if not captured:
        raise CompareError(f"{plan.url} reports no captured depths: it does not speculate")
    depth = max(captured) if plan.depth is None else plan.depth
    if depth not in captured:
        raise CompareError(f"--depth {depth}: not captured by {plan.url} (captured {captured})")
    tokenizer = plan.tokenizer or info.get("tokenizer_path") or info.get("model_path")
    return depth, (str(tokenizer) if tokenizer else None), model


def _env(plan: Plan) -> dict[str, str]:
    env = {**os.environ}
    if plan.api_key:
        env["OPENAI_API_KEY"] = plan.api_key  # what SGLang's client sends as its bearer key
    return env


def run_sglang(plan: Plan, depth: int, tokenizer: str, model: str) -> dict[int, dict[str, Any]]:
    """SGLang's client at each concurrency with `depth` forced; the server's table restored."""
    results: dict[int, dict[str, Any]] = {}
    with ServerClient(plan.url, plan.admin_key, api_key=plan.api_key) as server:
        before = server.state()
        server.push(single_depth_table(depth, version=before.version + 1))
        try:
            for c in plan.concurrency:
                out = plan.out / f"sglang-c{c}.jsonl"
                out.unlink(missing_ok=True)  # SGLang appends
                cmd = [
                    *plan.sglang_cmd, "--backend", "sglang-oai", "--base-url", plan.url,
                    "--dataset-name", "custom", "--dataset-path", str(plan.prompts),
                    "--num-prompts", str(plan.num_prompts),
                    "--sharegpt-output-len", str(plan.output_tokens), "--tokenizer", tokenizer,
                    "--model", model, "--max-concurrency", str(c), "--request-rate", "inf",
                    "--seed", str(plan.seed), "--output-file", str(out), "--disable-tqdm",
                ]  # fmt: skip
                log = plan.out / f"sglang-c{c}.log"
                with log.open("w") as fh:
                    done = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT,
                                          env=_env(plan), cwd=plan.out, check=False)  # fmt: skip
                if done.returncode != 0 or not out.is_file():
                    tail = log.read_text()[-800:]
                    raise CompareError(f"SGLang's client at c={c} failed ({done.returncode}); "
                                       f"{log}:\n{tail}")  # fmt: skip
                results[c] = json.loads(out.read_text().splitlines()[-1])
        finally:
            server.push(before.table)
    return results


def run_specctl(plan: Plan, depth: int, model: str) -> dict[int, dict[str, Any]]:
    """specctl bench at the same levels, on the same prompts, at the same depth."""
    folder = plan.out / "specctl"
    cmd = [
        sys.executable, "-m", "controller.cli", "bench", "--url", plan.url,
        "--depths", str(depth), "--concurrency", ",".join(map(str, plan.concurrency)),
        "--requests-per-level", str(plan.num_prompts), "--warmup-per-level", "0",
        "--dataset", str(plan.prompts), "--output-tokens", str(plan.output_tokens),
        "--model", model, "--percentiles", "50,99", "--out", str(folder),
    ]  # fmt: skip
    if plan.admin_key:
        cmd += ["--admin-key", plan.admin_key]
    if plan.api_key:
        cmd += ["--api-key", plan.api_key]
    log = plan.out / "specctl.log"
    with log.open("w") as fh:
        done = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, check=False,
                              env={**os.environ, "COLUMNS": "200"})  # fmt: skip
    if done.returncode != 0:
        raise CompareError(f"specctl bench failed ({done.returncode}); {log}:\n"
                           f"{log.read_text()[-800:]}")  # fmt: skip
    report = json.loads((folder / "bench.json").read_text())
    return {int(r["concurrency"]): r for r in report["results"]}


def specctl_figures(level: dict[str, Any]) -> dict[str, float | None]:
    lat = level.get("latency_ms") or {}

    def stat(metric: str, key: str) -> float | None:
        value = (lat.get(metric) or {}).get(key)
        return None if value is None else float(value)

    return {
        "tok_per_s": float(level["output_tok_per_s"]),
        "ttft_mean_ms": stat("ttft", "mean"), "ttft_p50_ms": stat("ttft", "p50"),
        "ttft_p99_ms": stat("ttft", "p99"), "tpot_mean_ms": stat("tpot", "mean"),
        "tpot_p50_ms": stat("tpot", "p50"), "tpot_p99_ms": stat("tpot", "p99"),
    }  # fmt: skip


def sglang_figures(result: dict[str, Any]) -> dict[str, float | None]:
    return {name: _num(result.get(key)) for name, key in SGLANG_KEYS.items()}


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) else None


@dataclass(frozen=True)
class Row:
    concurrency: int
    figure: str
    specctl: float | None
    sglang: float | None

    @property
    def relative(self) -> float | None:
        """specctl / SGLang - 1 (None where either is missing or SGLang's is 0)."""
        if self.specctl is None or not self.sglang:
            return None
        return self.specctl / self.sglang - 1


def compare(specctl: dict[int, dict[str, Any]], sglang: dict[int, dict[str, Any]],
            levels: Sequence[int]) -> list[Row]:  # fmt: skip
    rows = []
    for c in levels:
        ours = specctl_figures(specctl[c]) if c in specctl else {}
        theirs = sglang_figures(sglang[c]) if c in sglang else {}
        rows += [Row(c, f, ours.get(f), theirs.get(f)) for f in FIGURES]
    return rows


def render(rows: Sequence[Row]) -> str:
    def fmt(v: float | None) -> str:
        return "-" if v is None else f"{v:,.2f}"

    lines = [f"{'conc':>5} {'figure':<13} {'specctl':>12} {'sglang':>12} {'specctl/sglang-1':>17}"]
    for r in rows:
        rel = "-" if r.relative is None else f"{r.relative:+.1%}"
        lines.append(f"{r.concurrency:>5} {r.figure:<13} {fmt(r.specctl):>12} "
                     f"{fmt(r.sglang):>12} {rel:>17}")  # fmt: skip
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None = None) -> Plan:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu.compare_clients",
        description="specctl bench and SGLang's bench_serving on one server, same prompts.",
    )
    ap.add_argument("--url", required=True, help="The speculative server")
    ap.add_argument("--concurrency", default="1,16,64", help="Comma-separated levels")
    ap.add_argument("--num-prompts", type=int, default=256, help="Requests per level")
    ap.add_argument("--input-tokens", type=int, default=256)
    ap.add_argument("--output-tokens", type=int, default=256)
    ap.add_argument("--out", type=Path, required=True, help="Folder for the files")
    ap.add_argument("--admin-key", default=os.environ.get("SPECCTL_ADMIN_KEY") or None)
    ap.add_argument("--api-key", default=os.environ.get("SPECCTL_API_KEY") or None)
    ap.add_argument("--depth", type=int, default=None,
                    help="Depth both run at (default: the largest the server captured)")
    ap.add_argument("--tokenizer", default=None,
                    help="The model's tokenizer (default: the server's tokenizer_path)")
    ap.add_argument("--sglang-cmd", default=None,
                    help="How to run SGLang's client (default: this Python's "
                    "-m benchmarks.gpu.sglang_client, SGLang's bench_serving)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    try:
        levels = tuple(sorted({int(x) for x in a.concurrency.split(",")}))
    except ValueError:
        ap.error(f"--concurrency: {a.concurrency!r} is not a list of integers like 1,16,64")
    if not levels or min(levels) < 1:
        ap.error("--concurrency: levels must be >= 1")
    if a.num_prompts < 1 or a.input_tokens < 2:
        ap.error("--num-prompts must be >= 1 and --input-tokens >= 2")
    if a.output_tokens < MIN_OUTPUT_TOKENS:
        ap.error(f"--output-tokens must be >= {MIN_OUTPUT_TOKENS} (SGLang's custom dataset)")
    cmd = tuple(shlex.split(a.sglang_cmd)) if a.sglang_cmd else tuple(default_sglang_cmd())
    return Plan(a.url.rstrip("/"), levels, a.num_prompts, a.input_tokens, a.output_tokens,
                a.out, a.admin_key, a.api_key, a.depth, a.tokenizer, cmd, a.seed)  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    plan = parse_args(argv)
    plan.out.mkdir(parents=True, exist_ok=True)
    try:
        depth, tokenizer, model = server_facts(plan)
        if tokenizer is None:
            raise CompareError("no tokenizer: pass --tokenizer (SGLang's client needs one)")
        exact = write_prompts(plan.prompts, plan.num_prompts, plan.input_tokens, tokenizer,
                              plan.seed)  # fmt: skip
        print(f"{plan.num_prompts} prompts of {'' if exact else '~'}{plan.input_tokens} tokens, "
              f"{plan.output_tokens} output tokens, depth {depth}, model {model}: {plan.prompts}",
              flush=True)  # fmt: skip
        sglang = run_sglang(plan, depth, tokenizer, model)
        specctl = run_specctl(plan, depth, model)
    except (CompareError, ServerError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    rows = compare(specctl, sglang, plan.concurrency)
    print(render(rows))
    doc = {
        "url": plan.url, "depth": depth, "model": model, "tokenizer": tokenizer,
        "num_prompts": plan.num_prompts, "input_tokens": plan.input_tokens,
        "exact_input_tokens": exact, "output_tokens": plan.output_tokens,
        "concurrency": list(plan.concurrency), "sglang_cmd": list(plan.sglang_cmd),
        "rows": [{**asdict(r), "relative": r.relative} for r in rows],
        "sglang_raw": {str(c): {k: v for k, v in r.items() if k != "server_info"}
                       for c, r in sglang.items()},
    }  # fmt: skip
    (plan.out / "compare.json").write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {plan.out / 'compare.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
