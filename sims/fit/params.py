"""The profile fields `specctl sim fit` fits, and how a vector of them becomes a profile.

Each fitted field has a size on the server being fitted (`Vector`): the optimiser's unit for
it, and the unit of the weak prior that keeps a field the bench cannot see (for instance the
KV term when every level ran at one context length) at the base profile's value instead of
letting it drift.

Left out on purpose, because a bench cannot tell them from a fitted field: `scheduler.sched_ms`
(per-iteration CPU work, added to every step exactly as `target.fixed_ms`),
`draft.extend_us_per_token` (per verified token, as `draft.step_us_per_req` per depth), the
draft's KV term, MoE and collective terms: they keep the base profile's values.
`draft.spec_sched_ms` is fitted only where depth 0 skips the draft extend (the plugin's off
path); where it runs it, it adds to every speculative iteration as
`draft.extend_fixed_ms` does (`sims.fit.fitting.active_keys` decides). Where depth 0 ran as a
plain decode (the bench recorded the plugin's DECODE runners), depth 0 against the plain server
gives `draft.plain_decode_sched_ms` and `scheduler.plain_decode_host_us_per_req` instead.
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
    kind: str  # "ms": per forward or request; "us": per token; "req": per request; "shape"
    lower: float = 0.0
    upper: float = math.inf
    meaning: str = ""
    # How firmly the prior holds it (x the fit's weight): the closed loop's shape fields
    # (how requests arrive, spread out and wait) trade off against the prefill in a bench,
    # so they move only as far as the data insists.
    prior_scale: float = 1.0

    @property
    def section(self) -> str:
        return self.key.split(".", 1)[0]

    @property
    def field(self) -> str:
        return self.key.split(".", 1)[1]


LOOP_PRIOR = 4.0

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
        Param("draft.spec_sched_ms", "ms", meaning="verify mode at depth 0, extend skipped"),
        Param(
            "draft.plain_decode_sched_ms", "ms", meaning="depth 0 as a plain decode (vs plain)"
        ),
        Param("draft.prefill_ms", "ms", meaning="a prefill's extra with speculation on"),
        Param(
            "draft.prefill_skipped_ms",
            "ms",
            meaning="a prefill's extra at depth 0, the draft's prefill skipped",
        ),
        Param("scheduler.untimed_ms", "ms", meaning="per iteration, unseen by the GPU timer"),
        Param(
            "scheduler.host_us_per_req",
            "req",
            meaning="host work per request, an iteration's floor",
        ),
        Param(
            "scheduler.host_us_per_token", "us", meaning="host work per token, an iteration's floor"
        ),
        Param(
            "scheduler.spec_host_us_per_req",
            "req",
            meaning="a speculative server's extra host work per request",
        ),
        Param(
            "scheduler.plain_decode_host_us_per_req",
            "req",
            meaning="the same at depth 0 as a plain decode",
        ),
        Param("scheduler.prefill_fixed_ms", "ms", meaning="per prefill batch"),
        Param("scheduler.prefill_us_per_token", "us", meaning="per prompt token"),
        Param("scheduler.request_overhead_ms", "ms", meaning="client gap between requests"),
        Param(
            "scheduler.request_overhead_cv",
            "shape",
            upper=2.0,
            meaning="how much that gap varies (lognormal)",
            prior_scale=LOOP_PRIOR,
        ),
        Param(
            "scheduler.frontend_ms",
            "ms",
            meaning="per request, one at a time, before the queue",
            prior_scale=LOOP_PRIOR,
        ),
        Param(
            "scheduler.dispatch_ms",
            "ms",
            meaning="per request, side by side, before the queue",
            prior_scale=LOOP_PRIOR,
        ),
        Param("scheduler.ttft_overhead_ms", "ms", meaning="in TTFT beyond queue and prefill"),
        Param(
            "scheduler.client_us_per_stream",
            "req",
            meaning="client lag per open stream",
            prior_scale=LOOP_PRIOR,
        ),
    )
}
STEP_KEYS = (
    *(
        k
        for k in PARAMS
        if k.startswith(("target.", "draft."))
        and k not in ("draft.prefill_ms", "draft.prefill_skipped_ms")
    ),
    "scheduler.untimed_ms",
)
# The host floor shows only where it exceeds the forward, i.e. in the replay's time per token,
# never in the GPU timer's step: it is fitted with the closed loop's fields.
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
    tokens for a per-token cost (`tokens`) or over its requests for a per-request or per-stream
    one (`requests`). The optimiser works on value / unit,
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
        requests: float | None = None,
    ) -> Vector:
        """`caps`: tighter upper bounds than the fields' own, where the data sets one."""
        spread = {"ms": 0.05 * step_ms, "us": 50.0 * step_ms / tokens}
        spread["req"] = 50.0 * step_ms / (requests or tokens)
        sizes = [spread.get(PARAMS[k].kind, 1.0) for k in keys]
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

    # The search's coordinates: x = log(value + size), so that a step in x is a relative change
    # of a field well above its size and an absolute one of about its size near zero.

    def log_encode(self, profile: Profile) -> list[float]:
        lo, hi = zip(*self.log_bounds(), strict=True)
        return [
            min(max(math.log(read(profile, k) + s), a), math.inf if b is None else b)
            for k, s, a, b in zip(self.keys, self.sizes, lo, hi, strict=True)
        ]

    def log_bounds(self) -> list[tuple[float, float | None]]:
        return [
            (
                math.log(PARAMS[k].lower + s),
                None if math.isinf(top) else math.log(top + s),
            )
            for k, s, top in zip(self.keys, self.sizes, self.upper, strict=True)
        ]

    def log_values(self, x: Sequence[float] | np.ndarray) -> dict[str, float]:
        out = {}
        for k, v, s, top in zip(self.keys, x, self.sizes, self.upper, strict=True):
            out[k] = min(max(math.exp(float(v)) - s, PARAMS[k].lower), top)
        return out

    def prior_residuals(self, z: Sequence[float] | np.ndarray, weight: float) -> list[float]:
        """weight * log((value + size) / (base + size)): relative, and defined at zero."""
        vals = self.values(z)
        return self.prior_of(vals, weight)

    def prior_of(self, values: Mapping[str, float], weight: float) -> list[float]:
        return [
            weight * PARAMS[k].prior_scale * math.log((values[k] + size) / (c + size))
            for k, c, size in zip(self.keys, self.prior, self.sizes, strict=True)
        ]
