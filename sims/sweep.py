"""Closed-loop sweeps: throughput per (depth, concurrency), the no-spec baseline, the oracle.

Each point is its own simulation: `concurrency` clients in a closed loop sending requests of
fixed prompt/output lengths, a server running one fixed depth (or no speculation, or the
oracle, or SGLang's adaptive choice), measured after a warm-up.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rich.table import Table

from sims.engine import Engine, SimStats
from sims.oracle import OraclePolicy
from sims.policies import DepthPolicy, FixedDepthPolicy
from sims.profile import Profile
from sims.workload import Workload


@dataclass(frozen=True)
class SweepSpec:
    concurrency: list[int]
    depths: list[int]
    duration_s: float = 300.0
    warmup_s: float = 30.0
    prompt_tokens: int = 1024
    output_tokens: int = 256
    phase: str | None = None
    seed: int = 0
    include_adaptive: bool = True

    def points(self) -> int:
        per_c = len(self.depths) + 2 + (1 if self.include_adaptive else 0)
        return len(self.concurrency) * per_c


@dataclass(frozen=True)
class Point:
    mode: str  # "spec" | "nospec" | "oracle" | "adaptive"
    depth: int | None
    concurrency: int
    tok_per_s: float
    step_ms: float
    accept_length: float
    depth_share: dict[int, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "depth": self.depth,
            "concurrency": self.concurrency,
            "tok_per_s": round(self.tok_per_s, 2),
            "step_ms": round(self.step_ms, 3),
            "accept_length": round(self.accept_length, 4),
        }


def run_point(
    profile: Profile,
    spec: SweepSpec,
    concurrency: int,
    *,
    speculative: bool = True,
    policy: DepthPolicy | None = None,
) -> tuple[SimStats, SimStats]:
    """Stats at the end of warm-up and at the end of the run."""
    workload = Workload.closed(
        concurrency,
        prompt_tokens=spec.prompt_tokens,
        output_tokens=spec.output_tokens,
        phase=spec.phase,
    )
    engine = Engine(profile, workload, seed=spec.seed, speculative=speculative, policy=policy)
    engine.run_until(spec.warmup_s)
    start = engine.stats.copy()
    engine.run_until(spec.warmup_s + spec.duration_s)
    return start, engine.stats.copy()


def _point(mode: str, depth: int | None, c: int, a: SimStats, b: SimStats) -> Point:
    iters = b.decode_iterations - a.decode_iterations
    steps = b.request_steps - a.request_steps
    toks = b.decode_tokens - a.decode_tokens
    gpu = b.decode_gpu_seconds - a.decode_gpu_seconds
    share: dict[int, float] = {}
    if iters:
        for d, n in b.iterations_per_depth.items():
            k = n - a.iterations_per_depth.get(d, 0)
            if k:
                share[d] = k / iters
    return Point(
        mode=mode,
        depth=depth,
        concurrency=c,
        tok_per_s=b.tok_per_s_since(a),
        step_ms=1000 * gpu / iters if iters else 0.0,
        accept_length=toks / steps if steps else 0.0,
        depth_share=share,
    )


@dataclass
class SweepResult:
    profile: str
    spec: SweepSpec
    rows: list[Point]
    oracle: list[Point]
    adaptive: list[Point]

    def best_fixed(self, concurrency: int) -> Point:
        spec_rows = [r for r in self.rows if r.mode == "spec" and r.concurrency == concurrency]
        return max(spec_rows, key=lambda r: r.tok_per_s)

    def nospec(self, concurrency: int) -> Point:
        return next(r for r in self.rows if r.mode == "nospec" and r.concurrency == concurrency)

    def crossover_concurrency(self) -> int | None:
        """Smallest swept concurrency at which no speculation beats every fixed depth."""
        for c in self.spec.concurrency:
            if self.nospec(c).tok_per_s > self.best_fixed(c).tok_per_s:
                return c
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "phase": self.spec.phase,
            "duration_s": self.spec.duration_s,
            "warmup_s": self.spec.warmup_s,
            "prompt_tokens": self.spec.prompt_tokens,
            "output_tokens": self.spec.output_tokens,
            "seed": self.spec.seed,
            "rows": [r.to_json() for r in self.rows],
            "oracle": [
                {
                    "concurrency": o.concurrency,
                    "best_depth": o.depth,
                    "tok_per_s": round(o.tok_per_s, 2),
                    "depth_share": {str(d): round(s, 4) for d, s in sorted(o.depth_share.items())},
                }
                for o in self.oracle
            ],
            "adaptive": [
                {"concurrency": a.concurrency, "tok_per_s": round(a.tok_per_s, 2)}
                for a in self.adaptive
            ],
            "best_fixed_depth": [
                {
                    "concurrency": c,
                    "depth": self.best_fixed(c).depth,
                    "tok_per_s": round(self.best_fixed(c).tok_per_s, 2),
                }
                for c in self.spec.concurrency
            ],
            "crossover_concurrency": self.crossover_concurrency(),
        }


def run_sweep(
    profile: Profile, spec: SweepSpec, on_point: Callable[[], None] | None = None
) -> SweepResult:
    tick = on_point or (lambda: None)
    rows: list[Point] = []
    oracle: list[Point] = []
    adaptive: list[Point] = []
    for c in spec.concurrency:
        for d in spec.depths:
            a, b = run_point(profile, spec, c, policy=FixedDepthPolicy(d))
            rows.append(_point("spec", d, c, a, b))
            tick()
        a, b = run_point(profile, spec, c, speculative=False)
        rows.append(_point("nospec", None, c, a, b))
        tick()
        a, b = run_point(profile, spec, c, policy=OraclePolicy(profile))
        p = _point("oracle", None, c, a, b)
        main = max(p.depth_share, key=lambda d: p.depth_share[d]) if p.depth_share else None
        oracle.append(Point("oracle", main, c, p.tok_per_s, p.step_ms, p.accept_length,
                            p.depth_share))  # fmt: skip
        tick()
        if spec.include_adaptive:
            a, b = run_point(profile, spec, c)
            adaptive.append(_point("adaptive", None, c, a, b))
            tick()
    return SweepResult(profile.name, spec, rows, oracle, adaptive)


def render_table(result: SweepResult) -> list[Table]:
    """Two tables: closed-loop tok/s per concurrency, then decode step time (ms) per depth."""
    spec = result.spec
    accept = {
        d: next(r.accept_length for r in result.rows if r.mode == "spec" and r.depth == d)
        for d in spec.depths
    }
    tput = Table(
        title=(
            f"{result.profile}: closed-loop tok/s ({spec.prompt_tokens} prompt / "
            f"{spec.output_tokens} output tokens, {spec.duration_s:g} s per point)"
        )
    )
    tput.add_column("C", justify="right")
    for d in spec.depths:
        tput.add_column(f"d{d}\nL={accept[d]:.2f}", justify="right")
    tput.add_column("no spec", justify="right")
    tput.add_column("oracle", justify="right")
    if spec.include_adaptive:
        tput.add_column("sglang\nadaptive", justify="right")
    tput.add_column("best", justify="right")
    steps = Table(title=f"{result.profile}: mean decode step (ms)")
    steps.add_column("C", justify="right")
    for d in spec.depths:
        steps.add_column(f"d{d}", justify="right")
    steps.add_column("no spec", justify="right")
    for i, c in enumerate(spec.concurrency):
        best = result.best_fixed(c)
        nospec = result.nospec(c)
        cells, step_cells = [str(c)], [str(c)]
        for d in spec.depths:
            r = next(
                x for x in result.rows if x.mode == "spec" and x.depth == d and x.concurrency == c
            )
            cells.append(f"[bold]{r.tok_per_s:.1f}[/bold]" if r is best else f"{r.tok_per_s:.1f}")
            step_cells.append(f"{r.step_ms:.1f}")
        cells.append(f"{nospec.tok_per_s:.1f}")
        step_cells.append(f"{nospec.step_ms:.1f}")
        o = result.oracle[i]
        cells.append(f"{o.tok_per_s:.1f} d{o.depth}")
        if spec.include_adaptive:
            cells.append(f"{result.adaptive[i].tok_per_s:.1f}")
        cells.append("no spec" if nospec.tok_per_s > best.tok_per_s else f"d{best.depth}")
        tput.add_row(*cells)
        steps.add_row(*step_cells)
    cross = result.crossover_concurrency()
    tput.caption = (
        f"a server without speculation wins from C={cross}"
        if cross is not None
        else "speculation wins at every swept concurrency"
    )
    return [tput, steps]
