"""Scrape: counters from a server's /metrics text -> per-(depth, bucket) `Sample`s.

Counters are keyed per series `family|depth|bs_bucket|dp_rank` (TP rank 0 and PP rank 0 only:
every TP/PP rank of a DP rank counts the same iterations). Deltas between two snapshots are
summed over DP ranks into one `Sample` per (depth, bucket). With `trees=True` a shape server's
draft trees (`specctl_tree_*{shape=...}`) are read too, keyed under the chain family's name
with the tree's label in place of the depth (`specctl_decode_iterations|3x4x16|8|`), so cells,
resets and checks are the same code.

Counter resets. A server restart zeroes every counter at once, so if any series went down
since the previous snapshot the whole server is taken to have restarted and each series'
current value is its delta since the restart (the rule Prometheus' `increase()` applies per
series). A series seen for the first time starts at zero, so its value is its delta. A restart
after which every counter has already grown past its old value is not detectable from counters
alone; the interval it spans is then under-counted, never over-counted.

Garbage. A page that does not parse is rejected whole (the snapshot is not advanced, nothing is
stored). Single series that are NaN, infinite, negative or carry unreadable labels are dropped
and counted, and so is the rest of their (depth, bucket, DP rank) cell: a cell advances only
when all its counters are readable, so the next good scrape yields one consistent delta. A
(depth, bucket) whose deltas are mutually impossible (mean batch outside its bucket, fewer
tokens than request steps, ...) is dropped and counted, not stored.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

from models.samples import Sample
from sglang_hooks.contract import (
    BS_BUCKET_EDGES,
    COUNTER_FAMILIES,
    LABEL_BUCKET,
    LABEL_DEPTH,
    LABEL_SHAPE,
    MAX_DEPTH,
    METRIC_EXPLORE_ITERATIONS,
    METRIC_GPU_SECONDS,
    METRIC_ITERATIONS,
    METRIC_REQUEST_STEPS,
    METRIC_TOKENS,
    TREE_COUNTER_FAMILIES,
    bucket_upper,
)
from sglang_hooks.draft_shape import DraftShape, ShapeError, parse_shape

_FAMILIES = frozenset(COUNTER_FAMILIES)
_CHAIN_FAMILY_OF_TREE = dict(zip(TREE_COUNTER_FAMILIES, COUNTER_FAMILIES, strict=True))
_BUCKETS = frozenset(BS_BUCKET_EDGES)
REL_TOL = 1e-6


class ScrapeError(RuntimeError):
    """A scrape that yields nothing storable. `kind` labels the daemon's error counter."""

    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind  # "unreachable" | "timeout" | "http_status" | "parse" | "no_series" ...
        super().__init__(message)


def series_key(family: str, arm: int | str, bucket: int, dp_rank: str) -> str:
    """`arm`: a chain depth, or a tree's label."""
    return f"{family}|{arm}|{bucket}|{dp_rank}"


def split_arm_key(key: str) -> tuple[str, str, int, str]:
    """(family, depth or tree label as written, bucket, DP rank) of any series key."""
    family, arm, bucket, dp = key.split("|")
    return family, arm, int(bucket), dp


def split_key(key: str) -> tuple[str, int, int, str]:
    """A chain series' key with its depth (a tree's key: `split_arm_key`)."""
    family, arm, bucket, dp = split_arm_key(key)
    return family, int(arm), bucket, dp


def tree_of(label: str | None) -> DraftShape | None:
    """The tree a `shape` label names, or None if it names none a server can count."""
    try:
        shape = parse_shape(label or "")
    except ShapeError:
        return None
    if not isinstance(shape, DraftShape) or shape.is_chain or not 1 <= shape.steps <= MAX_DEPTH:
        return None
    return shape


@dataclass
class CounterSnapshot:
    """Counter values of one scrape, keyed by `series_key`."""

    values: dict[str, float] = field(default_factory=dict)
    dropped_series: int = 0  # NaN / negative / unreadable labels / incomplete cells


def _family_of(sample_name: str, trees: bool) -> tuple[str, bool] | None:
    """(the chain family a counter sample belongs to, whether it counts a tree), or None."""
    if sample_name.endswith("_created"):
        return None
    base = sample_name.removesuffix("_total")
    if base in _FAMILIES:
        return base, False
    chain = _CHAIN_FAMILY_OF_TREE.get(base) if trees else None
    return None if chain is None else (chain, True)


def _parse_int(raw: str | None) -> int | None:
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        return None


def first_rank(labels: Mapping[str, str]) -> bool:
    """A series of TP rank 0 and PP rank 0 (or without those labels): every TP rank counts the
    same iterations, and only one pipeline stage is read."""
    return labels.get("tp_rank", "0") == "0" and labels.get("pp_rank", "0") == "0"


def parse_counters(text: str, *, trees: bool = False) -> CounterSnapshot:
    """The specctl counters of one /metrics page, with `trees` a shape server's tree counters
    too (see the module's docstring). Raises ScrapeError('parse') on bad text."""
    snap = CounterSnapshot()
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as err:  # the parser raises ValueError, IndexError, ... on bad lines
        raise ScrapeError("parse", f"/metrics text does not parse: {err!r}"[:300]) from None
    for fam in families:
        for s in fam.samples:
            found = _family_of(s.name, trees)
            if found is None:
                continue
            family, tree = found
            labels = s.labels
            if not first_rank(labels):
                continue
            arm: int | str | None
            if tree:
                shape = tree_of(labels.get(LABEL_SHAPE))
                arm = None if shape is None else shape.label
            else:
                arm = _parse_int(labels.get(LABEL_DEPTH))
                arm = arm if arm is not None and 0 <= arm <= MAX_DEPTH else None
            bucket = _parse_int(labels.get(LABEL_BUCKET))
            value = s.value
            if (
                arm is None
                or bucket not in _BUCKETS
                or not isinstance(value, (int, float))
                or not math.isfinite(value)
                or value < 0
            ):
                snap.dropped_series += 1
                continue
            assert bucket is not None
            key = series_key(family, arm, bucket, labels.get("dp_rank", ""))
            snap.values[key] = snap.values.get(key, 0.0) + float(value)
    _keep_complete_cells(snap)
    return snap


_REQUIRED = (METRIC_ITERATIONS, METRIC_REQUEST_STEPS, METRIC_TOKENS, METRIC_GPU_SECONDS)


def _keep_complete_cells(snap: CounterSnapshot) -> None:
    """Drop every (depth, bucket, DP rank) cell that lacks one of the required counters.

    A cell whose tokens series is NaN (or missing) this scrape must not advance its other
    counters either: the next good scrape then yields one consistent delta for the cell.
    """
    present: dict[tuple[str, int, str], set[str]] = defaultdict(set)
    for key in snap.values:
        family, arm, bucket, dp = split_arm_key(key)
        present[(arm, bucket, dp)].add(family)
    incomplete = {cell for cell, fams in present.items() if not all(f in fams for f in _REQUIRED)}
    if not incomplete:
        return
    for key in list(snap.values):
        _family, arm, bucket, dp = split_arm_key(key)
        if (arm, bucket, dp) in incomplete:
            del snap.values[key]
    snap.dropped_series += len(incomplete)


@dataclass
class DeltaResult:
    deltas: dict[str, float]
    merged: dict[str, float]  # the snapshot to keep for the next scrape
    restarted: bool


def counter_deltas(
    previous: Mapping[str, float] | None, current: Mapping[str, float]
) -> DeltaResult:
    """Deltas of `current` over `previous`; None previous: a baseline only (no deltas)."""
    if previous is None:
        return DeltaResult({}, dict(current), False)
    restarted = any(v < previous[k] * (1 - REL_TOL) for k, v in current.items() if k in previous)
    deltas: dict[str, float] = {}
    for key, value in current.items():
        old = previous.get(key)
        deltas[key] = value if restarted or old is None else max(value - old, 0.0)
    if restarted:
        # Series not reported since the restart start again from zero.
        merged = dict(current)
    else:
        merged = dict(previous)
        merged.update(current)
    return DeltaResult(deltas, merged, restarted)


@dataclass
class SampleBuild:
    samples: list[Sample]
    inconsistent: int  # (depth, bucket) groups dropped as impossible


def build_samples(
    deltas: Mapping[str, float],
    *,
    group: str,
    target: str,
    t_end: float,
    interval_s: float,
) -> SampleBuild:
    """Sum deltas over DP ranks into one checked `Sample` per (depth or tree, bucket) that
    ran; a tree's sample carries its label and its steps as the depth."""
    sums: dict[tuple[int, str, int], dict[str, float]] = defaultdict(dict)
    for key, delta in deltas.items():
        family, arm, bucket, _dp = split_arm_key(key)
        shape = None if arm.isdigit() else tree_of(arm)
        if shape is None and not arm.isdigit():
            continue  # a stored snapshot's key no release of specctl writes
        depth, tree = (int(arm), "") if shape is None else (shape.steps, shape.label)
        cell = sums[(depth, tree, bucket)]
        cell[family] = cell.get(family, 0.0) + delta
    out: list[Sample] = []
    inconsistent = 0
    for (depth, tree, bucket), cell in sorted(sums.items(), key=lambda kv: (kv[0][1], kv[0])):
        iterations = cell.get(METRIC_ITERATIONS, 0.0)
        if iterations <= 0:
            continue  # nothing ran at this (depth or tree, bucket) in the interval
        sample = Sample(
            group=group,
            target=target,
            t_end=t_end,
            interval_s=interval_s,
            depth=depth,
            bs_bucket=bucket,
            iterations=iterations,
            request_steps=cell.get(METRIC_REQUEST_STEPS, 0.0),
            tokens=cell.get(METRIC_TOKENS, 0.0),
            gpu_seconds=cell.get(METRIC_GPU_SECONDS, 0.0),
            explore_iterations=cell.get(METRIC_EXPLORE_ITERATIONS, 0.0),
            tree=tree,
        )
        if why_inconsistent(sample) is None:
            out.append(sample)
        else:
            inconsistent += 1
    return SampleBuild(out, inconsistent)


def why_inconsistent(s: Sample) -> str | None:
    """A sentence saying why a sample cannot be real, or None if it is plausible."""
    lo, hi = 1 - REL_TOL, 1 + REL_TOL
    if s.gpu_seconds <= 0:
        return "iterations ran but gpu_seconds did not grow"
    mean_batch = s.request_steps / s.iterations
    if not s.bs_bucket * lo <= mean_batch <= bucket_upper(s.bs_bucket) * hi:
        return f"mean batch {mean_batch:.2f} lies outside bucket {s.bs_bucket}"
    # A tree of d steps, like a chain of depth d, accepts a path of at most d drafts.
    if not s.request_steps * lo <= s.tokens <= s.request_steps * (s.depth + 1) * hi:
        at = f"tree {s.tree}" if s.tree else f"depth {s.depth}"
        return f"tokens {s.tokens} impossible for {s.request_steps} request steps at {at}"
    if s.explore_iterations > s.iterations * hi:
        return "more exploration iterations than iterations"
    return None
