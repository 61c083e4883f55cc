"""The learner the daemon calls: fit on counter samples, predict tok/s curves, propose a table.

Predicted decode tok/s of depth s at batch B is B * L_s / step(s, B): step time from the pooled
roofline model (stable, long memory, `models/step_model.py`), accept length L_s from the decayed
Gamma posteriors (drifting, short memory, `models/acceptance.py`). `propose` picks the best depth
per batch size, compresses it into tiers (`models/tiers.py`), and adds exploration where the
posterior says an alternative may still win (Thompson sampling on posterior draws), within
`exploration_cap`. Rationale and measurements: docs/learning.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from models.acceptance import AcceptanceModel
from models.drift import ChangePoint, last_change
from models.evidence import Cells, aggregate, sample_arrays
from models.level_shift import level_at, rescale_to_now
from models.samples import Sample
from models.step_model import RooflineStepModel, roofline_features
from models.tiers import Run, crossovers, hysteresis_for, merge_small_gain_runs, runs_of
from sglang_hooks.contract import (
    BS_BUCKET_EDGES,
    MAX_DEPTH,
    MAX_TIERS,
    PolicyTable,
    Tier,
    bs_bucket,
    bucket_upper,
)

MODEL_VERSION = (
    "specctl-models/3 (roofline-bayes step, ew-gamma acceptance cut at change points and "
    "level-shifted while it settles, thompson probes of neighbours and off, sticky decisions)"
)
LOAD_HALF_LIFE_S = 120.0  # memory of where the load sits in each bucket (representative batch)
FOCUS_SHARE = 0.05  # a bucket with this share of a `focus` load is probed eagerly
FOCUS_THRESHOLD_FACTOR = 0.25  # ...for alternatives with a quarter of the usual chance to win


class LearnerConfig(BaseModel):
    """Knobs of the learner. Every field has a default that suits the built-in profiles."""

    model_config = ConfigDict(extra="forbid")

    exploration_cap: float = Field(
        default=0.03,
        ge=0.0,
        le=0.5,
        description="Hard cap on the share of decode iterations exploring",
    )
    acceptance_half_life_s: float = Field(
        default=600.0,
        gt=0.0,
        description="Memory of acceptance between detected changes of workload (long enough to "
        "make rarely probed depths certain; a change point cuts it, see drift_z_threshold)",
    )
    acceptance_settle_s: float = Field(
        default=600.0,
        ge=0.0,
        description="For this long after a change point, acceptance evidence is remembered "
        "with acceptance_settle_half_life_s instead (a change is often a transition)",
    )
    acceptance_settle_half_life_s: float = Field(
        default=120.0,
        gt=0.0,
        description="Memory of acceptance while a change settles",
    )
    step_half_life_s: float = Field(
        default=86400.0, gt=0.0, description="Memory of step cost (a hardware property, stable)"
    )
    min_gain: float = Field(
        default=0.02,
        ge=0.0,
        description="A depth must beat its neighbours' by this margin to hold a tier",
    )
    loaded_run_share: float = Field(
        default=0.2,
        gt=0.0,
        le=1.0,
        description="A run of batch sizes carrying this share of the recent load (or of the "
        "load just moved to) is held to loaded_min_gain instead of min_gain",
    )
    loaded_min_gain: float = Field(
        default=0.01,
        ge=0.0,
        description="What a depth must gain over its neighbours' to hold a tier where the load "
        "is: a gain below min_gain there is still earned on most of the load",
    )
    hysteresis_fraction: float = Field(
        default=0.125,
        ge=0.0,
        lt=1.0,
        description="Hysteresis of each boundary, fraction of min_batch",
    )
    explore_margin: float = Field(
        default=0.01,
        ge=0.0,
        description="An alternative counts as possibly better only if it may win by this margin "
        "(without it, exploration never stops at a crossover, where two depths tie)",
    )
    explore_threshold: float = Field(
        default=0.05,
        gt=0.0,
        lt=1.0,
        description="Below this probability that an alternative wins, a tier does not explore",
    )
    explore_saturation: float = Field(
        default=0.5,
        gt=0.0,
        le=1.0,
        description="Probability that an alternative wins at which a tier explores at the cap",
    )
    min_evidence_iterations: float = Field(
        default=2.0,
        ge=0.0,
        description="Below this many iterations a depth is cold: explored, not run",
    )
    posterior_draws: int = Field(
        default=256, ge=16, le=4096, description="Thompson draws per proposal"
    )
    step_cv: float = Field(
        default=0.05, gt=0.0, description="Assumed coefficient of variation of one iteration's time"
    )
    model_error: float = Field(
        default=0.01,
        gt=0.0,
        description="Relative error floor per (depth, bucket) of the step model",
    )
    acceptance_prior_rate: float = Field(
        default=0.6,
        gt=0.0,
        lt=1.0,
        description="Per-position acceptance assumed before any evidence",
    )
    acceptance_prior_decay: float = Field(
        default=0.9,
        gt=0.0,
        le=1.2,
        description="Per-position decay of acceptance assumed until several depths have evidence",
    )
    acceptance_prior_strength: float = Field(
        default=100.0,
        gt=0.0,
        description="Weight of the cross-depth acceptance prior, in request-steps",
    )
    acceptance_dispersion: float = Field(
        default=2.0, ge=1.0, description="Request-steps per independent acceptance observation"
    )
    drift_z_threshold: float = Field(
        default=5.0,
        gt=0.0,
        description="A shift of a depth's measured acceptance this many standard errors wide "
        "is a change of workload: acceptance evidence before it is forgotten",
    )
    drift_min_shift: float = Field(
        default=0.03,
        ge=0.0,
        description="...if it moves the accept length by at least this fraction",
    )
    probe_neighbours_only: bool = Field(
        default=True,
        description="Past cold start, probe only the captured depths next to a tier's depth "
        "(a far depth costs 20-50% per probe; the pooled model places it from its neighbours)",
    )
    probe_off: bool = Field(
        default=True,
        description="Past cold start, depth 0 is a probe candidate in every tier besides the "
        "neighbours: it is the alternative that matters where drafting stops paying",
    )
    probe_past_cold_neighbours: bool = Field(
        default=False,
        description="A tier whose neighbour on one side is cold also probes the next captured "
        "depth past it on that side while that one is cold too, so that a table walking down "
        "from a depth measured at small batches reaches the best depth in one push instead of "
        "one depth per push (off: throughput-neutral on the slow profiles, not run on the full "
        "evaluation; docs/learning.md)",
    )
    cheap_probe_loss: float = Field(
        default=0.05,
        ge=0.0,
        lt=1.0,
        description="An alternative predicted to lose at most this fraction of the chosen "
        "depth's tok/s is probed at a quarter of the cap even when the model is sure (near ties "
        "cost little to measure, and their evidence follows acceptance drifts at crossovers)",
    )
    settled_after_s: float = Field(
        default=300.0,
        ge=0.0,
        description="A tier whose probes are only the cheap near-tie ones halves them once its "
        "evidence has been settled this long: no change of workload, no reaction to a moved "
        "load and enough evidence of its depth at its batch sizes (0: never halve)",
    )
    settled_evidence_iterations: float = Field(
        default=200.0,
        ge=0.0,
        description="...where its depth has this many iterations in the tier's bucket",
    )
    switch_margin: float = Field(
        default=0.01,
        ge=0.0,
        description="The live table's depth at a batch size stays unless another depth is "
        "predicted better by this fraction (stops tables swinging between near-equal depths)",
    )
    loaded_switch_margin: float | None = Field(
        default=None,
        ge=0.0,
        description="switch_margin for the live depth where its run of the live table carries "
        "loaded_run_share of the load (null: switch_margin everywhere; measured on one profile "
        "only, docs/learning.md)",
    )
    extrapolation_factor: float = Field(
        default=2.0,
        ge=1.0,
        description="Tables resolve batch sizes up to this times the largest seen",
    )


@dataclass
class CurvePoint:
    batch: float
    tok_per_s: float
    lo: float  # 5th percentile of the posterior of tok_per_s
    hi: float  # 95th percentile
    step_ms: float
    accept_length: float
    evidence_iterations: float  # decayed iterations of this depth in the bucket of `batch`


@dataclass
class Proposal:
    table: PolicyTable
    predicted_tok_per_s: dict[int, float]  # bs_bucket -> decode tok/s under `table`
    crossovers: list[tuple[int, int, float]]  # (from_depth, to_depth, batch size)
    exploration_share: float  # expected share of iterations exploring under `table`
    reason: str


@dataclass
class _Segment:
    lo: int
    hi: int
    depth: int
    explore_share: float = 0.0
    explore_depths: tuple[int, ...] = ()


class Learner:
    """Learns tok/s against batch size and depth for one group of identical targets."""

    version: str = MODEL_VERSION

    def __init__(
        self, captured_depths: Sequence[int], config: LearnerConfig | None = None, seed: int = 0
    ) -> None:
        depths = sorted(set(captured_depths))
        if not depths:
            raise ValueError("captured_depths: at least one depth is required")
        bad = [d for d in depths if not isinstance(d, int) or not 0 <= d <= MAX_DEPTH]
        if bad:
            raise ValueError(f"captured_depths: {bad[0]!r} is not an integer in [0, {MAX_DEPTH}]")
        self.captured = depths
        self.config = config or LearnerConfig()
        self.seed = seed
        self.step = RooflineStepModel()
        self.acceptance = self._new_acceptance()
        self.fitted_at: float | None = None
        self._evidence: dict[tuple[int, int], float] = {}  # (depth, bucket) -> decayed iterations
        self._recent: dict[int, tuple[float, float]] = {}  # bucket -> (iterations, request_steps)
        self._max_batch_seen = 0.0
        self._first_t: float | None = None  # end of the oldest sample fitted
        self.change: ChangePoint | None = None  # last acceptance change point found by `fit`

    def _new_acceptance(self) -> AcceptanceModel:
        c = self.config
        return AcceptanceModel(
            self.captured,
            prior_rate=c.acceptance_prior_rate,
            prior_decay=c.acceptance_prior_decay,
            prior_strength=c.acceptance_prior_strength,
            dispersion=c.acceptance_dispersion,
        )

    # ------------------------------------------------------------------ learning

    def fit(self, samples: Sequence[Sample], now: float) -> None:
        """Refit from all samples of the group (idempotent: state depends only on the inputs)."""
        c = self.config
        arrays = sample_arrays(samples)
        step_cells = aggregate(arrays, now, c.step_half_life_s)
        recent = aggregate(arrays, now, LOAD_HALF_LIFE_S)
        self.step.fit(step_cells, c.step_cv, c.model_error)
        self.change = last_change(
            arrays["t_end"],
            arrays["depth"],
            arrays["tokens"],
            arrays["request_steps"],
            self.captured,
            c.drift_z_threshold,
            c.drift_min_shift,
        )
        current = arrays
        if self.change is not None:
            keep = (arrays["t_end"] > self.change.t) & ~self._old_in_gap(arrays, self.change)
            current = {k: v[keep] for k, v in arrays.items()}
            if now - self.change.t < c.acceptance_settle_s:
                current = self._level_adjusted(current, now)
        self.acceptance.fit(aggregate(current, now, self._acceptance_memory(now)))
        self._evidence = {
            (int(d), int(b)): float(n)
            for d, b, n in zip(
                step_cells.depth, step_cells.bucket, step_cells.iterations, strict=True
            )
        }
        self._recent = _per_bucket(recent)
        self._max_batch_seen = float(step_cells.mean_batch.max()) if len(step_cells) else 0.0
        self._first_t = float(arrays["t_end"].min()) if len(arrays["t_end"]) else None
        self.fitted_at = now

    def _old_in_gap(self, arrays: dict[str, np.ndarray], change: ChangePoint) -> np.ndarray:
        """Samples of other depths between the change's two bounds whose acceptance is still
        the old workload's. Each such depth's gap evidence, pooled, as a chain level q, against
        its own level before the change and that level moved by the shift the detecting depth
        showed: nearer the first, it predates the change. Left in, a depth that ran only in the
        gap would be judged on the workload that is gone (a table benched on one prompt family
        keeps depth 3's accept length on it while a crowd of another family runs on depth 1).
        A depth with no evidence before the change is held to the detecting depth's own two
        levels instead (a coarser test: the chain's decay is the prior's, not the depth's)."""
        old = np.zeros(arrays["t_end"].shape, bool)
        if change.gap_end is None or change.gap_end <= change.t:
            return old
        rho = self.config.acceptance_prior_decay
        level_before = float(level_at(np.asarray(change.before), change.depth, rho))
        shift = float(level_at(np.asarray(change.after), change.depth, rho)) - level_before
        gap = (arrays["t_end"] > change.t) & (arrays["t_end"] <= change.gap_end)
        before = arrays["t_end"] <= change.t

        def level(mask: np.ndarray, depth: int) -> float | None:
            steps = float(arrays["request_steps"][mask].sum())
            if steps <= 0:
                return None
            rate = float((arrays["tokens"][mask] - arrays["request_steps"][mask]).sum()) / steps
            return float(level_at(np.asarray(rate), depth, rho))

        for d in np.unique(arrays["depth"][gap]):
            if d == 0 or d == change.depth:
                continue
            mine = arrays["depth"] == d
            then, now = level(before & mine, int(d)), level(gap & mine, int(d))
            then = level_before if then is None else then
            if now is not None and abs(now - then) < abs(now - then - shift):
                old |= gap & mine
        return old

    def _level_adjusted(self, arrays: dict[str, np.ndarray], now: float) -> dict[str, np.ndarray]:
        """Post-change evidence of the depths that are not running, rescaled to the acceptance
        level the running depth shows now (models/level_shift.py)."""
        recent = (arrays["t_end"] > now - 60.0) & (arrays["depth"] > 0)
        if not np.any(recent):
            return arrays
        steps = np.bincount(
            arrays["depth"][recent],
            weights=arrays["request_steps"][recent],
            minlength=MAX_DEPTH + 1,
        )
        reference = int(np.argmax(steps))
        return rescale_to_now(arrays, reference, self.config.acceptance_prior_decay, now)

    def _acceptance_memory(self, now: float) -> float:
        """Half-life of acceptance evidence: short for `acceptance_settle_s` after a change
        point (a change of workload is often a transition: the batch's mix keeps moving while
        old requests finish, and evidence a depth collected early in it, before it stopped
        running, would otherwise outweigh the chain prior the running depth keeps current),
        long otherwise."""
        c = self.config
        if self.change is not None and now - self.change.t < c.acceptance_settle_s:
            return min(c.acceptance_half_life_s, c.acceptance_settle_half_life_s)
        return c.acceptance_half_life_s

    def evidence(self, depth: int) -> float:
        """Decayed iterations (step memory) of `depth` over all buckets."""
        return sum(n for (d, _), n in self._evidence.items() if d == depth)

    def warm_depths(self) -> list[int]:
        """Captured depths that may be run: enough evidence of their own, or both captured
        neighbours have it (the pooled step model interpolates between them, and the chain
        prior places acceptance between theirs). The rest are only explored."""
        if not self.step.fitted:
            return []
        # Evidence decays (one day's half-life): an iteration counted a minute ago must still
        # count as one.
        floor = self.config.min_evidence_iterations * (1.0 - 1e-3)
        measured = [self.evidence(d) >= floor and self.evidence(d) > 0 for d in self.captured]
        return [
            d
            for i, d in enumerate(self.captured)
            if measured[i]
            or (0 < i < len(self.captured) - 1 and measured[i - 1] and measured[i + 1])
        ]

    # ------------------------------------------------------------------ prediction

    def _mean_tok(self, depth: int, batch: np.ndarray) -> np.ndarray:
        step_ms, _ = self.step.predict(np.full(batch.shape, depth), batch)
        return np.asarray(batch * self.acceptance.mean_length(depth) / (step_ms / 1000.0))

    def _draw_tok(
        self, depths: Sequence[int], batch: np.ndarray, rng: np.random.Generator
    ) -> dict[int, np.ndarray]:
        """Posterior draws (k, len(batch)) of tok/s per depth, sharing step-model draws."""
        k = self.config.posterior_draws
        coef = self.step.draw_coefficients(rng, k)
        out = {}
        for d in depths:
            x = roofline_features(np.full(batch.shape, d), batch)
            mean_ms = x @ self.step.coef_ * self.step.scale_ms_  # type: ignore[operator]
            step_ms = coef @ x.T * self.step.scale_ms_
            # Extrapolated draws may cross zero; a step cannot be < 5% of the posterior mean.
            step_ms = np.maximum(step_ms, 0.05 * np.asarray(mean_ms))
            length = self.acceptance.draw_lengths(d, rng, k)
            out[d] = batch[None, :] * length[:, None] / (step_ms / 1000.0)
        return out

    def curves(self, batch: np.ndarray) -> dict[int, list[CurvePoint]]:
        """Predicted tok/s with a 90% band per captured depth at each batch size."""
        b = np.atleast_1d(np.asarray(batch, float))
        out: dict[int, list[CurvePoint]] = {}
        if not self.step.fitted:
            for d in self.captured:
                length = self.acceptance.mean_length(d)
                out[d] = [
                    CurvePoint(float(x), np.nan, np.nan, np.nan, np.nan, length, 0.0) for x in b
                ]
            return out
        draws = self._draw_tok(self.captured, b, np.random.default_rng(self.seed))
        for d in self.captured:
            step_ms, _ = self.step.predict(np.full(b.shape, d), b)
            length = self.acceptance.mean_length(d)
            lo, hi = np.percentile(draws[d], [5.0, 95.0], axis=0)
            out[d] = [
                CurvePoint(
                    batch=float(x),
                    tok_per_s=float(x * length / (s / 1000.0)),
                    lo=float(lo_),
                    hi=float(hi_),
                    step_ms=float(s),
                    accept_length=length,
                    evidence_iterations=self._evidence.get((d, bs_bucket(max(int(x), 1))), 0.0),
                )
                for x, s, lo_, hi_ in zip(b, step_ms, lo, hi, strict=True)
            ]
        return out

    def best_depth(self, batch: int) -> int:
        """The depth with the highest predicted tok/s at `batch` among warm depths."""
        warm = self.warm_depths()
        if not warm:
            return max(self.captured)
        b = np.asarray([float(batch)])
        return max(warm, key=lambda d: float(self._mean_tok(d, b)[0]))

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
        """The table to run next, with exploration where the model is unsure (<= the cap).

        `max_batch`: the server's running cap; the table's decisions cover every batch size up
        to it (beyond the load seen, from the pooled step model's prediction), so a batch range
        reached for the first time gets the model's depth instead of the last tier's.
        `incumbent`: what the server runs when that is not a specctl table (SGLang's own choice
        as measured); its depth at a batch size stays unless beaten by `incumbent_margin`.
        `focus`: batch buckets (share of the load) the load has just moved to: there every
        alternative with a fraction of the usual chance of winning is probed at the cap, so
        that the evidence the new load needs arrives as fast as the cap allows.
        """
        c = self.config
        warm = self.warm_depths()
        cold = [d for d in self.captured if d not in warm]
        version = (live.version + 1) if live is not None else 1
        hist = self._histogram(batch_histogram)
        if not warm:
            return self._cold_start(live or incumbent, cold, version, hist)

        top = self._grid_top(hist, max_batch)
        grid = np.arange(1, top + 1, dtype=float)
        tok = {d: self._mean_tok(d, grid) for d in warm}
        # Runs that win by less than the exploration margin are noise in a flat region: they
        # neither change throughput nor mark a real crossover.
        resolved = merge_small_gain_runs(runs_of(_argmax_depth(tok, warm)), tok, c.explore_margin)
        raw_crossovers = crossovers(resolved, tok)
        # Decisions: the live depth at a batch size keeps it unless beaten by switch_margin.
        load = _load_per_batch(hist, focus or {}, len(grid))
        if live is None and incumbent is not None:
            margin = c.switch_margin if incumbent_margin is None else incumbent_margin
            sticky = self._incumbent_bonus(tok, warm, incumbent, grid, margin)
        else:
            sticky = self._incumbent_bonus(
                tok, warm, live, grid, c.switch_margin, load=load, loaded=c.loaded_switch_margin
            )
        runs = merge_small_gain_runs(runs_of(_argmax_depth(sticky, warm)), sticky, c.explore_margin)
        runs = merge_small_gain_runs(
            runs,
            sticky,
            c.min_gain,
            load=load,
            loaded_share=c.loaded_run_share,
            loaded_min_gain=c.loaded_min_gain,
        )
        runs = _limit_runs(runs, sticky, MAX_TIERS // 2)

        segments = self._explore_segments(runs, warm, cold, top, focus or {}, now)
        tiers = _to_tiers(segments, c.hysteresis_fraction)
        table = PolicyTable.build(tiers, version=version, captured_depths=self.captured)
        share = _expected_share(table, hist)
        predicted = self._predicted(table, hist, top)
        reason = self._reason(table, raw_crossovers, share, segments, predicted, live, hist, top)
        return Proposal(table, predicted, raw_crossovers, share, reason)

    def _incumbent_bonus(
        self,
        tok: Mapping[int, np.ndarray],
        warm: list[int],
        live: PolicyTable | None,
        grid: np.ndarray,
        margin: float,
        *,
        load: np.ndarray | None = None,
        loaded: float | None = None,
    ) -> dict[int, np.ndarray]:
        """Predicted tok/s with the live table's depth at each batch size raised by `margin`
        (`switch_margin`): a challenger must beat it by that much to replace it. With `load`
        and `loaded` (`loaded_switch_margin`), a run of the live depth carrying
        `loaded_run_share` of the load is raised by `loaded` instead: a small edge there is
        earned on most of the load (the push gate still stops churn)."""
        if live is None:
            return dict(tok)
        incumbent = np.asarray([live.depth_for(int(b)) for b in grid])
        bonus = np.full(grid.shape, margin)
        if load is not None and loaded is not None:
            for r in runs_of(incumbent):
                if float(np.sum(load[r.lo - 1 : r.hi])) >= self.config.loaded_run_share:
                    bonus[r.lo - 1 : r.hi] = loaded
        if not np.any(bonus > 0):
            return dict(tok)
        return {
            d: np.where(incumbent == d, tok[d] * (1.0 + bonus), tok[d]) if d in warm else tok[d]
            for d in tok
        }

    def _probe_candidates(self, depth: int, warm: Sequence[int]) -> list[int]:
        """Depths a tier running `depth` may probe: its captured neighbours and off, or every
        one of `warm`."""
        others = [d for d in warm if d != depth]
        if not self.config.probe_neighbours_only:
            return others
        i = self.captured.index(depth)
        near = set(self.captured[max(i - 1, 0) : i + 2])
        if self.config.probe_off:
            near.add(0)
        return [d for d in others if d in near]

    def _cold_probe_candidates(self, depth: int, cold: Sequence[int]) -> list[int]:
        """Cold depths a tier running `depth` probes at the cap: the cold ones among its probe
        candidates and, with `probe_past_cold_neighbours`, past each cold neighbour the next
        captured depth if it is cold too (two cold steps would otherwise take two pushes)."""
        out = set(self._probe_candidates(depth, cold))
        c = self.config
        if c.probe_neighbours_only and c.probe_past_cold_neighbours:
            i = self.captured.index(depth)
            for side in (-1, 1):
                near, far = i + side, i + 2 * side
                if (
                    0 <= far < len(self.captured)
                    and self.captured[near] in cold
                    and self.captured[far] in cold
                ):
                    out.add(self.captured[far])
        return sorted(out)

    def _explore_segments(
        self,
        runs: list[Run],
        warm: list[int],
        cold: list[int],
        top: int,
        focus: Mapping[int, float],
        now: float,
    ) -> list[_Segment]:
        """Split runs at bucket edges and decide each piece's exploration from the posterior."""
        c = self.config
        settling = self.change is not None and now - self.change.t < c.acceptance_settle_s
        pieces: list[_Segment] = []
        for r in runs:
            lo = r.lo
            while lo <= r.hi:
                hi = min(r.hi, bucket_upper(bs_bucket(lo)))
                pieces.append(_Segment(lo, hi, r.depth))
                lo = hi + 1
        pieces[-1].hi = max(pieces[-1].hi, top)
        reps = np.asarray([self._representative_batch(p) for p in pieces])
        draws = self._draw_tok(warm, reps, np.random.default_rng(self.seed))
        for i, p in enumerate(pieces):
            chosen = draws[p.depth][:, i] * (1.0 + c.explore_margin)
            candidates = self._probe_candidates(p.depth, warm)
            p_beat = {d: float(np.mean(draws[d][:, i] > chosen)) for d in candidates}
            uncertain = max(p_beat.values(), default=0.0)
            focused = focus.get(bs_bucket(p.lo), 0.0) >= FOCUS_SHARE
            bar = c.explore_threshold * (FOCUS_THRESHOLD_FACTOR if focused else 1.0)
            alts = [d for d, pb in p_beat.items() if pb >= bar]
            if focused and alts:
                uncertain = c.explore_saturation  # probe at the cap where the load just went
            # Near ties are cheap to keep measuring: a quarter of the cap on a depth that loses
            # at most cheap_probe_loss costs at most cap/4 x that, and keeps its acceptance
            # measured where a drift would move the crossover (no other signal exists for a
            # depth that does not run, least of all beside a tier that runs off).
            base = float(np.mean(draws[p.depth][:, i]))
            cheap = [
                d
                for d in candidates
                if d not in alts
                and float(np.mean(draws[d][:, i])) >= base * (1 - c.cheap_probe_loss)
            ]
            settled = False
            if cheap:
                settled = not alts and self._settled(p, now, focus)
                alts = alts + cheap
                uncertain = max(uncertain, c.explore_saturation / 4.0)
            if alts and p.depth == 0 and settling:
                # Off measures no acceptance: while a change of workload settles, its probes
                # are the only evidence of where the drafts' acceptance went.
                uncertain = c.explore_saturation
            # A cold candidate has no evidence to judge it by: probe it at the cap. Far cold
            # depths wait until a tier runs one of their neighbours.
            unmeasured = [d for d in self._cold_probe_candidates(p.depth, cold) if d not in warm]
            if unmeasured:
                p.explore_depths = tuple(sorted(set(alts) | set(unmeasured)))
                p.explore_share = c.exploration_cap
            elif alts:
                p.explore_depths = tuple(sorted(alts))
                # Quarters of the cap: a share that moves with every refit would change the
                # table (and cost a push) at every scrape without changing what is learned.
                level = np.ceil(4.0 * min(1.0, uncertain / c.explore_saturation)) / 4.0
                if settled and level <= 0.25:
                    # Only near ties left, known worse for long: half the cheap rate.
                    level = 0.125
                p.explore_share = c.exploration_cap * float(level)
        return _merge_segments(pieces)

    def _settled(self, seg: _Segment, now: float, focus: Mapping[int, float]) -> bool:
        """Whether a piece's evidence has been settled for `settled_after_s`: no change point
        and no reaction since, and its depth well measured at its bucket."""
        c = self.config
        if c.settled_after_s <= 0 or focus or self._first_t is None:
            return False
        since = self._first_t if self.change is None else max(self._first_t, self.change.t)
        if now - since < c.settled_after_s:
            return False
        evidence = self._evidence.get((seg.depth, bs_bucket(seg.lo)), 0.0)
        return evidence >= c.settled_evidence_iterations

    def _representative_batch(self, seg: _Segment) -> float:
        """Where in a segment to judge it: the recent mean batch of its bucket, else its middle."""
        iters, steps = self._recent.get(bs_bucket(seg.lo), (0.0, 0.0))
        mean = steps / iters if iters > 0 else (seg.lo + seg.hi) / 2.0
        return float(min(max(mean, seg.lo), seg.hi))

    def _cold_start(
        self, live: PolicyTable | None, cold: list[int], version: int, hist: dict[int, float]
    ) -> Proposal:
        cap = self.config.exploration_cap
        base = live.tiers if live is not None else (Tier(1, max(self.captured)),)
        tiers = []
        for t in base:
            depth = t.depth if t.depth in self.captured else max(self.captured)
            alts = tuple(self._cold_probe_candidates(depth, cold))
            tiers.append(
                Tier(t.min_batch, depth, t.hysteresis, cap if alts else 0.0, alts if alts else ())
            )
        table = PolicyTable.build(tiers, version=version, captured_depths=self.captured)
        share = _expected_share(table, hist)
        reason = (
            f"cold start: no evidence yet for {_depth_list(cold)}; keeping "
            f"{table.describe()} and probing {cap:.1%} of steps"
        )
        return Proposal(table, {}, [], share, reason)

    def _histogram(self, batch_histogram: Mapping[int, float] | None) -> dict[int, float]:
        """Normalised share of iterations per bucket: the caller's, else the recent evidence."""
        if batch_histogram is not None:
            raw = {bs_bucket(max(int(b), 1)): 0.0 for b in batch_histogram}
            for b, v in batch_histogram.items():
                if np.isfinite(v) and v > 0:
                    raw[bs_bucket(max(int(b), 1))] += float(v)
        else:
            raw = {b: it for b, (it, _) in self._recent.items()}
        total = sum(raw.values())
        return {b: v / total for b, v in raw.items() if v > 0} if total > 0 else {}

    def _grid_top(self, hist: Mapping[int, float], max_batch: int | None = None) -> int:
        seen = max([self._max_batch_seen, *(float(b) for b in hist)], default=1.0)
        top = int(np.ceil(self.config.extrapolation_factor * seen))
        if max_batch is not None and max_batch > 0:
            top = max(top, int(max_batch))
        return int(min(max(top, 16), BS_BUCKET_EDGES[-1]))

    def predicted_gain(
        self,
        candidate: PolicyTable,
        live: PolicyTable | None,
        batch_histogram: Mapping[int, float],
        *,
        probes: bool = True,
    ) -> float | None:
        """Predicted decode tok/s of `candidate` over the histogram, relative to `live` (0.01:
        1% more). `probes=False` compares the plain decisions only (what the table is worth
        once its probes stop). None: no model, no live table or no load to weigh."""
        hist = self._histogram(batch_histogram)
        if live is None or not hist or not self.warm_depths():
            return None
        top = max(hist)
        new = self._predicted(candidate, hist, top, probes=probes)
        old = self._predicted(live, hist, top, probes=probes)
        den = sum(w * old[b] for b, w in hist.items())
        return sum(w * new[b] for b, w in hist.items()) / den - 1.0 if den > 0 else None

    def _predicted(
        self, table: PolicyTable, hist: Mapping[int, float], top: int, *, probes: bool = True
    ) -> dict[int, float]:
        """Decode tok/s per bucket under `table`, probes included (tokens over time)."""
        buckets = sorted(set(hist) | {b for b in BS_BUCKET_EDGES if b <= top})
        out = {}
        for b in buckets:
            batch = np.asarray([self._bucket_batch(b)])
            tier = table.tiers[_tier_index(table, int(batch[0]))]
            share = tier.explore_share if probes else 0.0
            mix = [(1.0 - share, tier.depth)]
            mix += [(share / len(tier.explore_depths), d) for d in tier.explore_depths if share]
            tokens = time = 0.0
            for p, d in mix:
                step_ms, _ = self.step.predict(np.asarray([d]), batch)
                tokens += p * float(batch[0]) * self.acceptance.mean_length(d)
                time += p * float(step_ms[0]) / 1000.0
            out[b] = tokens / time
        return out

    def _bucket_batch(self, bucket: int) -> float:
        iters, steps = self._recent.get(bucket, (0.0, 0.0))
        if iters > 0:
            return steps / iters
        return (bucket + min(bucket_upper(bucket), 2 * bucket)) / 2.0

    def _reason(
        self,
        table: PolicyTable,
        raw: list[tuple[int, int, float]],
        share: float,
        segments: list[_Segment],
        predicted: Mapping[int, float],
        live: PolicyTable | None,
        hist: Mapping[int, float],
        top: int,
    ) -> str:
        parts = [table.describe()]
        if raw:
            parts.append("crossovers " + ", ".join(f"d{a}->d{b} at {x:.1f}" for a, b, x in raw))
        probing = [s for s in segments if s.explore_share > 0]
        if probing:
            where = ", ".join(
                f"{s.lo}-{s.hi}: {_depth_list(list(s.explore_depths))}" for s in probing[:3]
            )
            parts.append(f"probing {share:.1%} of steps ({where})")
        else:
            parts.append("no probes (model certain)")
        if live is not None and hist:
            live_tok = self._predicted(live, hist, top)
            gain = sum(w * predicted[b] for b, w in hist.items()) / max(
                sum(w * live_tok[b] for b, w in hist.items()), 1e-9
            )
            parts.append(f"predicted {gain - 1.0:+.1%} vs live v{live.version}")
        return "; ".join(parts)

    # ------------------------------------------------------------------ persistence

    def to_json(self) -> dict[str, Any]:
        return {
            "model_version": self.version,
            "captured_depths": self.captured,
            "seed": self.seed,
            "config": self.config.model_dump(),
            "fitted_at": self.fitted_at,
            "step": self.step.to_json(),
            "acceptance": self.acceptance.to_json(),
            "evidence": [[d, b, n] for (d, b), n in sorted(self._evidence.items())],
            "recent": [[b, it, rs] for b, (it, rs) in sorted(self._recent.items())],
            "max_batch_seen": self._max_batch_seen,
            "first_t": self._first_t,
            "change": None if self.change is None else asdict(self.change),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Learner:
        if data.get("model_version") != MODEL_VERSION:
            raise ValueError(
                f"model_version: state was saved by {data.get('model_version')!r}, this is "
                f"{MODEL_VERSION!r}; refit from the stored samples instead"
            )
        learner = cls(
            data["captured_depths"], LearnerConfig.model_validate(data["config"]), data["seed"]
        )
        learner.step = RooflineStepModel.from_json(data["step"])
        learner.acceptance.load_json(data["acceptance"])
        learner.fitted_at = data["fitted_at"]
        learner._evidence = {(int(d), int(b)): float(n) for d, b, n in data["evidence"]}
        learner._recent = {int(b): (float(i), float(r)) for b, i, r in data["recent"]}
        learner._max_batch_seen = float(data["max_batch_seen"])
        first = data.get("first_t")
        learner._first_t = None if first is None else float(first)
        change = data.get("change")
        learner.change = None if change is None else ChangePoint(**change)
        return learner


# ---------------------------------------------------------------------- helpers


def _per_bucket(cells: Cells) -> dict[int, tuple[float, float]]:
    out: dict[int, tuple[float, float]] = {}
    for b, it, rs in zip(cells.bucket, cells.iterations, cells.request_steps, strict=True):
        i0, r0 = out.get(int(b), (0.0, 0.0))
        out[int(b)] = (i0 + float(it), r0 + float(rs))
    return out


def _load_per_batch(hist: Mapping[int, float], focus: Mapping[int, float], size: int) -> np.ndarray:
    """Share of the load per batch size 1..size (a bucket's share spread over its batch
    sizes): the larger of the recent load's and the load the daemon reacts to."""
    out = np.zeros(size)
    for shares in (hist, focus):
        total = sum(v for v in shares.values() if v > 0)
        spread = np.zeros(size)
        for bucket, share in shares.items():
            if share <= 0 or total <= 0 or bucket > size:
                continue
            hi = min(bucket_upper(bucket), 2 * bucket, size)
            spread[bucket - 1 : hi] += share / total / (hi - bucket + 1)
        out = np.maximum(out, spread)
    return out


def _argmax_depth(tok: Mapping[int, np.ndarray], depths: list[int]) -> np.ndarray:
    return np.asarray(depths)[np.argmax(np.stack([tok[d] for d in depths]), axis=0)]


def _limit_runs(runs: list[Run], tok: Mapping[int, np.ndarray], most: int) -> list[Run]:
    """Merge the weakest runs until at most `most` remain (leaves room for probe splits)."""
    gain = 0.0
    while len(runs) > most:
        gain = gain * 2 if gain else 0.005
        runs = merge_small_gain_runs(runs, tok, gain)
    return runs


def _merge_segments(pieces: list[_Segment]) -> list[_Segment]:
    """Join neighbours that run alike (depth, probe share and probe depths); cap the count.

    Pieces that probe differently stay apart: one uncertain bucket next to a crossover must
    not spread its probes over the buckets where the load sits and the model is sure.
    """
    out: list[_Segment] = []
    for p in pieces:
        last = out[-1] if out else None
        if last is not None and (last.depth, last.explore_share, last.explore_depths) == (
            p.depth,
            p.explore_share,
            p.explore_depths,
        ):
            last.hi = p.hi
        else:
            out.append(_Segment(p.lo, p.hi, p.depth, p.explore_share, p.explore_depths))
    while len(out) > MAX_TIERS:
        # Fold the same-depth neighbour pair whose probing differs least, the smallest first
        # (the larger share wins: safe, within the cap).
        pairs = [i for i in range(len(out) - 1) if out[i].depth == out[i + 1].depth]
        i = min(
            pairs,
            key=lambda j: (
                abs(out[j].explore_share - out[j + 1].explore_share),
                out[j].hi - out[j].lo + out[j + 1].hi - out[j + 1].lo,
            ),
        )
        a, b = out[i], out.pop(i + 1)
        a.hi = b.hi
        a.explore_share = max(a.explore_share, b.explore_share)
        a.explore_depths = tuple(sorted(set(a.explore_depths) | set(b.explore_depths)))
    return out


def _to_tiers(segments: list[_Segment], fraction: float) -> list[Tier]:
    tiers: list[Tier] = []
    prev = 0
    for s in segments:
        tiers.append(
            Tier(
                min_batch=s.lo,
                depth=s.depth,
                hysteresis=hysteresis_for(s.lo, prev, fraction),
                explore_share=float(s.explore_share) if s.explore_depths else 0.0,
                explore_depths=s.explore_depths if s.explore_share > 0 else (),
            )
        )
        prev = s.lo
    return tiers


def _tier_index(table: PolicyTable, batch: int) -> int:
    idx = 0
    for i, t in enumerate(table.tiers):
        if t.min_batch <= batch:
            idx = i
    return idx


def _expected_share(table: PolicyTable, hist: Mapping[int, float]) -> float:
    """Expected probe share over the histogram (the largest tier share without one)."""
    if not hist:
        return max((t.explore_share for t in table.tiers), default=0.0)
    total = 0.0
    for bucket, weight in hist.items():
        lo, hi = bucket, min(bucket_upper(bucket), 2 * bucket)
        # A bucket can straddle tiers: average the share over its batch sizes.
        shares = [table.tiers[_tier_index(table, b)].explore_share for b in range(lo, hi + 1)]
        total += weight * float(np.mean(shares))
    return total


def _depth_list(depths: Sequence[int]) -> str:
    return ", ".join("off" if d == 0 else f"d{d}" for d in depths) or "none"
