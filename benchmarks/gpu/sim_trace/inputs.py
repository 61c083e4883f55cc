"""What a simulated trace takes from a GPU run's folder: the trace and its results, the bench,
and the accept length of each of the trace's datasets. Each missing piece is one error naming
the file and the step (or option) that provides it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.gpu.seeded.trace import Phase, TraceError, parse_phases
from benchmarks.gpu.steps.trace import closed_loop_name
from sims.fit.bench_file import BenchFileError, BenchRun, load_bench
from sims.fit.framing import UNIFORM_MIDDLE, output_range
from sims.workload import FixedLength, LengthDist, UniformLength

HARNESS = "python -m benchmarks.gpu"


class SimTraceError(RuntimeError):
    """Input the simulated trace cannot use; the message names it and the fix."""


@dataclass(frozen=True)
class RealTrace:
    """RUN/trace/closed_loop.json and what trace.json beside it adds."""

    folder: Path  # RUN/trace
    doc: dict[str, Any]
    phases: list[Phase]
    policies: dict[str, list[float]]  # closed_loop.json's names -> tok/s per repeat
    files: dict[str, str]  # dataset name -> the prompt file the trace sent (older runs: none)
    same_runs: dict[str, str]  # a policy whose runs are another's (closed_loop.json's same_runs)


def _json(path: Path, fix: str) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise SimTraceError(f"{path}: no such file; {fix}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise SimTraceError(f"{path}: not readable as JSON ({err}); {fix}") from None


def read_trace(run_dir: Path) -> RealTrace:
    folder = run_dir / "trace"
    path = folder / "closed_loop.json"
    fix = f"run the trace step first ({HARNESS} trace --run-dir {run_dir})"
    doc = _json(path, fix)
    policies = doc.get("policies") if isinstance(doc, dict) else None
    if not isinstance(policies, dict) or not policies:
        raise SimTraceError(f"{path}: no policy results ('policies' is empty or missing); {fix}")
    try:
        phases = parse_phases(str(doc.get("phases") or ""))
    except TraceError as err:
        raise SimTraceError(f"{path}: phases: {err}".replace("--phases", "the trace")) from None
    runs: dict[str, list[float]] = {}
    for name, values in policies.items():
        if not isinstance(values, list) or not all(
            isinstance(v, int | float) and not isinstance(v, bool) for v in values
        ):
            raise SimTraceError(f"{path}: policies.{name}: give a list of tok/s, got {values!r}")
        if values:
            runs[name] = [float(v) for v in values]
    files: dict[str, str] = {}
    meta = folder / str(doc.get("trace") or "trace.json")
    if meta.is_file():
        described = _json(meta, "rerun the trace step")
        if isinstance(described, dict) and isinstance(described.get("files"), dict):
            files = {str(k): str(v) for k, v in described["files"].items()}
    same = doc.get("same_runs") if isinstance(doc.get("same_runs"), dict) else {}
    return RealTrace(folder, doc, phases, runs, files,
                     {str(k): str(v) for k, v in same.items() if v in runs})


def run_files(folder: Path) -> list[tuple[Path, dict[str, Any]]]:
    """The trace step's file of each run in `folder` (LABEL.json: its trace and phases); what
    is not one (closed_loop.json, trace.json, an unreadable file) is passed over."""
    out = []
    for path in sorted(folder.glob("*.json")):
        try:
            doc = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            continue
        if isinstance(doc, dict) and "trace" in doc and isinstance(doc.get("phases"), list):
            out.append((path, doc))
    return out


def real_phases(trace: RealTrace) -> dict[str, list[float]]:
    """Per closed_loop.json policy, each phase's tok/s, mean of its repeats, from the file of
    each run the trace step wrote beside it (RUN/trace/LABEL.json); {} where none has them."""
    found: dict[str, list[list[float]]] = {}
    for path, doc in run_files(trace.folder):
        name, _ = closed_loop_name(str(doc.get("name") or path.stem))
        rows = [r.get("tok_per_s") if isinstance(r, dict) else None for r in doc["phases"]]
        if name in trace.policies and len(rows) == len(trace.phases) and all(
                isinstance(v, int | float) for v in rows):
            found.setdefault(name, []).append([float(v) for v in rows])  # type: ignore[arg-type]
    return {n: [sum(col) / len(col) for col in zip(*r, strict=True)] for n, r in found.items()}


def read_bench(run_dir: Path, given: Path | None) -> tuple[Path, BenchRun]:
    """The run's bench (RUN/bench, or --bench): its bench.json and what it measured."""
    folder = given if given is not None else run_dir / "bench"
    path = folder / "bench.json" if folder.is_dir() or folder.suffix != ".json" else folder
    if not path.is_file():
        raise SimTraceError(
            f"no bench at {path}: run the bench step ({HARNESS} bench --run-dir {run_dir}), "
            "or give --bench DIR (a `specctl bench --out` folder)"
        )
    try:
        return path, load_bench(path)
    except BenchFileError as err:
        raise SimTraceError(str(err)) from None


def parse_accept(text: str) -> tuple[str, dict[int, float]]:
    """--accept NAME=DEPTH:LENGTH,... (e.g. a=1:1.82,3:3.05): a dataset's accept lengths."""
    name, sep, rest = text.partition("=")
    example = "e.g. --accept a=1:1.82,3:3.05"
    if not sep or not name.strip() or not rest.strip():
        raise SimTraceError(f"--accept {text!r}: write NAME=DEPTH:LENGTH,..., {example}")
    lengths: dict[int, float] = {}
    for item in rest.split(","):
        depth, colon, length = item.strip().partition(":")
        try:
            d, value = int(depth), float(length)
        except ValueError:
            d, value = -1, 0.0
        if not colon or d < 1 or not 1.0 <= value <= d + 1:
            raise SimTraceError(
                f"--accept {text!r}: item {item.strip()!r} is not DEPTH:LENGTH with depth >= 1 "
                f"and 1 <= length <= depth + 1; {example}"
            )
        lengths[d] = value
    return name.strip(), lengths


def family_of(name: str, files: dict[str, str]) -> list[str]:
    """The acceptance step's names the dataset `name` may go by: its prompt file's stem (the
    step names a family so), else the name and the seeded pair's family_NAME."""
    if name in files:
        return [Path(files[name]).stem]
    return [name, f"family_{name}"]


def accept_lengths(
    run_dir: Path, names: list[str], files: dict[str, str], given: dict[str, dict[int, float]]
) -> tuple[dict[str, dict[int, float]], str]:
    """Accept length per depth of each dataset, and where they came from: --accept where
    given, else RUN/acceptance/acceptance.json's family for the dataset's prompt file."""
    out = {n: given[n] for n in names if n in given}
    rest = [n for n in names if n not in out]
    if not rest:
        return out, "--accept"
    path = run_dir / "acceptance" / "acceptance.json"
    by_hand = " ".join(f"--accept {n}=1:L1,3:L3" for n in rest)
    doc = _json(path, f"run the acceptance step while the servers are up ({HARNESS} "
                      f"acceptance --run-dir {run_dir}), or give them by hand: {by_hand}")
    families = doc.get("families") if isinstance(doc, dict) else None
    if not isinstance(families, dict):
        raise SimTraceError(f"{path}: no 'families'; rerun the acceptance step")
    for name in rest:
        keys = [k for k in family_of(name, files) if k in families]
        if not keys:
            sought = " or ".join(family_of(name, files))
            raise SimTraceError(
                f"the trace's dataset {name!r} has no accept lengths in {path} (no family "
                f"{sought}; it measured {', '.join(sorted(families))}): give them by hand, "
                f"--accept {name}=1:L1,3:L3"
            )
        rows = families[keys[0]].get("depths") or []
        out[name] = {int(r["depth"]): float(r["accept_length"]) for r in rows
                     if r.get("accept_length") is not None and int(r["depth"]) >= 1}
        if not out[name]:
            raise SimTraceError(f"{path}: family {keys[0]} has no accept length at any depth; "
                                f"rerun the acceptance step, or give --accept {name}=1:L1,3:L3")
    return out, str(path) if not given else f"{path} and --accept"


def request_lengths(run: BenchRun) -> tuple[LengthDist, LengthDist]:
    """Prompt and output lengths of the trace's requests: the bench's, as `specctl sim fit`
    frames them (the median over its levels of what the server counted; outputs over the
    range the levels spread them evenly over, where they all did)."""
    levels = [lv for lv in run.levels if lv.prompt_tokens and lv.output_tokens]
    if not levels:
        raise SimTraceError(f"{run.path}: no level has a request shape (prompt and output "
                            "tokens the server counted); bench again with this version")
    prompt = max(1, round(float(np.median([lv.prompt_tokens for lv in levels]))))
    output = max(1, round(float(np.median([lv.output_tokens for lv in levels]))))
    ranges = {output_range(lv) for lv in levels}
    if len(ranges) == 1 and (spread := next(iter(ranges))) is not None:
        return FixedLength(value=prompt), UniformLength(low=spread[0], high=spread[1])
    return FixedLength(value=prompt), FixedLength(value=output)


def trace_lengths(folder: Path) -> tuple[LengthDist, LengthDist] | None:
    """Prompt and output lengths of the requests the trace sent, from its runs' files
    (RUN/trace/<policy>.json: the prompt tokens the server counted, the output tokens asked),
    or None where they did not record them (a run older than that)."""
    prompts: list[tuple[float, float]] = []  # (mean, weight)
    asked: list[tuple[int, int]] = []
    outputs: list[tuple[float, float]] = []  # (mean asked, weight)
    for _, doc in run_files(folder):
        for ph in doc["phases"]:
            if not isinstance(ph, dict) or ph.get("max_tokens_min") is None:
                continue
            weight = float(ph.get("completed") or 0) + 1.0
            if ph.get("prompt_tokens_mean") is not None:
                prompts.append((float(ph["prompt_tokens_mean"]), weight))
            asked.append((int(ph["max_tokens_min"]), int(ph["max_tokens_max"])))
            if ph.get("max_tokens_mean") is not None:
                outputs.append((float(ph["max_tokens_mean"]), weight))
    if not prompts or not asked:
        return None
    prompt = max(1, round(sum(m * w for m, w in prompts) / sum(w for _, w in prompts)))
    low, high = min(lo for lo, _ in asked), max(hi for _, hi in asked)
    mean = sum(m * w for m, w in outputs) / sum(w for _, w in outputs) if outputs \
        else (low + high) / 2
    # as `specctl sim fit` frames a bench (sims.fit.framing.output_range): a range only where
    # the lengths spread about evenly over it, else their mean
    output: LengthDist = (
        FixedLength(value=low) if low == high
        else UniformLength(low=low, high=high)
        if abs(mean - (low + high) / 2) <= UNIFORM_MIDDLE * (high - low)
        else FixedLength(value=max(1, round(mean))))  # fmt: skip
    return FixedLength(value=prompt), output
