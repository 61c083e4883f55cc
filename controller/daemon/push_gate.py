"""Is a new table worth a push? A predicted gain above `push_min_gain`, or missing evidence.

Every push rewrites the server's table and starts an after-push check; a push that the model
itself expects to change nothing (+0.0%) is noise in the log and in the store. So a learned
table replaces the live one only when one of these holds:

- **gain**: the learner predicts at least `push_min_gain` more decode tok/s than the live table,
  over the recent load (the last 10 minutes) or the load of the moment (the last minute), for
  the plain decisions or with probes counted (dropping probes that are no longer needed is a
  gain of its own);
- **evidence**: at a batch bucket that carries load, the new table probes a shape at half the
  exploration cap or more that the live table does not probe there: the model asks for
  evidence it cannot get otherwise (the cost stays within the cap);
- **fewer probes**: over the load, the new table probes at most half as often as the live one
  and at least an eighth of the cap less. Probes of near neighbours cost less than
  `push_min_gain` even at the full cap, so without this rule the probes of a cold start would
  run for ever once the model is sure;
- **cheaper probes**: the decisions are predicted no worse on any load, and the new table's
  probes cost at least a quarter of `push_min_gain` less (with probes counted) while probing
  less often: a probe of a far depth (off at a small batch) costs more per step than one of a
  near tie, so halving the share is not the only saving worth a push.

Over a table the daemon did not push itself (found on the server at start-up, set by hand, or
loaded by the server from a policy file), only **gain** counts (`gain_only`), and only the gain
of the decisions: that table is its operator's choice, and the model's wish for probes is no
evidence against it, nor is what it guesses depths it has not measured would earn as probes
(the learner decides only among depths with evidence of their own, so the decisions' gain is
one the samples back).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sglang_hooks.contract import PolicyTable, Tier, bucket_upper, shape_tier, tier_label

LOADED_SHARE = 0.05  # a bucket with this share of the load is one where probes matter

GainFn = Callable[[PolicyTable, PolicyTable, Mapping[int, float], bool], float | None]


@dataclass(frozen=True)
class GateDecision:
    push: bool
    gain: float | None  # the largest predicted gain found (None: nothing to compare)
    missing_probes: tuple[tuple[int, str], ...]  # (bucket, shape: `off`, `d2`, `3x4x16`) added
    why: str
    # Which rule let the push through ("" when none did): the daemon's metrics count pushes
    # by it. takeover | gain | evidence | fewer_probes | cheaper_probes
    rule: str = ""


def _tier_at(table: PolicyTable, batch: int) -> Tier:
    tier = table.tiers[0]
    for t in table.tiers:
        if t.min_batch <= batch:
            tier = t
    return tier


def missing_probes(
    candidate: PolicyTable,
    live: PolicyTable,
    hist: Mapping[int, float],
    cap: float,
) -> list[tuple[int, str]]:
    """(bucket, shape) pairs probed by `candidate` at >= cap/2 in a loaded bucket, not by
    `live`; a shape as `tier_label` names it (`off`, `d2`, `3x4x16`)."""
    out: list[tuple[int, str]] = []
    for bucket, share in sorted(hist.items()):
        if share < LOADED_SHARE:
            continue
        for batch in range(bucket, min(bucket_upper(bucket), 2 * bucket) + 1):
            new, old = _tier_at(candidate, batch), _tier_at(live, batch)
            if new.explore_share < cap / 2:
                continue
            probed = set(old.explore_shapes) if old.explore_share > 0 else set()
            for shape in new.explore_shapes:
                name = tier_label(shape_tier(1, shape))
                if shape not in probed and shape != old.shape and (bucket, name) not in out:
                    out.append((bucket, name))
    return out


def probe_share(table: PolicyTable, hist: Mapping[int, float]) -> float:
    """Expected share of probe iterations under `table` over the load `hist`."""
    total = sum(hist.values())
    if total <= 0:
        return 0.0
    out = 0.0
    for bucket, share in hist.items():
        batches = range(bucket, min(bucket_upper(bucket), 2 * bucket) + 1)
        mean = sum(_tier_at(table, b).explore_share for b in batches) / len(batches)
        out += share / total * mean
    return out


def decide_push(
    candidate: PolicyTable,
    live: PolicyTable | None,
    hists: Mapping[str, Mapping[int, float]],
    gain_of: GainFn,
    min_gain: float,
    cap: float,
    *,
    gain_only: bool = False,
) -> GateDecision:
    """Whether to push `candidate` over `live`, given the loads to weigh it on (`gain_only`:
    over a table specctl did not push, a predicted gain is the only reason to replace it)."""
    if live is None:
        return GateDecision(True, None, (), "no specctl table yet", "takeover")
    best: tuple[float, str] | None = None
    worst_plain: float | None = None  # the decisions' predicted gain, least over the loads
    best_probed: float | None = None  # the predicted gain with probes counted, most
    for name, hist in hists.items():
        if not hist:
            continue
        for probes in (False,) if gain_only else (False, True):
            g = gain_of(candidate, live, hist, probes)
            if g is None:
                continue
            if probes:
                best_probed = g if best_probed is None else max(best_probed, g)
            else:
                worst_plain = g if worst_plain is None else min(worst_plain, g)
            if best is None or g > best[0]:
                what = "with probes" if probes else "decisions"
                best = (g, f"{what}, {name} load")
    gain = None if best is None else best[0]
    if best is not None and best[0] >= min_gain:
        return GateDecision(True, gain, (), f"predicted {best[0]:+.1%} ({best[1]})", "gain")
    shown = "n/a" if gain is None else f"{gain:+.1%}"
    if gain_only:
        return GateDecision(
            False,
            gain,
            (),
            f"keeping the table found on the server: predicted {shown} < push_min_gain "
            f"{min_gain:.1%}",
        )
    merged: dict[int, float] = {}
    for hist in hists.values():
        for b, w in hist.items():
            merged[b] = max(merged.get(b, 0.0), w)
    missing = missing_probes(candidate, live, merged, cap)
    if missing:
        where = ", ".join(f"{name} at bucket {b}" for b, name in missing[:3])
        return GateDecision(
            True, gain, tuple(missing), f"evidence needed: probes {where}", "evidence"
        )
    old_share, new_share = probe_share(live, merged), probe_share(candidate, merged)
    if new_share <= old_share / 2 and old_share - new_share >= cap / 8:
        return GateDecision(
            True,
            gain,
            (),
            f"fewer probes: {old_share:.1%} -> {new_share:.1%} of steps",
            "fewer_probes",
        )
    if (
        worst_plain is not None
        and best_probed is not None
        and worst_plain >= 0.0
        and best_probed >= min_gain / 4
        and new_share < old_share
    ):
        return GateDecision(
            True,
            gain,
            (),
            f"cheaper probes: {best_probed:+.2%} with probes, decisions no worse",
            "cheaper_probes",
        )
    return GateDecision(False, gain, (), f"predicted {shown} < push_min_gain {min_gain:.1%}")
