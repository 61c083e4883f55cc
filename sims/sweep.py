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

from sims.engine import Engine, Lane, SimStats
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
    output_tokens: int | tuple[int, int] = 256  # (low, high): each request's drawn evenly
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
    decode_iterations: int = 0  # in the scored window
    completed: int = 0  # requests finished in the scored window

    @property
    def decoded(self) -> bool:
        """Whether any decode iteration ran in the scored window (else: prefill only)."""
        return self.decode_iterations > 0

    @property
    def enough_requests(self) -> bool:
        """At least one finished request per client in the window: past the start-up ramp.

        With fewer, the window saw mostly the first wave of prefills and the number says
        little about steady throughput."""
        return self.completed >= self.concurrency

    @property
    def scored(self) -> bool:
        return self.decoded and self.enough_requests

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "depth": self.depth,
            "concurrency": self.concurrency,
            "tok_per_s": round(self.tok_per_s, 2),
            "step_ms": round(self.step_ms, 3) if self.decoded else None,
            "accept_length": round(self.accept_length, 4) if self.decoded else None,
            "decode_iterations": self.decode_iterations,
            "completed_requests": self.completed,
            "scored": self.scored,
        }


def run_point(
    profile: Profile,
    spec: SweepSpec,
    concurrency: int,
    *,
    speculative: bool = True,
    policy: DepthPolicy | None = None,
    lanes: dict[int, Lane] | None = None,
) -> tuple[SimStats, SimStats]:
    """Stats at the end of warm-up and at the end of the run (`lanes`: a switching shape
    server's, `sims.shape_server.switching_server`)."""
    workload = Workload.closed(
        concurrency,
        prompt_tokens=spec.prompt_tokens,
        output_tokens=spec.output_tokens,
        phase=spec.phase,
    )
    engine = Engine(profile, workload, seed=spec.seed, speculative=speculative, policy=policy,
                    lanes=lanes)  # fmt: skip
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
        decode_iterations=iters,
        completed=b.completed_requests - a.completed_requests,
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

    def scored(self, concurrency: int) -> bool:
        """Every fixed depth and the no-spec server were measured in steady state at this
        concurrency, so they can be compared."""
        return all(r.scored for r in self.rows if r.concurrency == concurrency)

    def unscored_concurrency(self) -> list[int]:
        return [c for c in self.spec.concurrency if not self.scored(c)]

    def crossover_concurrency(self) -> int | None:
        """Smallest scored concurrency at which no speculation beats every fixed depth."""
        for c in self.spec.concurrency:
            if self.scored(c) and self.nospec(c).tok_per_s > self.best_fixed(c).tok_per_s:
                return c
        return None

    def warnings(self) -> list[str]:
        """Why some concurrencies are left out of the comparison, and what to change."""
        out = []
        for c in self.unscored_concurrency():
            rows = [r for r in self.rows if r.concurrency == c]
            idle = [_label(r) for r in rows if not r.decoded]
            few = [_label(r) for r in rows if r.decoded and not r.enough_requests]
            why = []
            if idle:
                why.append(f"no decode iteration in the scored window ({', '.join(idle)})")
            if few:
                done = min(r.completed for r in rows if r.decoded and not r.enough_requests)
                why.append(
                    f"fewer requests finished than clients ({', '.join(few)}; as few as {done})"
                )
            out.append(
                f"C={c} not scored: {'; '.join(why)}. The {self.spec.duration_s:g} s window "
                "only saw the start-up ramp: raise --duration (and --warmup)"
            )
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "phase": self.spec.phase,
            "duration_s": self.spec.duration_s,
            "warmup_s": self.spec.warmup_s,
            "prompt_tokens": self.spec.prompt_tokens,
            "output_tokens": (
                list(self.spec.output_tokens)
                if isinstance(self.spec.output_tokens, tuple)
                else self.spec.output_tokens
            ),
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
                    "scored": self.scored(c),
                }
                for c in self.spec.concurrency
            ],
            "crossover_concurrency": self.crossover_concurrency(),
            "unscored_concurrency": self.unscored_concurrency(),
            "warnings": self.warnings(),
        }


def _label(p: Point) -> str:
    return "no spec" if p.mode == "nospec" else f"d{p.depth}"


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
                            p.depth_share, p.decode_iterations, p.completed))  # fmt: skip
        tick()
        if spec.include_adaptive:
            a, b = run_point(profile, spec, c)
            adaptive.append(_point("adaptive", None, c, a, b))
            tick()
    return SweepResult(profile.name, spec, rows, oracle, adaptive)


def _tok_cell(p: Point, bold: bool = False) -> str:
    if not p.decoded:
        return "-"
    text = f"{p.tok_per_s:.1f}"
    if not p.enough_requests:
        return f"[dim]{text}?[/dim]"
    return f"[bold]{text}[/bold]" if bold else text


def _step_cell(p: Point) -> str:
    return f"{p.step_ms:.1f}" if p.decoded else "-"


def render_table(result: SweepResult) -> list[Table]:
    """Two tables: closed-loop tok/s per concurrency, then decode step time (ms) per depth.

    A point with no decode iteration in its scored window shows `-`; one where fewer requests
    finished than there are clients is dimmed with `?`; neither counts in the `best` column or
    the caption (`SweepResult.warnings()` says why, for the caller to print)."""
    spec = result.spec
    accept: dict[int, float | None] = {}
    for d in spec.depths:
        decoded = [r for r in result.rows if r.mode == "spec" and r.depth == d and r.decoded]
        accept[d] = decoded[0].accept_length if decoded else None
    tput = Table(
        title=(
            f"{result.profile}: closed-loop tok/s ({spec.prompt_tokens} prompt / "
            f"{_length(spec.output_tokens)} output tokens, {spec.duration_s:g} s per point)"
        )
    )
    tput.add_column("C", justify="right")
    for d in spec.depths:
        length = "-" if accept[d] is None else f"{accept[d]:.2f}"
        tput.add_column(f"d{d}\nL={length}", justify="right")
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
        scored = result.scored(c)
        cells, step_cells = [str(c)], [str(c)]
        for d in spec.depths:
            r = next(
                x for x in result.rows if x.mode == "spec" and x.depth == d and x.concurrency == c
            )
            cells.append(_tok_cell(r, bold=scored and r is best))
            step_cells.append(_step_cell(r))
        cells.append(_tok_cell(nospec))
        step_cells.append(_step_cell(nospec))
        o = result.oracle[i]
        cells.append(_tok_cell(o) + ("" if o.depth is None else f" d{o.depth}"))
        if spec.include_adaptive:
            cells.append(_tok_cell(result.adaptive[i]))
        if not scored:
            cells.append("-")
        else:
            cells.append("no spec" if nospec.tok_per_s > best.tok_per_s else f"d{best.depth}")
        tput.add_row(*cells)
        steps.add_row(*step_cells)
    cross = result.crossover_concurrency()
    unscored = result.unscored_concurrency()
    if cross is not None:
        caption = f"a server without speculation wins from C={cross}"
    elif unscored and len(unscored) == len(spec.concurrency):
        caption = "no concurrency could be scored"
    elif unscored:
        caption = "speculation wins at every scored concurrency"
    else:
        caption = "speculation wins at every swept concurrency"
    if unscored:
        listed = ", ".join(map(str, unscored))
        caption += f"; not scored: C={listed} (-: no decode, ?: too few requests)"
    tput.caption = caption
    return [tput, steps]


def _length(tokens: int | tuple[int, int]) -> str:
    return f"{tokens[0]}-{tokens[1]}" if isinstance(tokens, tuple) else str(tokens)
