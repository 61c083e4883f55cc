"""`specctl sim fit --shapes`: each static draft shape's cost terms and accept length per
prompt family, fitted to a bench of shapes (`sims.fit.shape_folder`) on top of a base profile.

Taken as measured: the servers' limits (running caps, KV pool, prefill budget, context length)
from their /server_info, and per shape and family the accept length SGLang counted, the mean
of the family's levels weighted by their finished requests.

Fitted per shape: `fixed_ms` and `us_per_position`, the terms a shape's iteration costs beyond
the base's cost model at the shape (`Profile.shape_iteration_ms`). Each round replays every
level with the bench's own protocol (`sims.fit.replay`) on the profile so far, over two seeds,
and reads what each level's iteration misses by: the server's mean time per token after the
first (SGLang's inter-token latency, prefill stalls included) against the replay's, times the
tokens an iteration emits. Those misses, relative to the measured iteration, are fitted by
weighted least squares as fixed_ms + us_per_position x batch x draft tokens (the replay's mean
batch), and added. The terms enter the iteration linearly, so a few rounds settle it.

Levels the bench flagged (too short, too few requests, other traffic, client-bound) are left
out of the fit and of the accept lengths, and named with the bench's reason.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from sglang_hooks.draft_shape import PLAIN, parse_shape
from sims.fit.framing import FitError, stated_limits
from sims.fit.replay import LevelShape, Replayed, replay
from sims.fit.shape_folder import ShapeBench, ShapeLevel
from sims.profile import Profile, ShapeCost
from sims.shape_server import shape_server

FIT_SEEDS = (0, 1)
ROUNDS = 6
SETTLED = 0.01  # a round that moves no level's iteration by more than this share ends the fit


@dataclass(frozen=True)
class LeftOut:
    level: ShapeLevel
    reason: str


@dataclass
class ShapeFit:
    profile: Profile
    fitted: list[ShapeLevel]  # the levels the fit used
    left_out: list[LeftOut]
    notes: list[str] = field(default_factory=list)
    rounds: int = 0
    seconds: float = 0.0


def usable(level: ShapeLevel) -> str | None:
    """Why `level` is left out of the fit, or None if it is fitted."""
    if level.flags:
        return f"flagged by the bench ({', '.join(level.flags)})"
    reason = level.level.unfit_reason()
    if reason is None and level.shape != PLAIN and level.level.accept_length is None:
        reason = "no accept length (the server's counters said nothing)"
    return reason


@dataclass(frozen=True)
class Requests:
    """A prompt family's requests, as every shape ran them."""

    prompt_tokens: int
    output_tokens: int  # the mean
    output_range: tuple[int, int] | None  # the shortest and longest


def family_requests(bench: ShapeBench) -> dict[str, Requests]:
    """Per family, its requests over all its levels: every shape ran the same requests of a
    family, so a level's replay draws from the family's whole range of outputs, not only from
    what its short window happened to finish (and a flagged level that finished nothing is
    replayed with them too)."""
    out: dict[str, Requests] = {}
    for family in bench.families:
        levels = [sl.level for sl in bench.levels if sl.family == family]
        prompts = [lv.prompt_tokens for lv in levels if lv.prompt_tokens]
        outputs = [lv.output_tokens for lv in levels if lv.output_tokens]
        lows = [lv.output_tokens_min for lv in levels if lv.output_tokens_min]
        highs = [lv.output_tokens_max for lv in levels if lv.output_tokens_max]
        if not prompts or not outputs:
            continue
        spread = (min(lows), max(highs)) if lows and highs and min(lows) < max(highs) else None
        out[family] = Requests(round(statistics.fmean(prompts)),
                               round(statistics.fmean(outputs)), spread)
    return out


def protocol(level: ShapeLevel, requests: dict[str, Requests]) -> LevelShape:
    """The level's bench protocol (a duration-bound window after its warm-up) over its
    family's requests."""
    family = requests[level.family]
    return LevelShape(
        depth=level.level.depth, concurrency=level.level.concurrency,
        prompt_tokens=family.prompt_tokens, output_tokens=family.output_tokens,
        duration_s=level.level.elapsed_s, warmup_s=level.level.warmup_s,
        output_range=family.output_range,
    )  # fmt: skip


def replay_level(profile: Profile, level: ShapeLevel, requests: dict[str, Requests],
                 seed: int) -> Replayed:  # fmt: skip
    """One replay of `level` on the server `profile` describes, started at the level's shape."""
    server = shape_server(profile, level.shape)
    return replay(server.profile, protocol(level, requests), seed=seed, phase=level.family)


def accept_lengths(levels: Sequence[ShapeLevel]) -> dict[str, dict[str, float]]:
    """Per shape and family, SGLang's accept length over the levels, weighted by requests."""
    sums: dict[tuple[str, str], list[float]] = {}
    for sl in levels:
        lv = sl.level
        if sl.shape == PLAIN or lv.accept_length is None:
            continue
        acc = sums.setdefault((sl.shape, sl.family), [0.0, 0.0])
        acc[0] += lv.accept_length * max(lv.requests, 1)
        acc[1] += max(lv.requests, 1)
    out: dict[str, dict[str, float]] = {}
    for (shape, family), (total, weight) in sorted(sums.items()):
        out.setdefault(shape, {})[family] = round(total / weight, 4)
    return out


def _framed(bench: ShapeBench, base: Profile, name: str, fitted: Sequence[ShapeLevel]
            ) -> tuple[Profile, list[str]]:  # fmt: skip
    """The base with the servers' limits and the measured accept lengths, every shape's terms
    at zero."""
    notes = []
    lengths = accept_lengths(fitted)
    families = sorted({f for by in lengths.values() for f in by})
    for shape in bench.shapes:
        if shape == PLAIN:
            continue
        missing = [f for f in families if f not in lengths.get(shape, {})]
        if missing:
            raise FitError(f"shape {shape}: no level of family {', '.join(missing)} left to fit "
                           "(each shape needs every family the others have): bench it there, "
                           "or give the shapes folder without that family's files")
    spec = [f for s, f in bench.facts.items() if s != PLAIN]
    caps = {f.cap for f in spec}
    if len(caps) > 1:
        notes.append(f"the shapes' servers ran different running caps ({sorted(caps)}); the "
                     f"profile takes the largest")
    plain = bench.facts.get(PLAIN)
    sched = base.scheduler
    first = spec[0]
    update: dict[str, object] = {
        "max_running_requests_spec": max(caps),
        "max_running_requests_nospec": plain.cap if plain else sched.max_running_requests_nospec,
    }
    update.update(stated_limits(first, first.recv_interval))
    shapes = {s: ShapeCost(fixed_ms=0.0, us_per_position=0.0, accept_length=lengths.get(s, {}))
              for s in bench.shapes}
    data = base.model_dump()
    data.update(name=name, scheduler={**sched.model_dump(), **update},
                shapes={s: c.model_dump() for s, c in shapes.items()}, static_shape=None)
    return Profile.model_validate(data), notes


def _with_terms(profile: Profile, terms: dict[str, tuple[float, float]]) -> Profile:
    assert profile.shapes is not None
    shapes = {s: c.model_copy(update={"fixed_ms": terms[s][0], "us_per_position": terms[s][1]})
              for s, c in profile.shapes.items()}
    try:
        return Profile.model_validate({**profile.model_dump(),
                                       "shapes": {s: c.model_dump() for s, c in shapes.items()}})
    except ValueError as err:  # pydantic's ValidationError: e.g. a step of <= 0 ms at some batch
        raise FitError(f"the fitted shape terms make no valid profile ({err}); the bench's "
                       "levels of a shape may be too few or too noisy to fit") from None


def _per_iteration_ms(level: ShapeLevel, itl_ms: float | None) -> float | None:
    """A time per token after the first, as the time of one iteration (its tokens per request)."""
    if itl_ms is None:
        return None
    return itl_ms * (level.level.accept_length or 1.0)


def _step(terms: tuple[float, float], misses: list[tuple[float, float, float]]
          ) -> tuple[tuple[float, float], float]:  # fmt: skip
    """The terms plus the weighted least-squares line through (positions, miss ms, measured
    ms), relative misses counting (a level at one stream weighs as much as one at 256); and
    the most the line moves a level's iteration, relative to the measured one."""
    x = np.array([m[0] for m in misses])
    y = np.array([m[1] for m in misses])
    w = 1.0 / np.array([m[2] for m in misses])
    if len(set(x.round(6))) < 2:  # one batch size: only a fixed term can be told
        da, db = float(np.average(y, weights=w * w)), 0.0
    else:
        design = np.stack([np.ones_like(x), x / 1000.0], axis=1) * w[:, None]
        (da, db), *_ = np.linalg.lstsq(design, y * w, rcond=None)
    moved = float(np.max(np.abs(da + db * x / 1000.0) * w))
    return (terms[0] + float(da), terms[1] + float(db)), moved


def fit_shapes(bench: ShapeBench, base: Profile, name: str, *,
               progress: Callable[[str], None] | None = None) -> ShapeFit:  # fmt: skip
    """`base` with the bench's shapes fitted in (module docstring)."""
    t0 = time.monotonic()
    left_out = [LeftOut(sl, why) for sl in bench.levels if (why := usable(sl)) is not None]
    fitted = [sl for sl in bench.levels if usable(sl) is None]
    if not fitted:
        raise FitError(f"{bench.folder}: every level is left out (flagged or unfinished); "
                       "nothing to fit")
    profile, notes = _framed(bench, base, name, fitted)
    requests = family_requests(bench)
    terms = {s: (0.0, 0.0) for s in bench.shapes}
    rounds = 0
    for rounds in range(1, ROUNDS + 1):
        if progress is not None:
            progress(f"round {rounds}: replaying {len(fitted)} levels")
        misses: dict[str, list[tuple[float, float, float]]] = {s: [] for s in bench.shapes}
        for sl in fitted:
            runs = [replay_level(profile, sl, requests, seed) for seed in FIT_SEEDS]
            sim = _per_iteration_ms(sl, _mean([r.server_itl_ms for r in runs]))
            measured = _per_iteration_ms(sl, sl.level.server_itl_ms or sl.level.tpot_p50_ms)
            batch = _mean([r.mean_batch for r in runs])
            if sim is None or measured is None or batch is None:
                continue
            drafted = parse_shape(sl.shape)
            positions = batch * (1 if drafted is None else drafted.draft_tokens)
            misses[sl.shape].append((positions, measured - sim, measured))
        moved = 0.0
        for shape, found in misses.items():
            if found:
                terms[shape], most = _step(terms[shape], found)
                moved = max(moved, most)
        profile = _with_terms(profile, terms)
        if progress is not None:
            progress(f"round {rounds}: the terms moved an iteration by {moved:.1%} at most")
        if moved < SETTLED:
            break
    for shape, found in misses.items():
        if not found:
            notes.append(f"shape {shape}: no level left to fit its terms; they stay 0 (the cost "
                         "model at the shape as the base has it)")
    return ShapeFit(profile, fitted, left_out, notes, rounds, time.monotonic() - t0)


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None
