"""The learner of a shape server: each captured shape's decode tok/s per batch bucket, measured.

A shape server (`specctl serve --shapes`) runs a handful of captured shapes: draft trees,
chains and off. The chain learner (models/learner.py) places a depth it rarely runs from a step
model pooled over depths and an accept-length model read position by position; neither carries
to a tree, whose verify is batch x draft-tokens wide and whose acceptance is not a chain's. So
here each (shape, bucket) cell is its own estimate, from the plugin's per-shape counters:

    tok/s(shape, bucket) = decayed tokens / decayed GPU seconds

with a normal spread in log tok/s: one request step's spread of accepted tokens (a prior,
widened by the samples' scatter) over the cell's decayed request steps, the step time's
(`step_cv`) over its iterations, and a floor for what drifts. A cell runs its bucket only once
that spread is below `DECIDE_SD`; until then the shape is probed there. A shape not yet
measured at a bucket is placed by its ratio to a measured one at the nearest bucket that has
both, so a crossover is found from the trend while the probes measure it.

The table runs the shape estimated best in each bucket that carries load (a tier from the
bucket's lower edge), keeps the live shape unless another beats it by `switch_margin`, and
probes, within `exploration_cap`, every shape still unmeasured at a loaded bucket and every one
that posterior draws give at least `explore_threshold` chance of winning there (Thompson
sampling). Rationale and measurements: docs/learning.md#shape-servers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from models.evidence import decay_weights
from models.learner import LearnerConfig, Proposal
from models.samples import Sample
from models.tiers import hysteresis_for
from sglang_hooks.contract import (
    PolicyTable,
    Tier,
    bs_bucket,
    shape_tier,
)
from sglang_hooks.draft_shape import DraftShape, Shape, chain, dominating, label, parse_shape

SHAPE_MODEL_VERSION = "specctl-shapes/1 (measured tok/s per shape and bucket, thompson probes)"
# One request step's relative spread of accepted tokens, at least: a chain's accepted tokens
# per step range over 1..depth+1. A batch of B averages B of them.
PRIOR_REQUEST_CV = 0.4
MIN_SAMPLES_FOR_CV = 8  # samples beside their cell's mean before their scatter may widen the prior
FLOOR_SD = 0.01  # what no amount of evidence removes: acceptance and load drift in a cell
# A shape placed less tightly than this at a bucket (log tok/s) is probed there, not run: a
# few probe steps at batch 1 say too little (at the prior spread, 16 of them give 0.1).
DECIDE_SD = 0.1
# A bucket with less of the recent load than this, where some shape is still unmeasured,
# follows the bucket below it: the load only passed through it (a ramp), and its few steps
# would split the table into tiers that each need their own evidence.
OWN_TIER_SHARE = 0.02


@dataclass(frozen=True)
class ShapeCell:
    """A shape's decayed counters at one bucket, and the spread of its samples."""

    iterations: float
    request_steps: float
    tokens: float
    gpu_seconds: float

    @property
    def tok_per_s(self) -> float:
        return self.tokens / self.gpu_seconds

    @property
    def mean_batch(self) -> float:
        return self.request_steps / self.iterations


def sample_shape(s: Sample) -> str:
    """The label of what a sample measured: its tree, else its chain or off."""
    return s.tree or label(chain(s.depth))


def _usable(s: Sample) -> bool:
    numbers = (s.t_end, s.iterations, s.request_steps, s.tokens, s.gpu_seconds)
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in numbers):
        return False
    # Every request emits at least its bonus token per iteration.
    return (s.iterations > 0 and s.gpu_seconds > 0 and s.request_steps >= s.iterations
            and s.tokens >= 0.999 * s.request_steps)  # fmt: skip


class ShapeLearner:
    """Learns which captured shape decodes fastest at each batch bucket of one group."""

    version: str = SHAPE_MODEL_VERSION

    def __init__(self, shapes: Iterable[str], config: LearnerConfig | None = None,
                 seed: int = 0) -> None:  # fmt: skip
        parsed = {label(parse_shape(s)): parse_shape(s) for s in shapes}
        if not parsed:
            raise ValueError("shapes: at least one captured shape is required")
        self.shapes: dict[str, Shape] = dict(sorted(parsed.items()))
        start = dominating(list(parsed.values()))
        # What a shape server runs with no table: its start-up shape, which dominates the list.
        self.startup = label(start) if start is not None else next(iter(self.shapes))
        self.config = config or LearnerConfig()
        self.seed = seed
        self.cells: dict[tuple[str, int], ShapeCell] = {}
        self.request_cv = PRIOR_REQUEST_CV
        self.fitted_at: float | None = None

    # ------------------------------------------------------------------ learning

    def fit(self, samples: Sequence[Sample], now: float) -> None:
        """Refit from all samples of the group (state depends only on the inputs)."""
        half_life = self.config.acceptance_half_life_s
        groups: dict[tuple[str, int], list[Sample]] = {}
        for s in samples:
            name = sample_shape(s)
            if name in self.shapes and _usable(s):
                groups.setdefault((name, s.bs_bucket), []).append(s)
        cells: dict[tuple[str, int], ShapeCell] = {}
        deviations: list[float] = []
        for key, rows in groups.items():
            w = decay_weights(np.fromiter((r.t_end for r in rows), float), now, half_life)
            cols = {f: np.fromiter((getattr(r, f) for r in rows), float)
                    for f in ("iterations", "request_steps", "tokens", "gpu_seconds")}  # fmt: skip
            cell = ShapeCell(*(float(w @ cols[f]) for f in cols))
            cells[key] = cell
            if len(rows) >= 2:
                # A sample of n request steps scatters by cv / sqrt(n): scaled back to one.
                rates = np.log(cols["tokens"] / cols["gpu_seconds"])
                scaled = (rates - math.log(cell.tok_per_s)) * np.sqrt(cols["request_steps"])
                deviations.extend(scaled.tolist())
        self.cells = cells
        # The scatter may only widen the prior: samples of large batches average many
        # requests' steps and would otherwise claim a precision that a few probe steps at
        # batch 1 do not have.
        scatter = (float(np.sqrt(np.mean(np.square(deviations))))
                   if len(deviations) >= MIN_SAMPLES_FOR_CV else 0.0)  # fmt: skip
        self.request_cv = max(scatter, PRIOR_REQUEST_CV)
        self.fitted_at = now

    def measured(self, bucket: int) -> dict[str, ShapeCell]:
        """The shapes measured well enough at `bucket` to run there."""
        return {name: c for (name, b), c in self.cells.items()
                if b == bucket and self._log_sd(c) <= DECIDE_SD}  # fmt: skip

    def _log_sd(self, cell: ShapeCell) -> float:
        """The spread of a cell's log tok/s: acceptance over its request steps, step time over
        its iterations, and the floor."""
        return math.sqrt(self.request_cv**2 / max(cell.request_steps, 1.0)
                         + self.config.step_cv**2 / max(cell.iterations, 1.0) + FLOOR_SD**2)

    def estimates(self, bucket: int) -> dict[str, float]:
        """tok/s of each shape at `bucket`: measured where ready; else, for a shape ready at
        another bucket beside one ready here, this bucket's figure of that one times the
        ratio of the two at the nearest bucket (in log batch) that has both. A crossover
        is then placed from the shapes' trend while the probes measure it."""
        here = self.measured(bucket)
        out = {n: c.tok_per_s for n, c in here.items()}
        if not here:
            return out
        others = sorted({b for _, b in self.cells} - {bucket},
                        key=lambda b: abs(math.log(b / bucket)))  # fmt: skip
        for name in self.shapes:
            if name in out:
                continue
            for b in others:
                there = self.measured(b)
                refs = [r for r in here if r in there] if name in there else []
                if refs:
                    logs = [math.log(here[r].tok_per_s * there[name].tok_per_s
                                     / there[r].tok_per_s) for r in refs]  # fmt: skip
                    out[name] = math.exp(sum(logs) / len(logs))
                    break
        return out

    def best_shape(self, bucket: int) -> str | None:
        tok = self.estimates(bucket)
        return max(tok, key=lambda n: tok[n]) if tok else None

    def best_depth(self, batch: int) -> int:
        """The drafting steps of the shape measured best at `batch`'s bucket (0: off)."""
        best = self.best_shape(bs_bucket(batch))
        shape = self.shapes[best if best is not None else self.startup]
        return 0 if shape is None else shape.steps

    # ------------------------------------------------------------------ proposal

    def propose(
        self,
        now: float,
        live: PolicyTable | None,
        batch_histogram: Mapping[int, float] | None = None,
        *,
        max_batch: int | None = None,
        incumbent: PolicyTable | None = None,
        incumbent_margin: float | None = None,
        focus: Mapping[int, float] | None = None,
    ) -> Proposal:
        """The table to run next. A bucket runs the shape estimated best there (`estimates`),
        the live one unless beaten by `switch_margin`; one with no evidence keeps what the live
        table runs; `focus` buckets (where the load just went) are probed at the cap."""
        c = self.config
        version = (live.version + 1) if live is not None else 1
        hist = _histogram(batch_histogram)
        visited = [b for b in sorted(set(hist) | {b for _, b in self.cells})
                   if b == 1 or hist.get(b, 0.0) >= OWN_TIER_SHARE
                   or len(self.measured(b)) == len(self.shapes)]
        margin = c.switch_margin if live is not None or incumbent_margin is None \
            else incumbent_margin
        runs: dict[int, str] = {}  # bucket -> the shape its table runs
        for b in visited:
            current = self._live_shape(live, b)
            tok = self.estimates(b)
            if not tok:
                runs[b] = current
                continue
            best = max(tok, key=lambda n: tok[n])
            keep = current in tok and tok[best] <= tok[current] * (1.0 + margin)
            runs[b] = current if keep else best
        if not runs:
            runs = {1: self._live_shape(live, 1)}
        table = self._table(runs, version)
        table = self._with_probes(table, sorted(runs), hist, focus or {})
        predicted = self._predicted(table, hist)
        measured = [b for b in runs if self.measured(b)]
        share = _expected_share(table, hist)
        reason = (f"{table.describe()}; measured at buckets {measured or 'none'}, "
                  f"probing {share:.1%} of steps")  # fmt: skip
        return Proposal(table, predicted, [], share, reason)

    def _live_shape(self, live: PolicyTable | None, bucket: int) -> str:
        if live is None:
            return self.startup
        tier = live.tier_for(bucket)
        name = label(tier.shape)
        return name if name in self.shapes else self.startup

    def _table(self, runs: Mapping[int, str], version: int) -> PolicyTable:
        """The shape run per bucket as tiers, each starting at its bucket's lower edge: the
        cells say nothing finer than a bucket."""
        tiers: list[Tier] = []
        for b in sorted(runs):
            if tiers and label(tiers[-1].shape) == runs[b]:
                continue
            lo = b if tiers else 1
            prev = tiers[-1].min_batch if tiers else 0
            hysteresis = hysteresis_for(lo, prev, self.config.hysteresis_fraction)
            tiers.append(shape_tier(lo, self.shapes[runs[b]], hysteresis))
        return PolicyTable.build(tiers, version=version)

    def _with_probes(self, table: PolicyTable, buckets: Sequence[int],
                     hist: Mapping[int, float], focus: Mapping[int, float]) -> PolicyTable:
        """Split the table at visited bucket edges and give each piece the probes its bucket
        needs: unmeasured shapes and those posterior draws may still make the best."""
        c = self.config
        rng = np.random.default_rng(self.seed)
        pieces: list[Tier] = []
        for t_index, tier in enumerate(table.tiers):
            hi = table.tiers[t_index + 1].min_batch - 1 if t_index + 1 < len(table.tiers) else None
            starts = [tier.min_batch] + [b for b in buckets
                                         if b > tier.min_batch and (hi is None or b <= hi)]
            for lo in starts:
                probes, share = self._probes(label(tier.shape), bs_bucket(lo), rng, focus)
                pieces.append(_probing(tier, lo, probes, share, c.hysteresis_fraction,
                                       pieces[-1].min_batch if pieces else 0))
        return PolicyTable.build(_merged(pieces), version=table.version)

    def _probes(self, running: str, bucket: int, rng: np.random.Generator,
                focus: Mapping[int, float]) -> tuple[list[str], float]:
        c = self.config
        here = self.measured(bucket)
        others = [n for n in self.shapes if n != running]
        cold = [n for n in others if n not in here]
        if running not in here:
            return others, c.exploration_cap if others else 0.0
        draws = {n: rng.normal(math.log(cell.tok_per_s), self._log_sd(cell), c.posterior_draws)
                 for n, cell in here.items()}  # fmt: skip
        chosen = draws[running] + math.log1p(c.explore_margin)
        p_beat = {n: float(np.mean(draws[n] > chosen)) for n in others if n in here}
        focused = focus.get(bucket, 0.0) >= 0.05
        bar = c.explore_threshold * (0.25 if focused else 1.0)
        alts = [n for n, p in p_beat.items() if p >= bar]
        if cold:
            return sorted(set(alts) | set(cold)), c.exploration_cap
        if not alts:
            return [], 0.0
        level = 1.0 if focused else math.ceil(4.0 * min(
            1.0, max(p_beat[n] for n in alts) / c.explore_saturation)) / 4.0
        return sorted(alts), c.exploration_cap * level

    def _predicted(self, table: PolicyTable, hist: Mapping[int, float]) -> dict[int, float]:
        """Measured tok/s per visited bucket of what `table` runs there (probes included)."""
        out: dict[int, float] = {}
        for b in hist:
            tok = self._table_tok(table, b, probes=True)
            if tok is not None:
                out[b] = tok
        return out

    def _table_tok(self, table: PolicyTable | None, bucket: int, *, probes: bool) -> float | None:
        tier = table.tier_for(bucket) if table is not None else None
        main = self.startup if tier is None else label(tier.shape)
        here = self.measured(bucket)
        cell = here.get(main)
        if cell is None:
            return None
        if not probes or tier is None or tier.explore_share <= 0:
            return cell.tok_per_s
        probe_tok = [here[label(p)].tok_per_s for p in tier.explore_shapes if label(p) in here]
        if not probe_tok:
            return cell.tok_per_s
        share = tier.explore_share
        return (1 - share) * cell.tok_per_s + share * float(np.mean(probe_tok))

    def predicted_gain(self, candidate: PolicyTable, live: PolicyTable | None,
                       batch_histogram: Mapping[int, float], *, probes: bool = True
                       ) -> float | None:  # fmt: skip
        """Measured tok/s of `candidate` over `live`, weighted by the load, over the buckets
        where both are measured; None where none is."""
        num = den = 0.0
        for b, w in _histogram(batch_histogram).items():
            new = self._table_tok(candidate, b, probes=probes)
            old = self._table_tok(live, b, probes=probes)
            if new is not None and old is not None:
                num += w * new
                den += w * old
        return num / den - 1.0 if den > 0 else None

    # ------------------------------------------------------------------ persistence

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "shapes": list(self.shapes),
            "seed": self.seed,
            "fitted_at": self.fitted_at,
            "request_cv": self.request_cv,
            "cells": [[name, b, c.iterations, c.request_steps, c.tokens, c.gpu_seconds]
                      for (name, b), c in sorted(self.cells.items())],
            "config": self.config.model_dump(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ShapeLearner:
        if data.get("version") != SHAPE_MODEL_VERSION:
            raise ValueError(f"not a shape learner's snapshot ({data.get('version')!r})")
        learner = cls(data["shapes"], LearnerConfig.model_validate(data["config"]),
                      int(data["seed"]))  # fmt: skip
        learner.fitted_at = data.get("fitted_at")
        learner.request_cv = float(data["request_cv"])
        learner.cells = {(str(row[0]), int(row[1])): ShapeCell(*map(float, row[2:]))
                         for row in data["cells"]}  # fmt: skip
        return learner


def _probing(tier: Tier, lo: int, probes: Sequence[str], share: float, fraction: float,
             prev: int) -> Tier:  # fmt: skip
    """`tier`'s shape from `lo` up, probing `probes` at `share`."""
    base = shape_tier(lo, tier.shape)
    shapes = [parse_shape(p) for p in probes]
    depths = tuple(sorted(s.steps if s is not None else 0 for s in shapes
                          if s is None or s.topk == 1))
    trees = tuple(sorted((s for s in shapes if isinstance(s, DraftShape) and s.topk > 1),
                         key=lambda s: s.label))
    on = share > 0 and bool(depths or trees)
    hysteresis = tier.hysteresis if lo == tier.min_batch else 0
    if prev:
        hysteresis = min(hysteresis, lo - prev - 1)
    return Tier(lo, base.depth, max(hysteresis, 0), share if on else 0.0,
                depths if on else (), base.topk, base.draft_tokens, trees if on else ())


def _merged(tiers: list[Tier]) -> list[Tier]:
    """Neighbours that run and probe alike as one tier."""
    out: list[Tier] = []
    for t in tiers:
        if out and _runs_alike(out[-1], t):
            continue
        out.append(t)
    return out


def _runs_alike(a: Tier, b: Tier) -> bool:
    return (a.shape, a.explore_share, a.explore_shapes) == (b.shape, b.explore_share,
                                                            b.explore_shapes)


def _histogram(batch_histogram: Mapping[int, float] | None) -> dict[int, float]:
    raw: dict[int, float] = {}
    for b, v in (batch_histogram or {}).items():
        if math.isfinite(v) and v > 0:
            key = bs_bucket(max(int(b), 1))
            raw[key] = raw.get(key, 0.0) + float(v)
    total = sum(raw.values())
    return {b: v / total for b, v in raw.items()} if total > 0 else {}


def _expected_share(table: PolicyTable, hist: Mapping[int, float]) -> float:
    if not hist:
        return max((t.explore_share for t in table.tiers), default=0.0)
    return sum(w * table.tier_for(b).explore_share for b, w in hist.items())

