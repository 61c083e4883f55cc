"""The profile fields `specctl sim fit` fits, and how a vector of them becomes a profile.

Each fitted field has a size on the server being fitted (`Vector`): the optimiser's unit for
it, and the unit of the weak prior that keeps a field the bench cannot see (for instance the
KV term when every level ran at one context length) at the base profile's value instead of
letting it drift.

Left out on purpose, because a bench cannot tell them from a fitted field: `scheduler.sched_ms`
(per-iteration CPU work, added to every step exactly as `target.fixed_ms`),
`draft.spec_sched_ms` (as `draft.extend_fixed_ms`), `draft.extend_us_per_token` (per verified
token, as `draft.step_us_per_req` per depth), the draft's KV term, MoE and collective terms:
they keep the base profile's values.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sims.profile import Profile


@dataclass(frozen=True)
class Param:
    key: str  # "section.field"
    kind: str  # "ms": per forward or per request; "us": per request or token; "shape"
    lower: float = 0.0
    upper: float = math.inf
    meaning: str = ""

    @property
    def section(self) -> str:
        return self.key.split(".", 1)[0]

    @property
    def field(self) -> str:
        return self.key.split(".", 1)[1]


PARAMS: dict[str, Param] = {
    p.key: p
    for p in (
        Param("target.fixed_ms", "ms", meaning="per forward, any batch"),
        Param("target.weight_read_ms", "ms", meaning="memory floor of a forward"),
        Param("target.compute_us_per_token", "us", meaning="per verified token, past the knee"),
        Param("target.per_req_us", "us", meaning="per request per forward"),
        Param("target.roofline_sharpness", "shape", lower=1.0, upper=16.0, meaning="knee shape"),
        Param("target.kv_us_per_req_per_1k_ctx", "us", meaning="growth with context"),
        Param("draft.step_fixed_ms", "ms", meaning="per depth"),
        Param("draft.step_us_per_req", "us", meaning="per depth per request"),
        Param("draft.extend_fixed_ms", "ms", meaning="verify mode at any depth (vs plain)"),
        Param("draft.extend_us_per_req", "us", meaning="verify mode per request"),
        Param("scheduler.untimed_ms", "ms", meaning="per iteration, unseen by the GPU timer"),
        Param("scheduler.prefill_fixed_ms", "ms", meaning="per prefill batch"),
        Param("scheduler.prefill_us_per_token", "us", meaning="per prompt token"),
        Param("scheduler.request_overhead_ms", "ms", meaning="client gap between requests"),
        Param(
            "scheduler.frontend_ms", "ms", meaning="per request, one at a time, before the queue"
        ),
        Param("scheduler.ttft_overhead_ms", "ms", meaning="in TTFT beyond queue and prefill"),
    )
}
STEP_KEYS = (*(k for k in PARAMS if k.startswith(("target.", "draft."))), "scheduler.untimed_ms")
LOOP_KEYS = tuple(k for k in PARAMS if k not in STEP_KEYS)


def read(profile: Profile, key: str) -> float:
    p = PARAMS[key]
    return float(getattr(getattr(profile, p.section), p.field))


def with_values(base: Profile, values: Mapping[str, float], **top: Any) -> Profile:
    """`base` with the given fitted fields (and top-level fields) replaced, validated."""
    data = base.model_dump()
    for key, value in values.items():
        p = PARAMS[key]
        data[p.section][p.field] = float(value)
    data.update(top)
    return Profile.model_validate(data)


@dataclass(frozen=True)
class Vector:
    """The fitted fields in order, in units of their size on this server.

    A field's size is what moves the figures by a few per cent: 5% of the server's typical step
    for a per-forward or per-request time (`step_ms`), the same spread over the largest batch's
    tokens for a per-token or per-request cost (`tokens`). The optimiser works on value / unit,
    with unit = max(|start value|, size), so a finite-difference step of a few per cent is a
    change the replay can see, whatever a field's units; the prior is relative to the size.
    """

    keys: tuple[str, ...]
    prior: tuple[float, ...]  # the base profile's values
    sizes: tuple[float, ...]
    units: tuple[float, ...]
    upper: tuple[float, ...]  # in the fields' own units

    @classmethod
    def around(
        cls,
        prior: Profile,
        start: Profile,
        keys: Sequence[str],
        step_ms: float,
        tokens: float,
        caps: Mapping[str, float] | None = None,
    ) -> Vector:
        """`caps`: tighter upper bounds than the fields' own, where the data sets one."""
        sizes = []
        for k in keys:
            kind = PARAMS[k].kind
            sizes.append(
                0.05 * step_ms if kind == "ms" else 50.0 * step_ms / tokens if kind == "us" else 1.0
            )
        units = [max(abs(read(start, k)), size) for k, size in zip(keys, sizes, strict=True)]
        upper = [min(PARAMS[k].upper, (caps or {}).get(k, math.inf)) for k in keys]
        return cls(
            tuple(keys),
            tuple(read(prior, k) for k in keys),
            tuple(sizes),
            tuple(units),
            tuple(upper),
        )

    def encode(self, profile: Profile) -> list[float]:
        lo, hi = self.bounds()
        return [
            min(max(read(profile, k) / u, a), b)
            for k, u, a, b in zip(self.keys, self.units, lo, hi, strict=True)
        ]

    def bounds(self) -> tuple[list[float], list[float]]:
        lo = [PARAMS[k].lower / u for k, u in zip(self.keys, self.units, strict=True)]
        hi = [top / u for top, u in zip(self.upper, self.units, strict=True)]
        return lo, hi

    def values(self, z: Sequence[float] | np.ndarray) -> dict[str, float]:
        out = {}
        for k, v, u, top in zip(self.keys, z, self.units, self.upper, strict=True):
            out[k] = min(max(float(v) * u, PARAMS[k].lower), top)
        return out

    def prior_residuals(self, z: Sequence[float] | np.ndarray, weight: float) -> list[float]:
        """weight * log((value + size) / (base + size)): relative, and defined at zero."""
        vals = self.values(z)
        return [
            weight * math.log((vals[k] + size) / (c + size))
            for k, c, size in zip(self.keys, self.prior, self.sizes, strict=True)
        ]
