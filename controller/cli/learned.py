"""What the model has learned from a store, and what it rests on (`specctl curves`, `freeze`).

Reads the daemon's SQLite store, refits a Learner on one group's samples (or loads the group's
latest learner snapshot with `--snapshot`) and shows, per depth, the predicted decode tok/s
against batch size with its 90% band, the measured points (samples pooled per batch-size
bucket, with how many decode iterations each rests on), the crossovers, and the live table
(the last push the daemon judged good) next to the table the model proposes now.
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
from models.samples import Sample
from sglang_hooks.contract import BS_BUCKET_EDGES, PolicyError, PolicyTable, bs_bucket, parse_table


class CurvesError(RuntimeError):
    """The store cannot answer the question asked; the message says what to do instead."""


@dataclass(frozen=True)
class MeasuredPoint:
    """Samples of one (depth, bucket), pooled: exact ratios of summed counter deltas."""

    depth: int
    bs_bucket: int
    mean_batch: float
    tok_per_s: float
    accept_length: float
    step_ms: float
    iterations: float
    samples: int


@dataclass
class GroupModel:
    store: Path
    group: str
    targets: list[str]
    samples: list[Sample]
    learner: Learner
    now: float
    source: str  # how the learner was obtained
    live_table: PolicyTable | None
    live_target: str | None

    @property
    def window(self) -> tuple[float, float]:
        return min(s.t_end - s.interval_s for s in self.samples), max(s.t_end for s in self.samples)

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
    acc: dict[tuple[int, int], list[float]] = {}
    for s in samples:
        row = acc.setdefault((s.depth, s.bs_bucket), [0.0, 0.0, 0.0, 0.0, 0.0])
        row[0] += s.iterations
        row[1] += s.request_steps
        row[2] += s.tokens
        row[3] += s.gpu_seconds
        row[4] += 1
    out = []
    for (d, b), (it, rs, tok, gpu, n) in sorted(acc.items()):
        if it <= 0 or rs <= 0 or gpu <= 0:
            continue
        out.append(MeasuredPoint(d, b, rs / it, tok / gpu, tok / rs, 1000 * gpu / it, it, int(n)))
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
        samples = [
            s for s in everything if s.group == group and (target is None or s.target == target)
        ]
        if not samples:
            raise CurvesError(f"--group {group!r}: no samples; groups in the store: {groups}")
        targets = sorted({s.target for s in samples})
        now = max(s.t_end for s in samples)
        learner, source = _learner(store, group, samples, now, use_snapshot, seed)
        live_table, live_target = _live_table(store, targets)
    finally:
        store.close()
    return GroupModel(
        store_path, group, targets, samples, learner, now, source, live_table, live_target
    )


def _learner(
    store: Store, group: str, samples: list[Sample], now: float, use_snapshot: bool, seed: int
) -> tuple[Learner, str]:
    if use_snapshot:
        snap = store.latest_learner_snapshot(group)
        if snap is None:
            raise CurvesError(f"no learner snapshot for group {group!r}; drop --snapshot to refit")
        t, version, state = snap
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
    top = max(s.mean_batch for s in model.samples)
    measured = {s.bs_bucket for s in model.samples}
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
        "measured": [asdict(m) for m in measured_points(model.samples)],
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
    depths = sorted(curves)
    t = Table(
        title="decode tok/s by batch size: predicted ±half its 90% band / measured (iterations)",
        box=None,
        title_justify="left",
    )
    t.add_column("batch", justify="right", no_wrap=True)
    for d in depths:
        t.add_column("off" if d == 0 else f"d{d}", justify="right", no_wrap=True)
    t.add_column("best", justify="center")
    t.add_column("live", justify="center")
    for i, b in enumerate(grid):
        row = [str(b)]
        preds = {d: curves[d][i] for d in depths}
        finite = {d: p.tok_per_s for d, p in preds.items() if math.isfinite(p.tok_per_s)}
        best = max(finite, key=lambda d: finite[d]) if finite else None
        for d in depths:
            row.append(_cell(preds[d], measured.get((d, bs_bucket(b))), d == best))
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
    meas = (
        "[dim]-[/dim]"
        if m is None
        else f"[cyan]{m.tok_per_s:,.0f}[/cyan] ({_fmt_n(m.iterations)} it)"
    )
    return f"{pred}\n{meas}"


def plot_curves(model: GroupModel, proposal: Proposal, path: Path) -> None:
    """Bands, measured points sized by evidence, crossovers, table tiers shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    top = max(batch_grid(model))
    grid = np.unique(np.round(np.geomspace(1, top, 120)))
    curves = model.learner.curves(grid)
    measured = measured_points(model.samples)
    table = model.live_table or proposal.table
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    color = {d: colors[i % len(colors)] for i, d in enumerate(sorted(curves))}
    fig, ax = plt.subplots(figsize=(10, 5.5))
    for lo, hi, depth in _spans(table, top * 1.2):
        ax.axvspan(lo, hi, color=color.get(depth, "grey"), alpha=0.08, lw=0)
        ax.text(
            math.sqrt(lo * hi), 0.97, "tier: off" if depth == 0 else f"tier: d{depth}",
            transform=ax.get_xaxis_transform(), ha="center", va="top", fontsize=8,
            color=color.get(depth, "grey"),
        )  # fmt: skip
    max_it = max((m.iterations for m in measured), default=1.0)
    for d, points in sorted(curves.items()):
        name = "off (depth 0)" if d == 0 else f"depth {d}"
        xs = np.asarray([p.batch for p in points])
        ys = np.asarray([p.tok_per_s for p in points])
        ax.plot(xs, ys, color=color[d], label=f"{name}: predicted")
        ax.fill_between(
            xs, [p.lo for p in points], [p.hi for p in points], color=color[d], alpha=0.2, lw=0
        )
        mine = [m for m in measured if m.depth == d]
        if mine:
            sizes = [12 + 150 * math.sqrt(m.iterations / max_it) for m in mine]
            ax.scatter(
                [m.mean_batch for m in mine], [m.tok_per_s for m in mine], s=sizes,
                color=color[d], edgecolor="black", linewidth=0.5, alpha=0.8, zorder=3,
                label=f"{name}: measured (size ~ iterations)",
            )  # fmt: skip
    for a, b, x in proposal.crossovers:
        ax.axvline(x, color="black", linestyle=":", linewidth=1)
        ax.text(
            x, 0.02, f" d{a}→d{b} @ {x:.1f}", rotation=90, transform=ax.get_xaxis_transform(),
            fontsize=8, va="bottom",
        )  # fmt: skip
    ax.set_xscale("log", base=2)
    ticks = [b for b in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024) if b <= top]
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()
    ax.set_xlim(1, top * 1.2)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("batch size (running requests in a decode iteration)")
    ax.set_ylabel("decode tok/s")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(0.0, 0.93))
    start, end = model.window
    which = "live table" if model.live_table else "proposed table"
    ax.set_title(
        f"{model.group}: {len(model.samples)} samples over {end - start:,.0f} s, {model.source}\n"
        f"shaded: {which} {table.describe()}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=130)
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
