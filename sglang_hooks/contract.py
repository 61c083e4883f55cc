"""The specctl contract: policy table, admin RPC encoding and per-depth metric names.

One module shared by the SGLang plugin (server side), the simulator (a stand-in server) and
the daemon (client side), so the three cannot drift apart. It imports only the standard
library: it is loaded inside SGLang's scheduler processes, where every import costs start-up
time, and its hot path (`TierSelector.select`) runs once per decode iteration.

Policy table
    Ordered batch-size tiers. Tier i covers batch sizes [min_batch_i, min_batch_{i+1}) and runs
    `depth` draft steps (0 = drafting off): a chain, or with `topk` > 1 a draft tree of that many
    steps verifying `draft_tokens` positions (the shape STEPSxTOPKxDRAFT,
    sglang_hooks/draft_shape.py). Tier i is *entered* from below at min_batch_i and *left*
    downwards only when the batch falls below min_batch_i - hysteresis_i, so a batch oscillating
    around a threshold does not flap. `explore_share` is the probability that one iteration in
    this tier runs one of `explore_depths` (chains) or `explore_trees` instead, so that the
    controller can compare shapes at the same load. A table without trees is written, pushed
    and fingerprinted exactly as before trees existed.

Admin RPC
    SGLang's `POST /set_internal_state` body is `{"server_args": {key: number}}`: SGLang 0.5.23
    types `SetInternalStateReq.server_args` as `Dict[str, Union[int, float]]` and its HTTP layer
    rejects anything else with 400 (its validation handler, not FastAPI's 422). So a table
    travels as flat numeric keys under the `specctl_` prefix (see `encode_table` /
    `decode_table`). The live table is read back from `/server_info` ->
    `internal_states[i]["specctl"]` (free-form JSON, see `server_state`).

Metrics
    Counters per (depth, batch-size bucket) on the server's own `/metrics`; tok/s, step time and
    acceptance length per (depth, batch size) are exact ratios of their deltas.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from sglang_hooks.draft_shape import DraftShape, Shape, ShapeError, chain, label, parse_shape

CONTRACT_VERSION = 1

# ----------------------------------------------------------------------------- errors


class PolicyError(ValueError):
    """A policy table or RPC payload is invalid. `field` names the offending field."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")

    def to_json(self) -> dict[str, str]:
        return {"error": "invalid_policy", "field": self.field, "message": self.message}


# ----------------------------------------------------------------------------- policy table

MAX_TIERS = 16
MAX_DEPTH = 15
MAX_EXPLORE_SHARE = 0.5  # beyond this, "exploration" is a second policy, not a probe
MAX_TOPK = 15
MAX_EXPLORE_TREES = 4  # tree probes per tier; each costs a CUDA-graph set on the server


@dataclass(frozen=True)
class Tier:
    min_batch: int
    depth: int  # draft steps; 0: drafting off
    hysteresis: int = 0
    explore_share: float = 0.0
    explore_depths: tuple[int, ...] = ()
    topk: int = 1  # above 1: a draft tree of `depth` steps
    draft_tokens: int | None = None  # a tree's verify width; a chain's is always depth + 1
    explore_trees: tuple[DraftShape, ...] = ()

    @property
    def shape(self) -> Shape:
        """What the tier runs: its chain (None when off) or its tree."""
        if self.topk == 1:
            return chain(self.depth)
        return DraftShape(self.depth, self.topk, self.draft_tokens or 0)

    @property
    def explore_shapes(self) -> tuple[Shape, ...]:
        """The tier's probes, chains first."""
        return (*(chain(d) for d in self.explore_depths), *self.explore_trees)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "min_batch": self.min_batch,
            "depth": self.depth,
            "hysteresis": self.hysteresis,
            "explore_share": self.explore_share,
            "explore_depths": list(self.explore_depths),
        }
        # Only trees add keys, so a chain table's form and fingerprint are what they were.
        if self.topk != 1:
            out["topk"], out["draft_tokens"] = self.topk, self.draft_tokens
        if self.explore_trees:
            out["explore_trees"] = [t.label for t in self.explore_trees]
        return out


@dataclass(frozen=True)
class PolicyTable:
    """A validated tier table. Build it with `parse_table` or `PolicyTable.build`."""

    tiers: tuple[Tier, ...]
    version: int = 0
    _bounds: tuple[int, ...] = field(default=(), repr=False, compare=False)

    @staticmethod
    def build(
        tiers: Sequence[Tier],
        version: int = 0,
        captured_depths: Iterable[int] | None = None,
        captured_trees: Iterable[DraftShape] = (),
    ) -> PolicyTable:
        validate_tiers(tiers, captured_depths, captured_trees)
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise PolicyError("version", f"must be a non-negative integer, got {version!r}")
        return PolicyTable(
            tiers=tuple(tiers),
            version=version,
            _bounds=tuple(t.min_batch for t in tiers),
        )

    @property
    def depths(self) -> frozenset[int]:
        """Every chain depth this table may run, exploration included (trees: `trees`)."""
        out: set[int] = set()
        for t in self.tiers:
            if t.topk == 1:
                out.add(t.depth)
            out.update(t.explore_depths)
        return frozenset(out)

    @property
    def trees(self) -> frozenset[DraftShape]:
        """Every draft tree this table may run, exploration included."""
        out: set[DraftShape] = set()
        for t in self.tiers:
            if t.topk > 1 and t.shape is not None:
                out.add(t.shape)
            out.update(t.explore_trees)
        return frozenset(out)

    def depth_for(self, batch_size: int) -> int:
        """The depth for a batch size without hysteresis state (the table's plain reading)."""
        return self.tier_for(batch_size).depth

    def tier_for(self, batch_size: int) -> Tier:
        """The tier for a batch size without hysteresis state (the table's plain reading)."""
        return self.tiers[plain_tier_index(self._bounds, batch_size)]

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "tiers": [t.to_json() for t in self.tiers]}

    @property
    def fingerprint(self) -> str:
        """Eight hex digits naming the tiers (not the version): two tables with the same
        fingerprint decide alike, whoever numbered them. Shown beside the version (`label`),
        because version numbers come from whoever pushes or freezes and can repeat."""
        canonical = json.dumps([t.to_json() for t in self.tiers], sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()[:8]

    def label(self) -> str:
        """`v12 #1a2b3c4d`: the version with the fingerprint."""
        return f"v{self.version} #{self.fingerprint}"

    def describe(self) -> str:
        """One line a person can read: `1-7: d3 | 8-31: d1 (probes) | 32+: off`.

        Adjacent tiers that run the same depth are shown as one span (a learned table splits
        them only to give their batch sizes different probe shares); "(probes)" marks a span
        in which some iterations explore other depths.
        """
        spans: list[tuple[int, str, bool]] = []  # (min_batch, what it runs, probes)
        for t in self.tiers:
            probes = t.explore_share > 0.0
            runs = tier_label(t)
            if spans and spans[-1][1] == runs:
                lo, _, seen = spans[-1]
                spans[-1] = (lo, runs, seen or probes)
            else:
                spans.append((t.min_batch, runs, probes))
        parts = []
        for i, (lo, runs, probes) in enumerate(spans):
            hi = spans[i + 1][0] - 1 if i + 1 < len(spans) else None
            span = f"{lo}+" if hi is None else f"{lo}-{hi}"
            parts.append(f"{span}: {runs}" + (" (probes)" if probes else ""))
        return " | ".join(parts)


def shape_tier(min_batch: int, shape: Shape, hysteresis: int = 0) -> Tier:
    """The tier that runs `shape` from `min_batch` up: a chain as its depth, a tree by its
    shape, None (plain) as off."""
    if shape is None:
        return Tier(min_batch=min_batch, depth=0, hysteresis=hysteresis)
    if shape.topk == 1:
        return Tier(min_batch=min_batch, depth=shape.steps, hysteresis=hysteresis)
    return Tier(min_batch=min_batch, depth=shape.steps, hysteresis=hysteresis, topk=shape.topk,
                draft_tokens=shape.draft_tokens)  # fmt: skip


def tier_label(tier: Tier) -> str:
    """`off`, `d3` for a chain, the shape `3x4x16` for a tree."""
    if tier.topk > 1:
        return label(tier.shape)
    return "off" if tier.depth == 0 else f"d{tier.depth}"


def off_field(tiers: Sequence[Tier]) -> str | None:
    """The first field that runs or probes off (depth 0), like `tiers[2].depth`; None if none.
    A shape server captures off only when plain was listed, so its refusal names this field."""
    for i, tier in enumerate(tiers):
        if tier.topk == 1 and tier.depth == 0:
            return f"tiers[{i}].depth"
        if 0 in tier.explore_depths:
            return f"tiers[{i}].explore_depths[{tier.explore_depths.index(0)}]"
    return None


def single_depth_table(depth: int, version: int = 0) -> PolicyTable:
    """A one-tier table that runs `depth` at every batch size (used to force a depth)."""
    return PolicyTable.build([Tier(min_batch=1, depth=depth)], version=version)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def validate_tiers(
    tiers: Sequence[Tier],
    captured_depths: Iterable[int] | None = None,
    captured_trees: Iterable[DraftShape] = (),
) -> None:
    """Raise PolicyError naming the first bad field, e.g. `tiers[2].depth`. With
    `captured_depths` (the server is known) a tree must also be among `captured_trees`."""
    if not tiers:
        raise PolicyError("tiers", "at least one tier is required (min_batch 1)")
    if len(tiers) > MAX_TIERS:
        raise PolicyError("tiers", f"at most {MAX_TIERS} tiers, got {len(tiers)}")
    captured = None if captured_depths is None else sorted(set(captured_depths))
    trees = None if captured_depths is None else sorted(set(captured_trees), key=label)
    prev_min = 0
    for i, t in enumerate(tiers):
        where = f"tiers[{i}]"
        if not _is_int(t.min_batch) or t.min_batch < 1:
            raise PolicyError(f"{where}.min_batch", f"must be an integer >= 1, got {t.min_batch!r}")
        if i == 0 and t.min_batch != 1:
            raise PolicyError(
                f"{where}.min_batch",
                f"the first tier must start at batch size 1, got {t.min_batch}",
            )
        if i > 0 and t.min_batch <= prev_min:
            raise PolicyError(
                f"{where}.min_batch",
                f"tiers must be sorted by strictly increasing min_batch; "
                f"{t.min_batch} follows {prev_min}",
            )
        if not _is_int(t.topk) or not 1 <= t.topk <= MAX_TOPK:
            raise PolicyError(
                f"{where}.topk", f"must be an integer in [1, {MAX_TOPK}], got {t.topk!r}"
            )
        if t.topk == 1:
            _check_depth(f"{where}.depth", t.depth, captured)
            if t.draft_tokens is not None:
                raise PolicyError(
                    f"{where}.draft_tokens",
                    "a chain (topk 1) verifies depth + 1 tokens; drop draft_tokens",
                )
        else:
            _check_tree(where, t.depth, t.topk, t.draft_tokens, trees, own=True)
        if not _is_int(t.hysteresis) or t.hysteresis < 0:
            raise PolicyError(
                f"{where}.hysteresis", f"must be an integer >= 0, got {t.hysteresis!r}"
            )
        if i == 0 and t.hysteresis != 0:
            raise PolicyError(f"{where}.hysteresis", "the first tier has no lower edge; use 0")
        if i > 0 and t.min_batch - t.hysteresis <= prev_min:
            raise PolicyError(
                f"{where}.hysteresis",
                f"band [{t.min_batch - t.hysteresis}, {t.min_batch}) overlaps the tier below, "
                f"which starts at {prev_min}; use hysteresis < {t.min_batch - prev_min}",
            )
        share = t.explore_share
        if (
            not isinstance(share, (int, float))
            or isinstance(share, bool)
            or not math.isfinite(share)
            or not 0.0 <= share <= MAX_EXPLORE_SHARE
        ):
            raise PolicyError(
                f"{where}.explore_share",
                f"must be a probability in [0, {MAX_EXPLORE_SHARE}], got {share!r}",
            )
        if share > 0 and not t.explore_depths and not t.explore_trees:
            raise PolicyError(
                f"{where}.explore_depths", "explore_share > 0 needs at least one explore depth"
            )
        for j, d in enumerate(t.explore_depths):
            _check_depth(f"{where}.explore_depths[{j}]", d, captured)
            if t.topk == 1 and d == t.depth:
                raise PolicyError(
                    f"{where}.explore_depths[{j}]",
                    f"depth {d} is the tier's own depth; list only alternatives",
                )
        if len(set(t.explore_depths)) != len(t.explore_depths):
            raise PolicyError(f"{where}.explore_depths", "depths must not repeat")
        _check_explore_trees(where, t, trees)
        prev_min = t.min_batch


def _check_explore_trees(where: str, t: Tier, captured: list[DraftShape] | None) -> None:
    if len(t.explore_trees) > MAX_EXPLORE_TREES:
        raise PolicyError(f"{where}.explore_trees", f"at most {MAX_EXPLORE_TREES} trees")
    for j, tree in enumerate(t.explore_trees):
        at = f"{where}.explore_trees[{j}]"
        if not isinstance(tree, DraftShape) or tree.topk == 1:
            raise PolicyError(
                at, "must be a tree STEPSxTOPKxDRAFT with topk > 1; list chains in explore_depths"
            )
        _check_tree(at, tree.steps, tree.topk, tree.draft_tokens, captured, own=False)
        if tree == t.shape:
            raise PolicyError(at, f"{tree.label} is the tier's own shape; list only alternatives")
    if len(set(t.explore_trees)) != len(t.explore_trees):
        raise PolicyError(f"{where}.explore_trees", "trees must not repeat")


def _check_tree(
    where: str, steps: Any, topk: int, draft: Any, captured: list[DraftShape] | None, own: bool
) -> None:
    """A tree tier's own shape (`own`: errors name its `depth` or `draft_tokens`) or a tree
    probe (errors name the probe)."""
    if not _is_int(steps) or not 1 <= steps <= MAX_DEPTH:
        raise PolicyError(
            f"{where}.depth" if own else where,
            f"a tree needs 1 to {MAX_DEPTH} steps, got {steps!r}",
        )
    if not _is_int(draft):
        raise PolicyError(
            f"{where}.draft_tokens" if own else where,
            f"a tree (topk {topk}) needs draft_tokens, got {draft!r}",
        )
    try:
        tree = parse_shape(f"{steps}x{topk}x{draft}")
    except ShapeError as err:
        raise PolicyError(f"{where}.draft_tokens" if own else where, str(err)) from None
    if captured is not None and tree not in captured:
        have = ", ".join(label(t) for t in captured) or "none"
        raise PolicyError(
            where,
            f"tree {label(tree)} was not captured by the server (captured trees: {have}); "
            "use a captured shape",
        )


def _check_depth(where: str, depth: Any, captured: list[int] | None) -> None:
    if not _is_int(depth) or not 0 <= depth <= MAX_DEPTH:
        raise PolicyError(where, f"must be an integer in [0, {MAX_DEPTH}], got {depth!r}")
    if captured is not None and depth not in captured:
        raise PolicyError(
            where,
            f"depth {depth} was not captured by the server (captured: {captured}); "
            "restart the server capturing it, or use a captured depth",
        )


def parse_table(
    data: Any,
    captured_depths: Iterable[int] | None = None,
    captured_trees: Iterable[DraftShape] = (),
) -> PolicyTable:
    """Build a table from its JSON/YAML form: {"version": n, "tiers": [{...}, ...]}. A tree
    tier adds `topk` and `draft_tokens`; tree probes are `explore_trees: ["3x4x16", ...]`."""
    if not isinstance(data, Mapping):
        raise PolicyError("table", f"must be a mapping with 'tiers', got {type(data).__name__}")
    unknown = set(data) - {"version", "tiers"}
    if unknown:
        raise PolicyError(sorted(unknown)[0], "unknown field; expected 'version' and 'tiers'")
    raw_tiers = data.get("tiers")
    if not isinstance(raw_tiers, list):
        raise PolicyError("tiers", "must be a list of tiers")
    tiers = []
    allowed = {"min_batch", "depth", "hysteresis", "explore_share", "explore_depths", "topk",
               "draft_tokens", "explore_trees"}  # fmt: skip
    for i, raw in enumerate(raw_tiers):
        if not isinstance(raw, Mapping):
            raise PolicyError(f"tiers[{i}]", "must be a mapping")
        extra = set(raw) - allowed
        if extra:
            raise PolicyError(
                f"tiers[{i}].{sorted(extra)[0]}",
                f"unknown field; allowed: {', '.join(sorted(allowed))}",
            )
        for required in ("min_batch", "depth"):
            if required not in raw:
                raise PolicyError(f"tiers[{i}].{required}", "is required")
        explore_depths = raw.get("explore_depths", [])
        if not isinstance(explore_depths, list):
            raise PolicyError(f"tiers[{i}].explore_depths", "must be a list of depths")
        topk, draft = raw.get("topk", 1), raw.get("draft_tokens")
        if topk == 1 and _is_int(raw["depth"]) and draft == raw["depth"] + 1:
            draft = None  # a chain written out in full
        tiers.append(
            Tier(
                min_batch=raw["min_batch"],
                depth=raw["depth"],
                hysteresis=raw.get("hysteresis", 0),
                explore_share=raw.get("explore_share", 0.0),
                explore_depths=tuple(explore_depths),
                topk=topk,
                draft_tokens=draft,
                explore_trees=_parse_trees(i, raw.get("explore_trees", [])),
            )
        )
    return PolicyTable.build(
        tiers,
        version=data.get("version", 0),
        captured_depths=captured_depths,
        captured_trees=captured_trees,
    )


def _parse_trees(tier: int, raw: Any) -> tuple[DraftShape, ...]:
    where = f"tiers[{tier}].explore_trees"
    if not isinstance(raw, list) or not all(isinstance(x, str) for x in raw):
        raise PolicyError(where, 'must be a list of shapes like ["3x4x16"]')
    out = []
    for j, text in enumerate(raw):
        try:
            tree = parse_shape(text)
        except ShapeError as err:
            raise PolicyError(f"{where}[{j}]", str(err)) from None
        if tree is None or tree.topk == 1:
            raise PolicyError(f"{where}[{j}]", f"{text} is no tree; list chains in explore_depths")
        out.append(tree)
    return tuple(out)


# ----------------------------------------------------------------------------- lookup


def plain_tier_index(bounds: Sequence[int], batch_size: int) -> int:
    """Index of the tier whose [min_batch, next min_batch) holds batch_size (no hysteresis)."""
    return max(bisect.bisect_right(bounds, batch_size) - 1, 0)


def lookup(table: PolicyTable, batch_size: int, current_tier: int | None) -> int:
    """The tier index for `batch_size`, given the tier the server is in now.

    Upward moves happen at min_batch; a downward move out of tier i needs the batch below
    min_batch_i - hysteresis_i. Deterministic: the same inputs always give the same tier.
    """
    tiers = table.tiers
    target = plain_tier_index(table._bounds, batch_size)
    if current_tier is None or current_tier >= len(tiers) or target >= current_tier:
        return target
    tier = current_tier
    while tier > target and batch_size < tiers[tier].min_batch - tiers[tier].hysteresis:
        tier -= 1
    return tier


class TierSelector:
    """Per-iteration depth choice: `lookup` with hysteresis state plus the exploration draw.

    One instance per scheduler (plugin) or simulated server. Not thread-safe: call it from the
    thread that runs iterations. `rng` makes exploration reproducible under a seed.
    """

    __slots__ = ("_rng", "table", "tier")

    def __init__(self, table: PolicyTable, rng: random.Random | None = None) -> None:
        self.table = table
        self.tier: int | None = None
        self._rng = rng or random.Random()

    def replace_table(self, table: PolicyTable) -> None:
        """Swap the table between iterations; hysteresis restarts from the plain reading."""
        self.table = table
        self.tier = None

    def select(self, batch_size: int) -> tuple[int, bool]:
        """Return (depth to run, whether this iteration is an exploration probe)."""
        self.tier = lookup(self.table, batch_size, self.tier)
        t = self.table.tiers[self.tier]
        if t.explore_share > 0.0 and self._rng.random() < t.explore_share:
            return t.explore_depths[int(self._rng.random() * len(t.explore_depths))], True
        return t.depth, False

    def select_shape(self, batch_size: int) -> tuple[Shape, bool]:
        """`select` for a server that runs trees: (shape to run, whether a probe). A chain-only
        table draws what `select` draws (its probes are the chains of its depths, in order)."""
        self.tier = lookup(self.table, batch_size, self.tier)
        t = self.table.tiers[self.tier]
        if t.explore_share > 0.0 and self._rng.random() < t.explore_share:
            probes = t.explore_shapes
            return probes[int(self._rng.random() * len(probes))], True
        return t.shape, False


# ----------------------------------------------------------------------------- admin RPC

RPC_PREFIX = "specctl_"
RPC_VERSION_KEY = "specctl_version"
RPC_TIER_COUNT_KEY = "specctl_tiers"  # 0 releases control back to SGLang's own choice
_TIER_FIELDS = ("min_batch", "depth", "hysteresis", "explore_share", "explore_mask")
# Sent only for trees, so a chain table's body is what it was before trees: a tree tier's
# `topk` and `draft`, and its tree probes as a count and `x{j}_steps/topk/draft`.
_TREE_FIELDS = ("topk", "draft")
_PROBE_COUNT = "explore_trees"
_PROBE_FIELDS = ("steps", "topk", "draft")
SERVER_INFO_KEY = "specctl"  # key inside /server_info internal_states[i]


def _tier_key(i: int, name: str) -> str:
    return f"{RPC_PREFIX}t{i}_{name}"


def encode_table(table: PolicyTable | None) -> dict[str, int | float]:
    """The numeric `server_args` dict that carries `table` (None: release control)."""
    if table is None:
        return {RPC_VERSION_KEY: 0, RPC_TIER_COUNT_KEY: 0}
    out: dict[str, int | float] = {
        RPC_VERSION_KEY: table.version,
        RPC_TIER_COUNT_KEY: len(table.tiers),
    }
    for i, t in enumerate(table.tiers):
        out[_tier_key(i, "min_batch")] = t.min_batch
        out[_tier_key(i, "depth")] = t.depth
        out[_tier_key(i, "hysteresis")] = t.hysteresis
        out[_tier_key(i, "explore_share")] = float(t.explore_share)
        out[_tier_key(i, "explore_mask")] = sum(1 << d for d in t.explore_depths)
        if t.topk != 1:
            out[_tier_key(i, "topk")] = t.topk
            out[_tier_key(i, "draft")] = t.draft_tokens or 0
        if t.explore_trees:
            out[_tier_key(i, _PROBE_COUNT)] = len(t.explore_trees)
        for j, tree in enumerate(t.explore_trees):
            out[_tier_key(i, f"x{j}_steps")] = tree.steps
            out[_tier_key(i, f"x{j}_topk")] = tree.topk
            out[_tier_key(i, f"x{j}_draft")] = tree.draft_tokens
    return out


def push_body(table: PolicyTable | None) -> dict[str, Any]:
    """The JSON body of `POST /set_internal_state` that pushes `table`."""
    return {"server_args": encode_table(table)}


def has_policy_keys(server_args: Mapping[str, Any]) -> bool:
    return any(isinstance(k, str) and k.startswith(RPC_PREFIX) for k in server_args)


def split_policy_keys(
    server_args: Mapping[str, Any],
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(specctl keys, every other key): the plugin hands the rest on to SGLang untouched."""
    ours = {k: v for k, v in server_args.items() if isinstance(k, str) and k.startswith(RPC_PREFIX)}
    rest = {k: v for k, v in server_args.items() if k not in ours}
    return ours, rest


def _rpc_number(keys: Mapping[str, Any], key: str, integer: bool) -> int | float:
    if key not in keys:
        raise PolicyError(key, "is required in server_args")
    value = keys[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PolicyError(key, f"must be a number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise PolicyError(key, f"must be finite, got {value}")
    if integer:
        if isinstance(value, float) and not value.is_integer():
            raise PolicyError(key, f"must be an integer, got {value}")
        return int(value)
    return float(value)


def decode_table(
    server_args: Mapping[str, Any],
    captured_depths: Iterable[int] | None = None,
    captured_trees: Iterable[DraftShape] = (),
) -> PolicyTable | None:
    """Inverse of `encode_table`; None means "release control". Raises PolicyError."""
    if not isinstance(server_args, Mapping):
        raise PolicyError("server_args", "must be a JSON object of numeric settings")
    ours, _ = split_policy_keys(server_args)
    version = int(_rpc_number(ours, RPC_VERSION_KEY, integer=True))
    count = int(_rpc_number(ours, RPC_TIER_COUNT_KEY, integer=True))
    if count == 0:
        extra = sorted(set(ours) - {RPC_VERSION_KEY, RPC_TIER_COUNT_KEY})
        if extra:
            raise PolicyError(extra[0], f"{RPC_TIER_COUNT_KEY} is 0 (release); drop tier keys")
        return None
    if not 0 < count <= MAX_TIERS:
        raise PolicyError(RPC_TIER_COUNT_KEY, f"must be in [0, {MAX_TIERS}], got {count}")
    probes = [_probe_count(ours, i) for i in range(count)]
    expected = {RPC_VERSION_KEY, RPC_TIER_COUNT_KEY} | {
        _tier_key(i, f) for i in range(count) for f in _TIER_FIELDS
    }
    for i in range(count):
        if any(_tier_key(i, f) in ours for f in _TREE_FIELDS):
            expected |= {_tier_key(i, f) for f in _TREE_FIELDS}
        if probes[i]:
            expected.add(_tier_key(i, _PROBE_COUNT))
        expected |= {_tier_key(i, f"x{j}_{f}") for j in range(probes[i]) for f in _PROBE_FIELDS}
    unknown = sorted(set(ours) - expected)
    if unknown:
        raise PolicyError(unknown[0], f"unknown key for a {count}-tier table")
    tiers = []
    for i in range(count):
        mask = int(_rpc_number(ours, _tier_key(i, "explore_mask"), integer=True))
        if mask < 0 or mask >= 1 << (MAX_DEPTH + 1):
            raise PolicyError(_tier_key(i, "explore_mask"), f"bitmask out of range: {mask}")
        tree = _tier_key(i, "topk") in ours or _tier_key(i, "draft") in ours
        trees = []
        for j in range(probes[i]):
            steps, topk, draft = (
                int(_rpc_number(ours, _tier_key(i, f"x{j}_{f}"), integer=True))
                for f in _PROBE_FIELDS
            )
            trees.append(DraftShape(steps, topk, draft))
        tiers.append(
            Tier(
                min_batch=int(_rpc_number(ours, _tier_key(i, "min_batch"), integer=True)),
                depth=int(_rpc_number(ours, _tier_key(i, "depth"), integer=True)),
                hysteresis=int(_rpc_number(ours, _tier_key(i, "hysteresis"), integer=True)),
                explore_share=float(_rpc_number(ours, _tier_key(i, "explore_share"), False)),
                explore_depths=tuple(d for d in range(MAX_DEPTH + 1) if mask >> d & 1),
                topk=int(_rpc_number(ours, _tier_key(i, "topk"), integer=True)) if tree else 1,
                draft_tokens=(
                    int(_rpc_number(ours, _tier_key(i, "draft"), integer=True)) if tree else None
                ),
                explore_trees=tuple(trees),
            )
        )
    try:
        return PolicyTable.build(
            tiers,
            version=version,
            captured_depths=captured_depths,
            captured_trees=captured_trees,
        )
    except PolicyError as err:
        # Name the wire key the sender actually set, not only the logical field.
        raise PolicyError(_wire_field(err.field), err.message) from None


def _probe_count(ours: Mapping[str, Any], tier: int) -> int:
    key = _tier_key(tier, _PROBE_COUNT)
    if key not in ours:
        return 0
    count = int(_rpc_number(ours, key, integer=True))
    if not 0 <= count <= MAX_EXPLORE_TREES:
        raise PolicyError(key, f"must be in [0, {MAX_EXPLORE_TREES}], got {count}")
    return count


def _wire_field(logical: str) -> str:
    # "tiers[2].explore_depths[0]" -> "specctl_t2_explore_mask",
    # "tiers[1].explore_trees[0]" -> "specctl_t1_x0_steps", "tiers[0].draft_tokens" -> "..._draft"
    if logical.startswith("tiers[") and "]." in logical:
        index, rest = logical[len("tiers[") :].split("].", 1)
        name = rest.split("[", 1)[0]
        if name == "explore_trees" and "[" in rest:
            return _tier_key(int(index), f"x{rest.split('[', 1)[1].split(']', 1)[0]}_steps")
        name = {"explore_depths": "explore_mask", "draft_tokens": "draft"}.get(name, name)
        return _tier_key(int(index), name)
    return {"version": RPC_VERSION_KEY, "tiers": RPC_TIER_COUNT_KEY}.get(logical, logical)


def rejection_body(err: PolicyError) -> dict[str, Any]:
    """The 400 body for a refused table, as SGLang's HTTPException handler shapes it.

    SGLang wraps `HTTPException.detail` into `ErrorResponse.message` (a string), so the
    machine-readable rejection travels as JSON inside `message`. The simulator answers the same.
    """
    return {
        "object": "error",
        "message": json.dumps(err.to_json()),
        "type": "400",
        "param": None,
        "code": 400,
    }


def parse_rejection(body: Any) -> PolicyError | None:
    """The PolicyError inside a 400 body from the plugin or the simulator, else None.

    Accepts SGLang's `ErrorResponse` with a JSON `message` (see `rejection_body`) and the bare
    `PolicyError.to_json()` form.
    """
    candidate: Any = body
    is_bare = isinstance(body, Mapping) and body.get("error") == "invalid_policy"
    if not is_bare and isinstance(body, Mapping) and isinstance(body.get("message"), str):
        try:
            candidate = json.loads(body["message"])
        except ValueError:
            return None
    if (
        isinstance(candidate, Mapping)
        and candidate.get("error") == "invalid_policy"
        and isinstance(candidate.get("field"), str)
    ):
        return PolicyError(candidate["field"], str(candidate.get("message", "")))
    return None


def server_state(
    table: PolicyTable | None,
    captured_depths: Iterable[int],
    *,
    source: str,
    last_rejection: str | None = None,
    applied_iteration: int | None = None,
    captured_trees: Iterable[DraftShape] = (),
) -> dict[str, Any]:
    """What a server reports under `/server_info` -> internal_states[i]["specctl"].

    `source` is one of "none" (SGLang's own adaptive choice), "startup" (frozen policy file),
    "push" (admin RPC). `last_rejection` is the reason the most recent push was refused.
    """
    trees = sorted(t.label for t in set(captured_trees))
    return {
        "contract_version": CONTRACT_VERSION,
        "source": source,
        "version": 0 if table is None else table.version,
        "table": None if table is None else table.to_json(),
        "captured_depths": sorted(set(captured_depths)),
        "last_rejection": last_rejection,
        "applied_iteration": applied_iteration,
        # Draft trees a table may name; absent on a server that captured none.
        **({"captured_trees": trees} if trees else {}),
    }


def state_trees(state: Mapping[str, Any]) -> tuple[DraftShape, ...]:
    """The draft trees a server's `server_state` reports it captured (none if it names none).
    Raises PolicyError on a name that is not a tree."""
    out = []
    for text in state.get("captured_trees") or ():
        try:
            tree = parse_shape(str(text))
        except ShapeError as err:
            raise PolicyError("captured_trees", str(err)) from None
        if tree is None or tree.topk == 1:
            raise PolicyError("captured_trees", f"{text} is not a tree")
        out.append(tree)
    return tuple(out)


def read_server_state(server_info: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The specctl state of each DP rank from a `/server_info` JSON document."""
    states = server_info.get("internal_states")
    if not isinstance(states, list):
        raise PolicyError("internal_states", "missing from /server_info; is this SGLang?")
    out = [s[SERVER_INFO_KEY] for s in states if isinstance(s, Mapping) and SERVER_INFO_KEY in s]
    if not out:
        raise PolicyError(
            f"internal_states[].{SERVER_INFO_KEY}",
            "missing: the specctl plugin is not loaded on this server "
            "(set SGLANG_PLUGINS=specctl, see docs/sglang.md)",
        )
    return out


# ----------------------------------------------------------------------------- metrics

# Counter families (exposed with the `_total` suffix, labels BASE_LABELS + depth, bs_bucket).
METRIC_ITERATIONS = "specctl_decode_iterations"
METRIC_REQUEST_STEPS = "specctl_decode_request_steps"  # sum of batch sizes over iterations
METRIC_TOKENS = "specctl_decode_tokens"  # tokens emitted by decode, bonus token included
METRIC_GPU_SECONDS = "specctl_decode_gpu_seconds"
METRIC_EXPLORE_ITERATIONS = "specctl_explore_iterations"  # subset of iterations: probes
COUNTER_FAMILIES = (
    METRIC_ITERATIONS,
    METRIC_REQUEST_STEPS,
    METRIC_TOKENS,
    METRIC_GPU_SECONDS,
    METRIC_EXPLORE_ITERATIONS,
)
# The same counts for draft trees, on a server that switches shapes (labels BASE_LABELS +
# shape, bs_bucket): a tree has no depth of its own, so its results are kept by shape label.
TREE_COUNTER_FAMILIES = tuple(f.replace("specctl_", "specctl_tree_", 1) for f in COUNTER_FAMILIES)
LABEL_SHAPE = "shape"
# Gauges (labels BASE_LABELS).
METRIC_POLICY_VERSION = "specctl_policy_version"
# Gauge, 1 per captured depth (labels BASE_LABELS + depth): what a table may use.
METRIC_CAPTURED_DEPTH = "specctl_captured_depth"

# SGLang's scheduler labels, kept so our series sit beside sglang:* series.
BASE_LABELS = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")
LABEL_DEPTH = "depth"
LABEL_BUCKET = "bs_bucket"

# SGLang's own series a server exposes (names as on /metrics).
SGLANG_GAUGES = (
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
    "sglang:gen_throughput",
    "sglang:token_usage",
    "sglang:spec_accept_length",
    "sglang:spec_accept_rate",
    "sglang:spec_num_steps",
)

# Lower edges of batch-size buckets: exact up to 8, then 4 buckets per doubling, so that the
# mean batch size inside a bucket (request_steps / iterations) stays within ~12% of any member.
BS_BUCKET_EDGES: tuple[int, ...] = (
    1, 2, 3, 4, 5, 6, 7, 8,
    10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64,
    80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512,
    640, 768, 896, 1024,
)  # fmt: skip


def bs_bucket(batch_size: int) -> int:
    """Lower edge of the bucket holding `batch_size` (>= 1)."""
    return BS_BUCKET_EDGES[max(bisect.bisect_right(BS_BUCKET_EDGES, batch_size) - 1, 0)]


def bucket_upper(lower: int) -> int:
    """Largest batch size inside the bucket that starts at `lower` (last bucket: open)."""
    i = BS_BUCKET_EDGES.index(lower)
    return BS_BUCKET_EDGES[i + 1] - 1 if i + 1 < len(BS_BUCKET_EDGES) else 10**9


# ----------------------------------------------------------------------------- off path
# What depth 0 ("off") runs on a server, reported beside `server_state`'s keys under
# OFF_PATH_KEY (`off_path_state`): the path (SPECCTL_OFF_PATH in the server's environment: the
# plugin's, or SGLang's own depth 0; null until the plugin steers) and the pieces of it that
# run, which the SGLang version decides (sglang_hooks/adapters/).

OFF_PATH_KEY = "off_path"
OFF_PATH_SPECCTL, OFF_PATH_SGLANG = "specctl", "sglang"
OFF_PATHS = (OFF_PATH_SPECCTL, OFF_PATH_SGLANG)


class OffPathFeature(StrEnum):
    """What the plugin runs at depth 0 ("off") in place of SGLang's own, one piece at a time.
    Each adapter declares the pieces measured on its SGLang (`Adapter.off_path`); the hooks of
    a piece it does not declare are not registered, and none is with SPECCTL_OFF_PATH=sglang
    (sglang_hooks/settings.py)."""

    # A table's depth-0 tier skips the draft extend through SGLang's own stub
    # (sglang_hooks/hooks.py, `skip_extend`); a depth-0 tier that probes positive depths keeps it.
    SKIP_EXTEND = "skip-extend"
    # Requests admitted into such a tier skip the draft's prefill (sglang_hooks/draft_prefill.py).
    SKIP_DRAFT_PREFILL = "skip-draft-prefill"
    # Depth 0 on the target's own DECODE graphs (sglang_hooks/plain_decode.py), its WAR fence at
    # the graph's replay (sglang_hooks/fence.py).
    PLAIN_DECODE = "plain-decode"
    # The speculative iteration's host-work trims (sglang_hooks/lean_host.py).
    HOST_TRIMS = "host-trims"


def off_path_state(path: str | None, features: Iterable[str]) -> dict[str, Any]:
    """The report of what depth 0 runs: `{"path": ..., "features": [sorted names]}`."""
    return {"path": path, "features": sorted(str(f) for f in features)}
