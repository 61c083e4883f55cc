"""The oracle: the best depth at every batch size from the true cost model and acceptance.

Two uses:

- `oracle_curve(profile, phase)`: for each batch size, the decode throughput of every captured
  depth and of a server without speculation, the best depth, and the crossover batch sizes
  (where the best depth changes; where no speculation beats every depth).
- `OraclePolicy`: a depth policy that, at every iteration, runs the depth maximising expected
  tokens per second for the batch actually running (its true acceptance phases and mean
  context). Run in the engine, it gives the oracle's achieved tok/s over a scenario: the ceiling
  every policy is measured against.

Both use the engine's own cost table (CUDA-graph padding included), so the oracle is exactly
consistent with what the simulator charges.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from sims.policies import graph_batch_sizes, pad_batches
from sims.profile import Profile

if TYPE_CHECKING:
    from sims.engine import Engine


def decode_curves(
    profile: Profile,
    phase: str | None = None,
    max_batch: int | None = None,
    context: float | None = None,
) -> tuple[np.ndarray, dict[int, np.ndarray], np.ndarray]:
    """(batch sizes, {depth: spec tok/s}, no-spec tok/s) of steady decode (no prefill).

    Speculative curves stop at the speculative running cap (NaN beyond it); the no-spec curve
    runs to its own cap.
    """
    phase = phase or profile.acceptance.default_phase
    cap_spec = profile.max_running(True)
    cap_nospec = profile.max_running(False)
    top = max_batch or max(cap_spec, cap_nospec)
    batch = np.arange(1, top + 1, dtype=float)
    ctx = float(context if context is not None else profile.context_tokens)
    pad = profile.scheduler.cuda_graph_padding

    def at(speculative: bool) -> tuple[np.ndarray, np.ndarray]:
        cap = profile.max_running(speculative)
        padded = pad_batches(batch, graph_batch_sizes(speculative, cap)) if pad else batch
        return padded, ctx * batch / padded  # padding rows carry no KV

    spec_b, spec_ctx = at(True)
    curves: dict[int, np.ndarray] = {}
    for d in profile.captured_depths:
        accept = profile.acceptance.expected_length(phase, d)
        ms = profile.decode_step_ms(d, spec_b, spec_ctx, accept, real_batch=batch)
        tps = batch * accept / (ms / 1000.0)
        curves[d] = np.where(batch <= cap_spec, tps, np.nan)
    nb, nctx = at(False)
    nospec = batch / (profile.decode_step_ms(None, nb, nctx, real_batch=batch) / 1000.0)
    nospec = np.where(batch <= cap_nospec, nospec, np.nan)
    return batch.astype(int), curves, nospec


@dataclass(frozen=True)
class OracleRow:
    batch: int
    best_depth: int | None  # None: beyond the speculative running cap
    tok_per_s: float  # best speculative depth's decode tok/s
    nospec_tok_per_s: float
    per_depth: dict[int, float]

    @property
    def spec_wins(self) -> bool:
        return self.best_depth is not None and self.tok_per_s > self.nospec_tok_per_s


@dataclass(frozen=True)
class OracleCurve:
    profile: str
    phase: str
    rows: list[OracleRow]

    def best_depth_changes(self) -> list[tuple[int, int, int]]:
        """(batch size, depth below, depth from here on) wherever the best depth changes."""
        out = []
        prev: int | None = None
        for r in self.rows:
            if r.best_depth is None:
                break
            if prev is not None and r.best_depth != prev:
                out.append((r.batch, prev, r.best_depth))
            prev = r.best_depth
        return out

    def nospec_crossover(self) -> int | None:
        """Smallest batch size from which a server without speculation decodes faster than
        the best depth (at equal batch size); None if speculation wins up to its cap."""
        for r in self.rows:
            if r.best_depth is None:
                return None
            if not r.spec_wins:
                return r.batch
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "profile": self.profile,
            "phase": self.phase,
            "best_depth_changes": [
                {"batch": b, "from_depth": a, "to_depth": c}
                for b, a, c in self.best_depth_changes()
            ],
            "nospec_crossover_batch": self.nospec_crossover(),
            "rows": [
                {
                    "batch": r.batch,
                    "best_depth": r.best_depth,
                    "tok_per_s": round(r.tok_per_s, 2),
                    "nospec_tok_per_s": round(r.nospec_tok_per_s, 2),
                }
                for r in self.rows
            ],
        }


def oracle_curve(
    profile: Profile, phase: str | None = None, max_batch: int | None = None
) -> OracleCurve:
    phase = phase or profile.acceptance.default_phase
    batch, curves, nospec = decode_curves(profile, phase, max_batch)
    rows = []
    for i, b in enumerate(batch):
        per = {d: float(c[i]) for d, c in curves.items() if not np.isnan(c[i])}
        if per:
            best = max(per, key=lambda d: (per[d], -d))
            rows.append(OracleRow(int(b), best, per[best], float(nospec[i]), per))
        else:
            rows.append(OracleRow(int(b), None, float("nan"), float(nospec[i]), {}))
    return OracleCurve(profile.name, phase, rows)


class OraclePolicy:
    """Per iteration, the depth with the most expected tokens per second for this batch.

    Knows what no real policy can: every running request's true acceptance phase and the
    noise-free cost model. Not an exploration policy (never probes).
    """

    name = "oracle"
    wants_feedback = False

    def __init__(self, profile: Profile) -> None:
        self.depths = list(profile.captured_depths)
        phases = list(profile.acceptance.phases)
        # expected[phase][k]: tokens per request per iteration at depth self.depths[k]
        self.expected = [
            [profile.acceptance.expected_length(p, d) for d in self.depths] for p in phases
        ]
        self.engine: Engine | None = None

    def bind(self, engine: Engine) -> None:
        self.engine = engine

    def select(self, batch_size: int) -> tuple[int, bool]:
        engine = self.engine
        if engine is None:
            raise RuntimeError("OraclePolicy must run inside an Engine (it reads the batch)")
        counts = engine.phase_counts()
        best_depth, best_rate = self.depths[0], -1.0
        for k, d in enumerate(self.depths):
            tokens = sum(c * self.expected[p][k] for p, c in enumerate(counts) if c)
            rate = tokens / engine.decode_ms(d, batch_size, tokens)[0]
            if rate > best_rate:
                best_depth, best_rate = d, rate
        return best_depth, False

    def observe(self, batch_size: int, depth: int, accepted_drafts_sum: int) -> None:
        return None
