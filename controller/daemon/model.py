"""Model: one learner per target group, fitted on the group's pooled samples.

Targets that declare the same `group` (same hardware + model) pool their evidence into one
`models.learner.Learner` (a shape server's group: `models.shape_learner.ShapeLearner`); every
other group has its own. The learner's state is snapshotted to
the store after each fit so a restarted daemon resumes where it stopped.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from models.samples import Sample
from sglang_hooks.contract import PolicyTable

log = logging.getLogger("specctl.daemon")


class ProposalLike(Protocol):
    table: PolicyTable
    predicted_tok_per_s: dict[int, float]
    crossovers: list[tuple[int, int, float]]
    exploration_share: float
    reason: str


class LearnerLike(Protocol):
    version: str

    def fit(self, samples: Sequence[Sample], now: float) -> None: ...

    def propose(
        self,
        now: float,
        live: PolicyTable | None,
        batch_histogram: dict[int, float] | None = None,
        *,
        max_batch: int | None = None,
        incumbent: PolicyTable | None = None,
        incumbent_margin: float | None = None,
        focus: dict[int, float] | None = None,
    ) -> Any: ...

    def predicted_gain(
        self,
        candidate: PolicyTable,
        live: PolicyTable | None,
        batch_histogram: dict[int, float],
        *,
        probes: bool = True,
    ) -> float | None: ...

    def best_depth(self, batch: int) -> int: ...

    def to_json(self) -> dict[str, Any]: ...


LearnerFactory = Callable[[Sequence[int], dict[str, Any], int], LearnerLike]


def default_learner_factory(
    captured: Sequence[int], overrides: dict[str, Any], seed: int
) -> LearnerLike:
    from models.learner import Learner, LearnerConfig

    config = LearnerConfig.model_validate(overrides)
    learner: LearnerLike = Learner(list(captured), config=config, seed=seed)
    return learner


def shape_learner_factory(shapes: Sequence[str], overrides: dict[str, Any],
                          seed: int) -> LearnerLike:  # fmt: skip
    """A shape server's learner (models/shape_learner.py), with the same `learner:` knobs."""
    from models.learner import LearnerConfig
    from models.shape_learner import ShapeLearner

    learner: LearnerLike = ShapeLearner(shapes, LearnerConfig.model_validate(overrides), seed)
    return learner


def restore_learner(learner: LearnerLike, state: Any) -> LearnerLike:
    """A learner rebuilt from a stored snapshot, or the fresh one if that fails."""
    from_json = getattr(type(learner), "from_json", None)
    if from_json is None:
        return learner
    try:
        restored: LearnerLike = from_json(state)
    except Exception as err:  # a snapshot from another learner version: start fresh
        log.warning("learner snapshot not restored (%s); refitting from stored samples", err)
        return learner
    return restored


def validate_learner_overrides(overrides: dict[str, Any]) -> str | None:
    """None if `learner:` in the config is valid, else a sentence naming the field."""
    try:
        from models.learner import LearnerConfig
    except ImportError:
        return None
    from pydantic import ValidationError

    try:
        LearnerConfig.model_validate(overrides)
    except ValidationError as err:
        from controller.daemon.config import explain  # worded as the rest of the config's

        return explain(err, ("learner",))
    return None


class GroupModel:
    """The learner of one group plus the recent samples it is fitted on."""

    def __init__(
        self,
        group: str,
        overrides: dict[str, Any],
        seed: int,
        factory: LearnerFactory = default_learner_factory,
    ) -> None:
        self.group = group
        self.overrides = overrides
        self.seed = seed
        self.factory = factory
        self.learner: LearnerLike | None = None
        self.captured: tuple[int, ...] = ()
        self.samples: list[Sample] = []
        self.fitted_at: float | None = None
        # Fit (fit job) and propose (decide jobs) run on different threads on real time.
        self.lock = threading.RLock()

    def ensure_learner(self, captured: Sequence[int], snapshot: Any | None = None) -> LearnerLike:
        if self.learner is None:
            self.captured = tuple(sorted(set(captured)))
            learner = self.factory(self.captured, self.overrides, self.seed)
            if snapshot is not None:
                learner = restore_learner(learner, snapshot)
            self.learner = learner
        return self.learner

    def ensure_shape_learner(self, shapes: Sequence[str], snapshot: Any | None = None
                             ) -> LearnerLike:  # fmt: skip
        """`ensure_learner` for a shape server: one learner over `shapes` (labels)."""
        if self.learner is None:
            learner = shape_learner_factory(shapes, self.overrides, self.seed)
            if snapshot is not None:
                learner = restore_learner(learner, snapshot)
            self.learner = learner
        return self.learner

    def add(self, samples: Sequence[Sample]) -> None:
        with self.lock:
            self.samples.extend(samples)

    def trim(self, since: float) -> None:
        if self.samples and self.samples[0].t_end <= since:
            self.samples = [s for s in self.samples if s.t_end > since]

    def fit(self, now: float, history_s: float) -> bool:
        with self.lock:
            if self.learner is None or not self.samples:
                return False
            self.trim(now - history_s)
            self.learner.fit(list(self.samples), now)
            self.fitted_at = now
            return True
