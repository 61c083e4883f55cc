"""Workloads and scenarios: who sends requests to a simulated server, when, and of what shape.

A `Workload` is either closed-loop (a number of clients, each sending its next request as soon
as the previous one finished; the number may follow a trace over time) or open-loop (Poisson
arrivals at a rate that may follow a trace). Prompt and output lengths come from small
distributions; the acceptance phase (a name from the profile's `acceptance.phases`) may change
over time, so that a run can drift from, say, code to chat.

A `Scenario` is a workload over a duration plus a few knobs that do not depend on the profile.
Built-in scenarios live in sims/scenarios/*.yaml; `load_scenario` reads one by name or path.
"""

from __future__ import annotations

import bisect
import math
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sims.named_yaml import builtin_names, load_named_yaml

SCENARIOS_DIR = Path(__file__).parent / "scenarios"

NonNeg = Annotated[float, Field(ge=0.0)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ----------------------------------------------------------------------------- traces


class Trace(_Strict):
    """A value over simulated time: `points` [[t_s, value], ...], linear or step between them.

    Before the first point the first value holds; after the last point the last value holds.
    """

    points: list[tuple[NonNeg, NonNeg]] = Field(min_length=1)
    interpolation: Literal["linear", "step"] = "linear"

    @model_validator(mode="after")
    def _sorted(self) -> Trace:
        times = [t for t, _ in self.points]
        for i in range(1, len(times)):
            if times[i] < times[i - 1]:
                raise ValueError(
                    f"points[{i}] at t={times[i]} s comes before points[{i - 1}] at "
                    f"t={times[i - 1]} s; list points in time order"
                )
        return self

    def value(self, t: float) -> float:
        pts = self.points
        i = bisect.bisect_right([p[0] for p in pts], t) - 1
        if i < 0:
            return pts[0][1]
        if i >= len(pts) - 1 or self.interpolation == "step":
            return pts[i][1]
        (t0, v0), (t1, v1) = pts[i], pts[i + 1]
        if t1 <= t0:
            return v1
        return v0 + (v1 - v0) * (t - t0) / (t1 - t0)

    def maximum(self) -> float:
        return max(v for _, v in self.points)


def constant(value: float) -> Trace:
    return Trace(points=[(0.0, value)], interpolation="step")


def _as_trace(value: float | Trace) -> Trace:
    return value if isinstance(value, Trace) else constant(float(value))


# ----------------------------------------------------------------------------- lengths


class FixedLength(_Strict):
    dist: Literal["fixed"] = "fixed"
    value: Annotated[int, Field(ge=1)]

    @property
    def mean(self) -> float:
        return float(self.value)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self.value, dtype=np.int64)


class LognormalLength(_Strict):
    """Lognormal with the given mean and coefficient of variation, clipped to [min, max]."""

    dist: Literal["lognormal"] = "lognormal"
    mean: Annotated[float, Field(gt=0.0)]
    cv: Annotated[float, Field(ge=0.0, le=10.0)]
    min: Annotated[int, Field(ge=1)] = 1
    max: Annotated[int, Field(ge=1)] = 1_000_000

    @model_validator(mode="after")
    def _range(self) -> LognormalLength:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) is above max ({self.max})")
        return self

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        sigma2 = math.log1p(self.cv**2)
        mu = math.log(self.mean) - sigma2 / 2
        x = rng.lognormal(mu, math.sqrt(sigma2), n)
        return np.clip(np.rint(x), self.min, self.max).astype(np.int64)


class UniformLength(_Strict):
    dist: Literal["uniform"] = "uniform"
    low: Annotated[int, Field(ge=1)]
    high: Annotated[int, Field(ge=1)]

    @model_validator(mode="after")
    def _range(self) -> UniformLength:
        if self.low > self.high:
            raise ValueError(f"low ({self.low}) is above high ({self.high})")
        return self

    @property
    def mean(self) -> float:
        return (self.low + self.high) / 2

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.integers(self.low, self.high + 1, n, dtype=np.int64)


LengthDist = Annotated[FixedLength | LognormalLength | UniformLength, Field(discriminator="dist")]


# ----------------------------------------------------------------------------- phases


class PhaseStep(_Strict):
    """From `at` seconds on, new requests draw their acceptance phase from `mix`.

    `phase: code` is short for `mix: {code: 1}`. With `blend_s` > 0 the mix moves linearly from
    the previous step's mix to this one over that many seconds (a gradual drift).
    """

    at: NonNeg = 0.0
    phase: str | None = None
    mix: dict[str, Annotated[float, Field(ge=0.0)]] | None = None
    blend_s: NonNeg = 0.0

    @model_validator(mode="after")
    def _one_of(self) -> PhaseStep:
        if (self.phase is None) == (self.mix is None):
            raise ValueError("give exactly one of 'phase' (a name) or 'mix' ({name: weight})")
        if self.mix is not None and sum(self.mix.values()) <= 0:
            raise ValueError("mix weights must not all be zero")
        return self

    def weights(self) -> dict[str, float]:
        if self.phase is not None:
            return {self.phase: 1.0}
        assert self.mix is not None
        total = sum(self.mix.values())
        return {k: v / total for k, v in self.mix.items()}


# ----------------------------------------------------------------------------- workload


class Workload(_Strict):
    """Who sends requests. See docs/simulator.md#workloads for every field."""

    mode: Literal["closed", "open"] = "closed"
    concurrency: float | Trace | None = Field(
        None, description="Closed loop: number of clients (a number or a trace over time)"
    )
    rate_per_s: float | Trace | None = Field(
        None, description="Open loop: Poisson arrival rate in requests/s (number or trace)"
    )
    rate_unit: Literal["per_s", "capacity"] = Field(
        "per_s",
        description="Open loop: `capacity` reads rate_per_s as multiples of the profile's "
        "saturated request rate (sims/capacity.py), so a scenario loads every profile alike",
    )
    prompt_tokens: LengthDist = Field(
        default_factory=lambda: LognormalLength(mean=1024, cv=0.5, min=16, max=32768)
    )
    output_tokens: LengthDist = Field(
        default_factory=lambda: LognormalLength(mean=256, cv=0.5, min=8, max=4096)
    )
    phases: list[PhaseStep] = Field(default_factory=list)
    think_time_s: NonNeg = Field(0.0, description="Closed loop: client pause between requests")
    cut_at: list[NonNeg] = Field(
        default_factory=list,
        description="Closed loop: times at which every request of the clients is aborted and "
        "the clients start afresh, as the bench's load generator cuts its streams at the end "
        "of each level (a trace of such levels, replayed)",
    )

    @model_validator(mode="after")
    def _mode_fields(self) -> Workload:
        if self.mode == "closed":
            if self.rate_per_s is not None:
                raise ValueError("rate_per_s is for mode: open; a closed loop uses concurrency")
            if self.rate_unit != "per_s":
                raise ValueError("rate_unit is for mode: open; a closed loop uses concurrency")
            if isinstance(self.concurrency, float) and self.concurrency < 0:
                raise ValueError("concurrency must be >= 0")
        else:
            if self.rate_per_s is None:
                raise ValueError("mode: open needs rate_per_s (requests per second)")
            if self.concurrency is not None:
                raise ValueError("concurrency is for mode: closed; an open loop uses rate_per_s")
            if isinstance(self.rate_per_s, float) and self.rate_per_s < 0:
                raise ValueError("rate_per_s must be >= 0")
        for i in range(1, len(self.phases)):
            if self.phases[i].at < self.phases[i - 1].at:
                raise ValueError(f"phases[{i}].at comes before phases[{i - 1}].at")
        if self.cut_at and self.mode != "closed":
            raise ValueError("cut_at is for mode: closed; an open loop's requests have no clients")
        for i in range(1, len(self.cut_at)):
            if self.cut_at[i] < self.cut_at[i - 1]:
                raise ValueError(f"cut_at[{i}] comes before cut_at[{i - 1}]; list times in order")
        return self

    def concurrency_trace(self) -> Trace:
        return _as_trace(self.concurrency if self.concurrency is not None else 0.0)

    def rate_trace(self) -> Trace:
        return _as_trace(self.rate_per_s if self.rate_per_s is not None else 0.0)

    def phase_names(self) -> set[str]:
        return {name for step in self.phases for name in step.weights()}

    def check_phases(self, known: set[str] | list[str]) -> None:
        """Raise ValueError naming `phases[i]` if a phase is not in the profile."""
        for i, step in enumerate(self.phases):
            for name in step.weights():
                if name not in known:
                    raise ValueError(
                        f"phases[{i}]: unknown acceptance phase '{name}'; "
                        f"the profile defines {', '.join(sorted(known))}"
                    )

    def phase_mix(self, t: float, default_phase: str) -> dict[str, float]:
        """Mixture of phases new requests draw from at time t."""
        if not self.phases or t < self.phases[0].at:
            return {default_phase: 1.0} if not self.phases else self.phases[0].weights()
        i = bisect.bisect_right([s.at for s in self.phases], t) - 1
        step = self.phases[i]
        current = step.weights()
        if step.blend_s <= 0 or i == 0 or t >= step.at + step.blend_s:
            return current
        prev = self.phases[i - 1].weights()
        w = (t - step.at) / step.blend_s
        names = set(prev) | set(current)
        return {n: (1 - w) * prev.get(n, 0.0) + w * current.get(n, 0.0) for n in names}

    @staticmethod
    def closed(
        concurrency: float | Trace,
        *,
        prompt_tokens: int | None = None,
        output_tokens: int | tuple[int, int] | None = None,
        phase: str | None = None,
    ) -> Workload:
        """A closed loop at fixed lengths (handy for sweeps and tests); `output_tokens` as
        (low, high) draws each request's uniformly from that range."""
        data: dict[str, object] = {"mode": "closed", "concurrency": concurrency}
        if prompt_tokens is not None:
            data["prompt_tokens"] = FixedLength(value=prompt_tokens)
        if isinstance(output_tokens, tuple):
            data["output_tokens"] = UniformLength(low=output_tokens[0], high=output_tokens[1])
        elif output_tokens is not None:
            data["output_tokens"] = FixedLength(value=output_tokens)
        if phase is not None:
            data["phases"] = [PhaseStep(phase=phase)]
        return Workload.model_validate(data)


# ----------------------------------------------------------------------------- scenarios


class DaemonOverrides(_Strict):
    """Daemon config sections an evaluation of this scenario changes. The keys are the daemon
    config's own (docs/daemon.md, "Configuration reference") and are checked there; the clock
    stays the evaluation's simulated one."""

    schedule: dict[str, float] = Field(default_factory=dict)
    guardrails: dict[str, float] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _keeps_the_simulated_clock(self) -> DaemonOverrides:
        if "clock" in self.schedule:
            raise ValueError("daemon.schedule.clock: an evaluation runs on the simulated clock; "
                             "remove the key")
        return self


class Scenario(_Strict):
    """A workload over a duration, with knobs that do not depend on the profile."""

    name: str
    description: str = ""
    duration_s: Annotated[float, Field(gt=0.0)]
    warmup_s: NonNeg = Field(0.0, description="Leading seconds that evaluations do not score")
    sample_interval_s: Annotated[float, Field(gt=0.0)] = Field(
        15.0, description="How often an evaluation scrapes the simulated server"
    )
    daemon: DaemonOverrides = Field(
        default_factory=lambda: DaemonOverrides(),
        description="Settings of the evaluated daemon, e.g. the short intervals of a daemon "
        "run this scenario mirrors",
    )
    workload: Workload


class ScenarioError(ValueError):
    """A scenario file is missing or invalid; the message names the field and the file."""


def builtin_scenarios() -> list[str]:
    return builtin_names(SCENARIOS_DIR)


def load_scenario(name_or_path: str | Path) -> Scenario:
    """Load a built-in scenario by name, or a scenario YAML file by path."""
    return load_named_yaml(
        name_or_path,
        folder=SCENARIOS_DIR,
        model=Scenario,
        error=ScenarioError,
        kind="scenario",
        explain=explain,
    )


def load_workload(data: object) -> Workload:
    """Validate a workload mapping; errors name the field (`prompt_tokens.cv: ...`)."""
    try:
        return Workload.model_validate(data)
    except ValidationError as err:
        raise ScenarioError(explain(err)) from None


def explain(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        # Drop pydantic's union-branch names (e.g. "lognormal", "float") from the path.
        loc = ".".join(str(x) for x in e["loc"] if not _is_branch_tag(x)) or "(top level)"
        lines.append(f"{loc}: {e['msg']}")
    return "; ".join(lines)


def _is_branch_tag(part: object) -> bool:
    return isinstance(part, str) and (
        part in {"fixed", "lognormal", "uniform", "float", "Trace"} or part.startswith("function-")
    )
