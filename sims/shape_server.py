"""A server started at one static draft shape, as SGLang runs one: the profile's view of it.

`shape_server(profile, name)` gives a profile the engine runs unchanged: the shape's steps are
its one captured depth, costed by the shape (`Profile.shape_iteration_ms`), and each phase's
acceptance is the chain of that depth with a constant per-position rate whose mean accept
length is the shape's (a tree's mean is what tok/s follows; its spread over requests is not
modelled). `plain` is the server without speculation, costed by its shape entry.

`switching_server(profile, names)` is the plugin's shape server: started at the shape that
dominates the list, it captured every listed shape and runs, per iteration, the one the
pushed table picks. Each shape is an engine lane costed and accepting as its static server
does: on the GPU a shape held inside such a server ran at its stock server's tok/s (0.98-1.01,
docs/measurements.md#tree-switch).

`plain` in the list is the server's off: SGLang's depth 0 as the plugin runs it there (a
one-token verify at top-k 1, no draft, the draft extend skipped), a lane of 0 steps keyed 0 as
a chain's lane is keyed by its depth. It accepts nothing and costs the plain server's
iteration (the profile's `plain` shape) plus `draft.spec_sched_ms`, the spec-v2 scheduling a
speculative server pays at every iteration, depth 0 included: on the GPU SGLang's depth 0 with
the draft extend skipped ran at 0.978-0.995 of a plain server at 1-16 streams
(docs/measurements.md#sglang-depth0), a gap of that size. Its admissions still pay the draft's
prefill (`draft.prefill_ms`: the plugin skips only the extend at off on a shape server), and
the KV a tree server reserves per request beyond a plain server's is not modelled (the engine
reserves a request's prompt and output only).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import numpy as np

from sglang_hooks.draft_shape import PLAIN, parse_shape
from sims.engine import TREE_LANE_BASE, Lane
from sims.fit.framing import acceptance_rates
from sims.profile import AcceptanceModel, DraftCost, Profile


class ShapeQuestionError(ValueError):
    """A shape question the profile cannot answer; the message names the fix."""


@dataclass(frozen=True)
class ShapeServer:
    profile: Profile
    depth: int | None  # the depth the engine runs (the shape's steps); None: plain

    @property
    def speculative(self) -> bool:
        return self.depth is not None


def known_shapes(profile: Profile) -> list[str]:
    """The profile's shapes, or why it has none."""
    if not profile.shapes:
        raise ShapeQuestionError(
            f"profile {profile.name} describes no draft shapes (depths only); fit them from "
            "a bench of shapes: specctl sim fit --shapes SHAPES_DIR --base "
            f"{profile.name} --out PROFILE.yaml"
        )
    return list(profile.shapes)


def shape_server(profile: Profile, name: str) -> ShapeServer:
    """The server `profile` describes, started at shape `name` (one of its shapes)."""
    shapes = known_shapes(profile)
    if name not in shapes:
        raise ShapeQuestionError(
            f"shape {name} is not in profile {profile.name} (it has {', '.join(shapes)})"
        )
    shape = parse_shape(name)
    phases = profile.shape_phases or [profile.acceptance.default_phase]
    assert profile.shapes is not None
    if shape is None:
        # The phases only label requests here: a plain server accepts nothing.
        width = max(profile.captured_depths)
        rates = {p: [0.0] * width for p in phases}
        update: dict[str, object] = {}
    else:
        lengths = profile.shapes[name].accept_length
        rates = {p: acceptance_rates({shape.steps: lengths[p]}, shape.steps) for p in phases}
        update = {"captured_depths": [shape.steps], "full_depth": shape.steps}
    acceptance = AcceptanceModel(phases=rates, default_phase=phases[0])
    view = profile.model_copy(update={**update, "acceptance": acceptance, "static_shape": name})
    return ShapeServer(Profile.model_validate(view.model_dump()),
                       None if shape is None else shape.steps)


@dataclass(frozen=True)
class SwitchingServer:
    profile: Profile  # acceptance phases: the shapes'; depths: the lanes' steps
    lanes: dict[int, Lane]
    keys: dict[str, int]  # shape label -> the lane that runs it


OFF_LANE = 0  # off's lane: depth 0, as a chain's lane is its depth


def switching_server(profile: Profile, names: list[str]) -> SwitchingServer:
    """The shape server `profile` describes, having captured the shapes `names` (shapes of the
    profile, a chain at most once per depth, at least one that drafts; `plain` is its off)."""
    shapes = known_shapes(profile)
    if PLAIN in names:
        require_plain(profile)
    unknown = [n for n in names if n not in shapes]
    if unknown:
        raise ShapeQuestionError(
            f"shape {unknown[0]} is not in profile {profile.name} (it has {', '.join(shapes)})"
        )
    if all(n == PLAIN for n in names):
        raise ShapeQuestionError("a shape server needs at least one drafting shape")
    assert profile.shapes is not None
    phases = profile.shape_phases
    lanes: dict[int, Lane] = {}
    keys: dict[str, int] = {}
    for i, name in enumerate(dict.fromkeys(names)):
        shape = parse_shape(name)
        if shape is None:
            lanes[OFF_LANE] = Lane(PLAIN, 0, {p: [] for p in phases}, partial(_off_ms, profile))
            keys[name] = OFF_LANE
            continue
        key = shape.steps if shape.is_chain else TREE_LANE_BASE + i
        lengths = profile.shapes[name].accept_length
        rates = {p: acceptance_rates({shape.steps: lengths[p]}, shape.steps) for p in phases}
        lanes[key] = Lane(name, shape.steps, rates, partial(profile.shape_iteration_ms, name))
        keys[name] = key
    deepest = max(lane.steps for lane in lanes.values())
    widest = next(lane for lane in lanes.values() if lane.steps == deepest)
    acceptance = AcceptanceModel(phases=dict(widest.rates), default_phase=phases[0])
    update = {
        "acceptance": acceptance, "full_depth": deepest,
        "captured_depths": sorted({lane.steps for lane in lanes.values()}),
    }  # fmt: skip
    if OFF_LANE in lanes:
        update["draft"] = _off_draft(profile)
    view = profile.model_copy(update=update)
    return SwitchingServer(Profile.model_validate(view.model_dump()), lanes, keys)


def require_plain(profile: Profile) -> None:
    """Off on a shape server is costed by the profile's plain shape: say how to get one."""
    if PLAIN not in (profile.shapes or {}):
        raise ShapeQuestionError(
            f"profile {profile.name} has no plain shape, which off on a shape server is costed "
            "by; fit the profile from a bench of shapes that includes plain: specctl sim fit "
            f"--shapes SHAPES_DIR --base {profile.name} --out PROFILE.yaml"
        )


def _off_ms(profile: Profile, batch: np.ndarray, context: np.ndarray) -> np.ndarray:
    """Off on a shape server: the plain server's iteration, plus spec-v2's scheduling."""
    return profile.shape_iteration_ms(PLAIN, batch, context) + profile.draft.spec_sched_ms


def _off_draft(profile: Profile) -> DraftCost:
    """What off runs on a shape server, as the plugin runs it there: the draft extend skipped,
    the target's verify (not its plain decode graphs: the server verifies trees), and the
    draft's prefill at every admission."""
    return profile.draft.model_copy(update={
        "extend_at_depth0": False, "plain_decode_at_depth0": False, "prefill_at_depth0": True,
    })  # fmt: skip
