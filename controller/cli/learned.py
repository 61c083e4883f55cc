"""What the model has learned from a store, and what it rests on (`specctl curves`, `freeze`).

Reads the daemon's SQLite store, refits a Learner on one group's samples (or loads the group's
latest learner snapshot with `--snapshot`) and shows, per depth, the predicted decode tok/s
against batch size with its 90% band, the measured points (samples pooled per batch-size
bucket, with how many decode iterations each rests on), the crossovers, and the live table
(the last push the daemon judged good) next to the table the model proposes now. A shape
server's draft trees are measured, not learned: their points sit beside the depths' curves.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.table import Table

from controller.daemon.store import Store, StoreError, samples_only
from models.learner import CurvePoint, Learner, Proposal
from models.samples import Sample, chain_samples
from models.shape_learner import SHAPE_MODEL_VERSION
from sglang_hooks.contract import BS_BUCKET_EDGES, PolicyError, PolicyTable, bs_bucket, parse_table


class CurvesError(RuntimeError):
    """The store cannot answer the question asked; the message says what to do instead."""


@dataclass(frozen=True)
class MeasuredPoint:
    """Samples of one (depth or tree, bucket), pooled: exact ratios of summed counter deltas."""

    depth: int
    bs_bucket: int
    mean_batch: float
    tok_per_s: float
    accept_length: float
    step_ms: float
    iterations: float
    samples: int
    tree: str = ""  # a draft tree's label (its steps are `depth`); empty for a chain or off


@dataclass
class GroupModel:
    store: Path
    group: str
    targets: list[str]
    samples: list[Sample]  # chain depths and off: what the learner fits
    trees: list[Sample]  # a shape server's draft trees: measured only
    learner: Learner
    now: float
    source: str  # how the learner was obtained
    live_table: PolicyTable | None
    live_target: str | None

    @property
    def window(self) -> tuple[float, float]:
        every = self.samples + self.trees
        return min(s.t_end - s.interval_s for s in every), max(s.t_end for s in every)

    def batch_histogram(self) -> dict[int, float]:
        """Share of decode iterations per bucket (what the load looked like)."""
        per: dict[int, float] = {}
        for s in self.samples:
            per[s.bs_bucket] = per.get(s.bs_bucket, 0.0) + s.iterations
        total = sum(per.values()) or 1.0
        return {b: n / total for b, n in sorted(per.items())}

    def bucket_batches(self) -> dict[int, float]:
        """Mean batch size inside each bucket, over every depth."""
        it: dict[int, float] = {}
        rs: dict[int, float] = {}
        for s in self.samples:
            it[s.bs_bucket] = it.get(s.bs_bucket, 0.0) + s.iterations
            rs[s.bs_bucket] = rs.get(s.bs_bucket, 0.0) + s.request_steps
        return {b: rs[b] / it[b] for b in sorted(it) if it[b] > 0}

    def propose(self) -> Proposal:
        return self.learner.propose(self.now, self.live_table, self.batch_histogram())


def measured_points(samples: Sequence[Sample]) -> list[MeasuredPoint]:
    """One point per (depth or tree, bucket) that ran, chains first."""
    acc: dict[tuple[str, int, int], list[float]] = {}
    for s in samples:
        row = acc.setdefault((s.tree, s.depth, s.bs_bucket), [0.0, 0.0, 0.0, 0.0, 0.0])
        row[0] += s.iterations
        row[1] += s.request_steps
        row[2] += s.tokens
        row[3] += s.gpu_seconds
        row[4] += 1
    out = []
    for (tree, d, b), (it, rs, tok, gpu, n) in sorted(acc.items()):
        if it <= 0 or rs <= 0 or gpu <= 0:
            continue
        out.append(
            MeasuredPoint(d, b, rs / it, tok / gpu, tok / rs, 1000 * gpu / it, it, int(n), tree)
        )
    return out


def open_store(path: Path) -> Store:
    if not path.is_file():
        raise CurvesError(
            f"store not found: {path}; run `specctl daemon` (or `specctl demo`) to fill one, "
            "or pass --store PATH (the store.path of controller.yaml)"
        )  # checked here too for callers that did not go through stores.find_store
    try:
        return Store(path)
    except (StoreError, Exception) as err:
        raise CurvesError(f"cannot open store {path}: {err}") from None


def load_group_model(
    store_path: Path,
    group: str | None = None,
    target: str | None = None,
    use_snapshot: bool = False,
    seed: int = 0,
) -> GroupModel:
    """One group's samples and a learner fitted on them (or restored from its snapshot)."""
    store = open_store(store_path)
    try:
        everything = samples_only(store.samples())
        if not everything:
            raise CurvesError(f"{store_path} holds no samples yet; let the daemon scrape first")
        groups = sorted({s.group for s in everything})
        if target is not None:
            owning = sorted({s.group for s in everything if s.target == target})
            if not owning:
                known = sorted({s.target for s in everything})
                raise CurvesError(f"--target {target!r}: no samples; targets in the store: {known}")
            group = group or owning[0]
        if group is None:
            if len(groups) > 1:
                raise CurvesError(f"the store holds several groups {groups}; pass --group NAME")
            group = groups[0]
        mine = [
            s for s in everything if s.group == group and (target is None or s.target == target)
        ]
        if not mine:
            raise CurvesError(f"--group {group!r}: no samples; groups in the store: {groups}")
        samples = chain_samples(mine)
        trees = [s for s in mine if s.tree]
        if not samples:
            ran = ", ".join(sorted({s.tree for s in trees}))
            raise CurvesError(
                f"--group {group!r}: only draft trees ran ({ran}); the curves are learned from "
                "chain depths and off: let the server's table run one, or read the trees' "
                "tok/s per load with `specctl status --url URL` or `specctl bench --shapes`"
            )
        targets = sorted({s.target for s in samples})
        now = max(s.t_end for s in samples)
        learner, source = _learner(store, group, samples, now, use_snapshot, seed)
        live_table, live_target = _live_table(store, targets)
    finally:
        store.close()
    return GroupModel(
        store_path, group, targets, samples, trees, learner, now, source, live_table, live_target
    )


def _learner(
    store: Store, group: str, samples: list[Sample], now: float, use_snapshot: bool, seed: int
) -> tuple[Learner, str]:
    if use_snapshot:
        snap = store.latest_learner_snapshot(group)
        if snap is None:
            raise CurvesError(f"no learner snapshot for group {group!r}; drop --snapshot to refit")
        t, version, state = snap
        if version == SHAPE_MODEL_VERSION:
            raise CurvesError(f"the snapshot of {group!r} is a shape server's learner (measured "
                              "tok/s per shape and bucket, no curves); drop --snapshot to see "
                              "its measured points beside the depths' refit")
        try:
            return Learner.from_json(state), f"snapshot saved at t={t:.0f} ({version})"
        except (ValueError, KeyError, TypeError) as err:
            raise CurvesError(f"learner snapshot of {group!r} unusable: {err}") from None
    depths = sorted({s.depth for s in samples})
    snap = store.latest_learner_snapshot(group)
    if snap is not None and isinstance(snap[2], dict) and snap[2].get("captured_depths"):
        depths = sorted(set(depths) | {int(d) for d in snap[2]["captured_depths"]})
    learner = Learner(depths, seed=seed)
    learner.fit(samples, now)
    return learner, f"refit on {len(samples)} samples"


def _live_table(store: Store, targets: list[str]) -> tuple[PolicyTable | None, str | None]:
    best: tuple[float, PolicyTable, str] | None = None
    for t in targets:
        for push in store.pushes(t):
            if push.outcome != "good" or push.table is None:
                continue
            try:
                table = parse_table(push.table)
            except PolicyError:
                continue
            if best is None or push.t > best[0]:
                best = (push.t, table, t)
    return (None, None) if best is None else (best[1], best[2])


# ----------------------------------------------------------------------------- views


def batch_grid(model: GroupModel) -> list[int]:
    """Bucket edges up to twice the largest batch seen (where the table must still answer)."""
    every = model.samples + model.trees
    top = max(s.mean_batch for s in every)
    measured = {s.bs_bucket for s in every}
    powers = {b for b in BS_BUCKET_EDGES if b & (b - 1) == 0 and b <= max(2 * top, 8)}
    return sorted(measured | powers)


def _fmt_n(n: float) -> str:
    for unit, div in (("M", 1e6), ("k", 1e3)):
        if n >= div:
            return f"{n / div:.1f}{unit}"
    return f"{n:.0f}"


def curves_json(model: GroupModel, proposal: Proposal) -> dict[str, Any]:
    grid = batch_grid(model)
    curves = model.learner.curves(np.asarray(grid, float))
    start, end = model.window
    return {
        "store": str(model.store),
        "group": model.group,
        "targets": model.targets,
        "learner": model.source,
        "model_version": model.learner.version,
        "window": {"start": start, "end": end},
        "samples": len(model.samples),
        "curves": {
            str(d): [_clean(asdict(p)) for p in points] for d, points in sorted(curves.items())
        },
        "measured": [asdict(m) for m in measured_points(model.samples + model.trees)],
        "crossovers": [
            {"from_depth": a, "to_depth": b, "batch": round(x, 2)}
            for a, b, x in proposal.crossovers
        ],
        "live_table": None if model.live_table is None else model.live_table.to_json(),
        "live_table_text": None if model.live_table is None else model.live_table.describe(),
        "proposed_table": proposal.table.to_json(),
        "proposed_table_text": proposal.table.describe(),
        "proposal_reason": proposal.reason,
    }


def _clean(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


def curves_table(model: GroupModel, proposal: Proposal) -> Table:
    grid = batch_grid(model)
    curves = model.learner.curves(np.asarray(grid, float))
    measured = {(m.depth, m.bs_bucket): m for m in measured_points(model.samples)}
    trees = _tree_points(model)
    depths = sorted(curves)
    t = Table(
        title="decode tok/s by batch size: predicted ±half its 90% band / measured (iterations)",
        box=None,
        title_justify="left",
    )
    t.add_column("batch", justify="right", no_wrap=True)
    for d in depths:
        t.add_column("off" if d == 0 else f"d{d}", justify="right", no_wrap=True)
    for tree in trees:
        t.add_column(f"{tree}\n(measured)", justify="right", no_wrap=True)
    t.add_column("best", justify="center")
    t.add_column("live", justify="center")
    for i, b in enumerate(grid):
        row = [str(b)]
        preds = {d: curves[d][i] for d in depths}
        finite = {d: p.tok_per_s for d, p in preds.items() if math.isfinite(p.tok_per_s)}
        best = max(finite, key=lambda d: finite[d]) if finite else None
        for d in depths:
            row.append(_cell(preds[d], measured.get((d, bs_bucket(b))), d == best))
        for points in trees.values():
            m = points.get(bs_bucket(b))
            row.append("[dim]-[/dim]" if m is None else _measured(m))
        row.append("-" if best is None else ("off" if best == 0 else f"d{best}"))
        live = model.live_table.depth_for(b) if model.live_table else None
        row.append("-" if live is None else ("off" if live == 0 else f"d{live}"))
        t.add_row(*row)
    return t


def _cell(p: CurvePoint, m: MeasuredPoint | None, best: bool) -> str:
    if not math.isfinite(p.tok_per_s):
        pred = "no model"
    else:
        pred = f"{p.tok_per_s:,.0f} ±{(p.hi - p.lo) / 2:,.0f}"
        pred = f"[bold]{pred}[/bold]" if best else pred
    meas = "[dim]-[/dim]" if m is None else _measured(m)
    return f"{pred}\n{meas}"


def _measured(m: MeasuredPoint) -> str:
    return f"[cyan]{m.tok_per_s:,.0f}[/cyan] ({_fmt_n(m.iterations)} it)"


def _tree_points(model: GroupModel) -> dict[str, dict[int, MeasuredPoint]]:
    """Each tree's measured points by bucket, trees in label order."""
    out: dict[str, dict[int, MeasuredPoint]] = {}
    for m in measured_points(model.trees):
        out.setdefault(m.tree, {})[m.bs_bucket] = m
    return dict(sorted(out.items()))


# Artist ids in the figure (`curves_figure`), for readers of the figure and its tests.
GID_MEASURED_RANGE = "predicted (sampled batches)"
GID_EXTRAPOLATED = "predicted (extrapolated)"
GID_CROSSOVER = "proposed crossover"
GID_LIVE_TIER = "live tier"
GID_TREE = "tree measured"


def sampled_range(model: GroupModel) -> tuple[float, float]:
    """The batch sizes the samples cover (their mean batches, every depth): the model is
    measured there and extrapolates outside."""
    batches = [s.mean_batch for s in model.samples]
    return min(batches), max(batches)


def _inside(xs: np.ndarray, lo: float, hi: float) -> np.ndarray:
    return (xs >= lo - 1e-9) & (xs <= hi + 1e-9)


def _extrapolated(grid: np.ndarray, inside: np.ndarray) -> list[slice]:
    """The grid's stretches below and above the sampled batches, each from the sampled edge
    on (so a dashed extrapolation joins its solid line)."""
    where = np.flatnonzero(inside)
    if not where.size:
        return [slice(0, len(grid))]
    first, last = int(where[0]), int(where[-1])
    parts = []
    if first > 0:
        parts.append(slice(0, first + 1))
    if last < len(grid) - 1:
        parts.append(slice(last, len(grid)))
    return parts


def curves_figure(model: GroupModel, proposal: Proposal) -> Any:
    """The figure of `specctl curves --plot` (a matplotlib Figure).

    Top: each depth's predicted decode tok/s relative to depth 0 (1.0: as fast as not
    drafting), solid over the sampled batches with its 90% band, dashed and greyed where the
    model extrapolates; measured points (pooled per bucket, sized by iterations) over depth 0's
    prediction at their batch, a shape server's trees as diamonds (measured, not modelled);
    the proposed table's crossovers as labelled vertical lines, only inside the sampled
    batches (one beyond them is named in the title, not drawn). Under it: the live table as a
    strip of tiers. Bottom: the same curves in absolute tok/s."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    top = max(batch_grid(model))
    right = top * 1.2
    lo_b, hi_b = sampled_range(model)
    grid = np.unique(np.concatenate([np.round(np.geomspace(1, right, 160)), [lo_b, hi_b]]))
    grid = grid[(grid >= 1) & (grid <= right)]
    curves = model.learner.curves(grid)
    measured = measured_points(model.samples)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    color = {d: colors[i % len(colors)] for i, d in enumerate(sorted(curves))}
    base_depth = 0 if 0 in curves else min(curves)
    base = np.asarray([p.tok_per_s for p in curves[base_depth]])
    fig, (ax, strip, ax_abs) = plt.subplots(
        3, 1, figsize=(10, 8.2), sharex=True,
        gridspec_kw={"height_ratios": [3.2, 0.32, 1.7], "hspace": 0.08},
    )  # fmt: skip
    inside = _inside(grid, lo_b, hi_b)
    for axis in (ax, ax_abs):
        if right > hi_b:
            axis.axvspan(hi_b, right, facecolor="none", edgecolor="0.75", hatch="//", lw=0,
                         zorder=0)  # fmt: skip
        if lo_b > 1:
            axis.axvspan(1, lo_b, facecolor="none", edgecolor="0.75", hatch="//", lw=0, zorder=0)
    max_it = max((m.iterations for m in measured), default=1.0)
    for d, points in sorted(curves.items()):
        name = "off (depth 0)" if d == 0 else f"depth {d}"
        ys = np.asarray([p.tok_per_s for p in points])
        los = np.asarray([p.lo for p in points])
        his = np.asarray([p.hi for p in points])
        for axis, scale in ((ax, base), (ax_abs, np.ones_like(base))):
            rel = ys / scale
            axis.plot(grid[inside], rel[inside], color=color[d], lw=1.8, gid=GID_MEASURED_RANGE,
                      label=f"{name}: predicted" if axis is ax else None)  # fmt: skip
            for part in _extrapolated(grid, inside):
                axis.plot(grid[part], rel[part], color=color[d], lw=1.2, ls="--", alpha=0.6,
                          gid=GID_EXTRAPOLATED)  # fmt: skip
            axis.fill_between(grid[inside], (los / scale)[inside], (his / scale)[inside],
                              color=color[d], alpha=0.18, lw=0)  # fmt: skip
        mine = [m for m in measured if m.depth == d]
        if mine:
            xs = np.asarray([m.mean_batch for m in mine])
            at = np.interp(np.log(xs), np.log(grid), base)
            sizes = [12 + 150 * math.sqrt(m.iterations / max_it) for m in mine]
            for axis, scale in ((ax, at), (ax_abs, np.ones_like(at))):
                label = f"{name}: measured" if axis is ax else None
                axis.scatter(xs, np.asarray([m.tok_per_s for m in mine]) / scale, s=sizes,
                             color=color[d], edgecolor="black", linewidth=0.5, alpha=0.85,
                             zorder=3, label=label)  # fmt: skip
    for i, (tree, by_bucket) in enumerate(_tree_points(model).items()):
        mine = list(by_bucket.values())
        xs = np.asarray([m.mean_batch for m in mine])
        at = np.interp(np.log(xs), np.log(grid), base)
        sizes = [12 + 150 * math.sqrt(m.iterations / max_it) for m in mine]
        tone = colors[(len(curves) + i) % len(colors)]
        for axis, scale in ((ax, at), (ax_abs, np.ones_like(at))):
            label = f"tree {tree}: measured" if axis is ax else None
            axis.scatter(xs, np.asarray([m.tok_per_s for m in mine]) / scale, s=sizes,
                         marker="D", color=tone, edgecolor="black", linewidth=0.5, alpha=0.85,
                         zorder=3, label=label, gid=GID_TREE)  # fmt: skip
    ax.axhline(1.0, color="black", lw=1.0, zorder=1)
    beyond = []
    for a, b, x in proposal.crossovers:
        if not lo_b <= x <= hi_b:
            beyond.append(f"d{a}→d{b} @ {x:.1f}")
            continue
        for axis in (ax, ax_abs):
            axis.axvline(x, color="black", ls=":", lw=1.2, gid=GID_CROSSOVER)
        ax.text(x, 0.98, f" proposed d{a}→d{b} @ {x:.1f}", transform=ax.get_xaxis_transform(),
                rotation=90, fontsize=8, va="top", ha="right")  # fmt: skip
    _live_strip(strip, model, color, right)
    ax.set_xscale("log", base=2)
    ticks = [b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024) if b <= right]
    ax_abs.set_xticks(ticks, [str(t) for t in ticks])
    ax_abs.minorticks_off()
    ax.set_xlim(1, right)
    ax.set_ylabel(f"tok/s ÷ {'depth 0' if base_depth == 0 else f'depth {base_depth}'}")
    ax_abs.set_ylabel("decode tok/s")
    ax_abs.set_ylim(bottom=0)
    ax_abs.set_xlabel("batch size (running requests in a decode iteration)")
    for axis in (ax, ax_abs):
        axis.grid(True, alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    handles += [
        plt.Line2D([], [], color="0.4", ls="--", lw=1.2),
        Patch(facecolor="none", edgecolor="0.6", hatch="//"),
        plt.Line2D([], [], color="black", ls=":", lw=1.2),
    ]
    labels += [
        "predicted, extrapolated (no samples)",
        f"no samples (outside batch {lo_b:.3g}-{hi_b:.3g})",
        "proposed crossover (model, now)",
    ]
    ax.legend(handles, labels, fontsize=7.5, loc="upper right", ncol=2, framealpha=0.9)
    start, end = model.window
    live = (
        "none pushed yet"
        if model.live_table is None
        else f"{model.live_table.describe()} ({model.live_target})"
    )
    title = (
        f"{model.group}: {len(model.samples)} samples over {end - start:,.0f} s, {model.source}; "
        f"sampled batches {lo_b:.3g}-{hi_b:.3g}\nlive table (strip): {live}; "
        f"proposed (dotted lines): {proposal.table.describe()}"
    )
    if beyond:
        title += f"   (beyond the samples, not drawn: {', '.join(beyond)})"
    ax.set_title(title, fontsize=9.5)
    fig.subplots_adjust(left=0.09, right=0.98, top=0.92, bottom=0.07)
    return fig


def _live_strip(strip: Any, model: GroupModel, color: dict[int, str], right: float) -> None:
    """The live table's tiers as coloured spans along the batch axis."""
    strip.set_yticks([])
    strip.set_ylim(0, 1)
    strip.set_ylabel("live\ntable", rotation=0, ha="right", va="center", fontsize=8)
    if model.live_table is None:
        strip.text(0.5, 0.5, "no live table (nothing pushed yet)", transform=strip.transAxes,
                   ha="center", va="center", fontsize=8, color="0.4")  # fmt: skip
        return
    for lo, hi, depth in _spans(model.live_table, right):
        strip.axvspan(lo, hi, color=color.get(depth, "grey"), alpha=0.35, lw=0,
                      gid=GID_LIVE_TIER)  # fmt: skip
        strip.text(math.sqrt(lo * min(hi, right)), 0.5, "off" if depth == 0 else f"d{depth}",
                   ha="center", va="center", fontsize=8)  # fmt: skip


def plot_curves(model: GroupModel, proposal: Proposal, path: Path) -> None:
    """Write `curves_figure` to `path` (PNG, SVG or PDF)."""
    import matplotlib.pyplot as plt

    fig = curves_figure(model, proposal)
    try:
        fig.savefig(path, dpi=130)
    finally:
        plt.close(fig)


def _spans(table: PolicyTable, right: float) -> list[tuple[float, float, int]]:
    """(from, to, depth) per run of tiers with the same depth (exploration splits ignored)."""
    out: list[tuple[float, float, int]] = []
    for i, tier in enumerate(table.tiers):
        hi = table.tiers[i + 1].min_batch if i + 1 < len(table.tiers) else right
        if out and out[-1][2] == tier.depth:
            out[-1] = (out[-1][0], hi, tier.depth)
        else:
            out.append((tier.min_batch, hi, tier.depth))
    return out


def when(t: float) -> str:
    # Samples carry wall-clock time, or a simulator clock that starts near 0.
    if t > 1e9:
        return dt.datetime.fromtimestamp(t).isoformat(timespec="seconds")
    return f"t={t:,.0f} s"
