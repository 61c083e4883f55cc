"""What the server did under a daemon, phase by phase of a GPU trace, from the daemon's store.

    python -m benchmarks.gpu.store_phases RUN_DIR/trace [--skip-s 1]

For each daemon run of the trace step (LABEL.json with its store LABEL.sqlite beside it), per
phase: the server's output tok/s as the plugin counted it, and per depth the decode
iterations, their GPU seconds, tokens per decode GPU second (what the learner's model
maximises) and the share of the phase's wall time the decode GPU time covers. Where that
share is far below 1 (prefills, scheduling between iterations), a depth that wins per decode
second can lose per wall second. `--skip-s` leaves each phase's first seconds out (the load
moving in). Exit status 2 with one line where the folder holds no daemon run.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from controller.daemon.store import Store, StoreError
from models.samples import chain_samples


class StorePhasesError(RuntimeError):
    """A folder or file this report cannot read; the message names it and the fix."""


@dataclass
class DepthTotals:
    iterations: float = 0.0
    tokens: float = 0.0
    gpu_seconds: float = 0.0


@dataclass
class PhaseRow:
    name: str
    wall_s: float
    by_depth: dict[int, DepthTotals] = field(default_factory=dict)

    @property
    def tok_per_s(self) -> float:
        return sum(d.tokens for d in self.by_depth.values()) / self.wall_s

    @property
    def decode_share(self) -> float:
        return sum(d.gpu_seconds for d in self.by_depth.values()) / self.wall_s


def phase_rows(run_json: Path, store_path: Path, skip_s: float = 1.0) -> list[PhaseRow]:
    """Each phase of one daemon run: the samples whose interval ended inside it."""
    doc = json.loads(run_json.read_text())
    start = doc.get("trace_started_unix")
    phases = doc.get("phases")
    if not isinstance(start, int | float) or not isinstance(phases, list):
        raise StorePhasesError(f"{run_json}: no trace_started_unix or phases; rerun the trace "
                               "step (older runs lack the start time)")  # fmt: skip
    try:
        store = Store(store_path)
    except (StoreError, OSError) as err:
        raise StorePhasesError(f"{store_path}: not a daemon store ({err})") from None
    try:
        # By depth: the daemon steers chain servers (a shape server's trees it only stores).
        samples = chain_samples(s for _, s in store.samples(since=float(start)))
    finally:
        store.close()
    rows, t = [], float(start)
    for phase in phases:
        seconds = float(phase["seconds"])
        lo, hi = t + min(skip_s, seconds / 2), t + seconds
        row = PhaseRow(str(phase["name"]), hi - lo)
        for s in samples:
            if lo < s.t_end <= hi:
                d = row.by_depth.setdefault(s.depth, DepthTotals())
                d.iterations += s.iterations
                d.tokens += s.tokens
                d.gpu_seconds += s.gpu_seconds
        rows.append(row)
        t += seconds
    return rows


def _depth(depth: int) -> str:
    return "off" if depth == 0 else f"d{depth}"


def render(label: str, rows: list[PhaseRow]) -> str:
    lines = [f"## {label}", "",
             "| phase | server tok/s | decode share of wall | per depth: iterations, decode "
             "GPU s, tokens per decode GPU s |",
             "| --- | ---: | ---: | --- |"]  # fmt: skip
    for r in rows:
        depths = "; ".join(
            f"{_depth(k)} {d.iterations:,.0f} it, {d.gpu_seconds:.1f} s, "
            f"{d.tokens / d.gpu_seconds:,.0f}" if d.gpu_seconds > 0 else f"{_depth(k)} -"
            for k, d in sorted(r.by_depth.items()))  # fmt: skip
        lines.append(f"| {r.name} | {r.tok_per_s:,.0f} | {r.decode_share:.2f} | {depths} |")
    return "\n".join(lines)


def report(folder: Path, skip_s: float = 1.0) -> str:
    runs = sorted(p for p in folder.glob("*.json") if p.with_suffix(".sqlite").is_file())
    if not runs:
        raise StorePhasesError(f"{folder}: no daemon run (LABEL.json with LABEL.sqlite); give "
                               "a trace step's folder, RUN/trace")  # fmt: skip
    return "\n\n".join(render(p.stem, phase_rows(p, p.with_suffix(".sqlite"), skip_s))
                       for p in runs)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu.store_phases",
                                     description=__doc__.split("\n\n")[0])  # fmt: skip
    parser.add_argument("folder", type=Path, help="a trace step's folder (RUN/trace)")
    parser.add_argument("--skip-s", type=float, default=1.0,
                        help="seconds left out at each phase's start (default 1)")
    args = parser.parse_args(argv)
    try:
        print(report(args.folder, args.skip_s))
    except StorePhasesError as err:
        print(f"store_phases: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
