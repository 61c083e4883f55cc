"""What the shapes step measured, side by side: per prompt family and load, each draft
shape's tok/s (and its ratio to the plain server), TPOT p50/p99 and accept length; the best
chain and the best tree at each load; where each shape falls below the plain server; and the
verdict the tree-tier work waits on: does any tree beat the best chain by `TREE_MARGIN`?
And the bound on a closed loop over these loads (`closed_loop_bound`): what switching shapes
for free at every step could give over the best single shape, with plain among them or not.

    python -m benchmarks.gpu.shape_report SHAPES_DIR   # rewrites shapes.txt, .json and .png

SHAPES_DIR holds one folder per shape (`3x4x16/`, `plain/`) with one `<family>.json` each, as
`benchmarks.gpu.shape_bench` writes them.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.gpu.draft_shapes import PLAIN, ShapeError, parse_shape
from controller.bench.level_flags import level_flags
from sims.shape_table import loop_bound, shape_table

WIDTH = 20  # a table cell
TREE_MARGIN = 0.05  # a tree must beat the best chain by this share to earn tiers of its own

# label -> family -> streams -> the level's figures
Figures = dict[str, dict[str, dict[int, dict[str, Any]]]]
KEPT = ("output_tok_per_s", "tpot_p50_ms", "tpot_p99_ms", "ttft_p99_ms", "accept_length",
        "requests", "errors")  # fmt: skip


def load(folder: Path) -> Figures:
    """Every `<shape>/<family>.json` under `folder`, keyed by shape, family and streams."""
    out: Figures = {}
    for path in sorted(folder.glob("*/*.json")):
        try:
            parse_shape(path.parent.name)
        except ShapeError:
            continue  # not a shape's folder
        doc = json.loads(path.read_text())
        if "levels" not in doc:
            continue  # the server's /server_info beside the families
        levels = {int(lv["concurrency"]): {**{k: lv.get(k) for k in KEPT},
                                           "flags": level_flags(lv)}
                  for lv in doc.get("levels", [])}
        out.setdefault(path.parent.name, {})[path.stem] = levels
    return out


def _is_tree(label: str) -> bool:
    shape = parse_shape(label)
    return shape is not None and not shape.is_chain


def _is_chain(label: str) -> bool:
    shape = parse_shape(label)
    return shape is not None and shape.is_chain


def _flagged(level: Mapping[str, Any]) -> bool:
    """A level the bench flagged (too short, too few requests, other traffic, client-bound):
    its tok/s, the tokens streamed in its window, is shown marked but decides nothing."""
    return bool(level["flags"])


def _tok(fig: Figures, label: str, family: str, streams: int, flagged: bool = False
         ) -> float | None:  # fmt: skip
    """A level's tok/s; a flagged level's only when `flagged` is asked for."""
    level = fig.get(label, {}).get(family, {}).get(streams)
    if not level or not level.get("output_tok_per_s"):
        return None
    if _flagged(level) and not flagged:
        return None
    return float(level["output_tok_per_s"])


def _best(fig: Figures, labels: Sequence[str], family: str, streams: int
          ) -> tuple[str, float] | None:  # fmt: skip
    scored = [(lb, t) for lb in labels if (t := _tok(fig, lb, family, streams)) is not None]
    return max(scored, key=lambda x: x[1]) if scored else None


def closed_loop_bound(fig: Figures, labels: Sequence[str], family: str,
                      streams: Sequence[int]) -> dict[str, Any] | None:
    """`sims.shape_table.loop_bound` over the loads up and back down (1, 4, ..., 256, ...,
    4, 1), among the drafting shapes (a shape server, no off) and with plain. A flagged
    level counts with its streamed tok/s: every shape needs a figure at every step. None: a
    shape lacks a level."""
    tok = {lb: [_tok(fig, lb, family, s, flagged=True) for s in streams] for lb in labels}
    drafting = loop_bound(streams, {lb: t for lb, t in tok.items() if lb != PLAIN})
    if drafting is None:
        return None
    out: dict[str, Any] = {
        "steps": drafting.steps,
        "flagged_steps": [s for s in streams if any(
            (lv := fig[lb][family].get(s)) is not None and _flagged(lv) for lb in labels)],
        "drafting": drafting.to_json(),
    }  # fmt: skip
    with_plain = loop_bound(streams, tok) if PLAIN in tok else None
    if with_plain is not None:
        out["with_plain"] = with_plain.to_json()
    return out


def analyse(fig: Figures, order: Sequence[str] | None = None) -> dict[str, Any]:
    """Per family: the levels' best chain and tree and their ratio, each shape's first load
    below the plain server, and the tree wins of at least TREE_MARGIN."""
    labels = list(order) if order is not None else sorted(fig)
    labels = [lb for lb in labels if lb in fig]
    chains = [lb for lb in labels if _is_chain(lb)]
    trees = [lb for lb in labels if _is_tree(lb)]
    families = sorted({f for by_family in fig.values() for f in by_family})
    result: dict[str, Any] = {"shapes": labels, "families": {}, "tree_wins": []}
    for family in families:
        streams = sorted({s for lb in labels for s in fig[lb].get(family, {})})
        levels = []
        for s in streams:
            chain, tree = _best(fig, chains, family, s), _best(fig, trees, family, s)
            best = _best(fig, labels, family, s)
            ratio = tree[1] / chain[1] if chain and tree and chain[1] > 0 else None
            levels.append({"streams": s, "best": best and best[0],
                           "best_chain": chain and chain[0], "best_tree": tree and tree[0],
                           "tree_over_chain": ratio})
            if ratio is not None and ratio >= 1 + TREE_MARGIN:
                assert chain and tree
                result["tree_wins"].append({"family": family, "streams": s, "tree": tree[0],
                                            "chain": chain[0], "ratio": ratio})
        below = {}
        for lb in labels:
            if lb == PLAIN:
                continue
            under = [s for s in streams if (t := _tok(fig, lb, family, s)) is not None
                     and (p := _tok(fig, PLAIN, family, s)) is not None and t < p]
            below[lb] = under[0] if under else None
        # What a server that captured these shapes would run: the best shape per load as tiers.
        table = shape_table(streams, {lb: [_tok(fig, lb, family, s) for s in streams]
                                      for lb in labels})  # fmt: skip
        result["families"][family] = {
            "levels": levels,
            "first_below_plain": below,
            "table": None if table is None else table.to_json(),
            "table_line": None if table is None else table.describe(),
            "closed_loop_bound": closed_loop_bound(fig, labels, family, streams),
        }
    result["verdict"] = verdict(result)
    return result


def verdict(analysis: Mapping[str, Any]) -> str:
    wins = analysis["tree_wins"]
    if not any(_is_tree(lb) for lb in analysis["shapes"]):
        return "no tree shape measured"
    if not wins:
        return (f"no tree beats the best chain by {TREE_MARGIN:.0%} at any measured load of "
                "any family")
    top = max(wins, key=lambda w: w["ratio"])
    return (f"a tree beats the best chain by {TREE_MARGIN:.0%} or more at {len(wins)} "
            f"load(s); most: {top['tree']} over {top['chain']} by {top['ratio'] - 1:+.1%} at "
            f"{top['streams']} streams, family {top['family']}")


def _num(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def text(fig: Figures, analysis: Mapping[str, Any]) -> str:
    labels = analysis["shapes"]
    lines: list[str] = []
    for family, part in analysis["families"].items():
        streams = [lv["streams"] for lv in part["levels"]]
        head = f"{'shape':<10}" + "".join(f"c={s}".rjust(WIDTH) for s in streams)
        lines += [f"family {family}: output tok/s (x plain), accept length", head]
        for lb in labels:
            cells = []
            for s in streams:
                level = fig[lb].get(family, {}).get(s)
                t = _tok(fig, lb, family, s, flagged=True)
                p = _tok(fig, PLAIN, family, s, flagged=True)
                if t is None or level is None:
                    cells.append("-".rjust(WIDTH))
                    continue
                ratio = f" x{t / p:.2f}" if p else ""
                acc = level.get("accept_length")
                accept = f" {acc:.2f}" if acc is not None and lb != PLAIN else ""
                mark = "*" if _flagged(level) else ""
                cells.append(f"{mark}{t:,.0f}{ratio}{accept}".rjust(WIDTH))
            lines.append(f"{lb:<10}" + "".join(cells))
        lines += ["", f"family {family}: TPOT p50 / p99 (ms)", head]
        for lb in labels:
            cells = []
            for s in streams:
                level = fig[lb].get(family, {}).get(s) or {}
                cells.append(f"{_num(level.get('tpot_p50_ms'), '.1f')} / "
                             f"{_num(level.get('tpot_p99_ms'), '.1f')}".rjust(WIDTH))
            lines.append(f"{lb:<10}" + "".join(cells))
        lines += ["", f"family {family}: best shape, best chain, best tree, tree / chain"]
        for lv in part["levels"]:
            lines.append(f"  c={lv['streams']:<4} best {lv['best']}, chain {lv['best_chain']}, "
                         f"tree {lv['best_tree']}, tree/chain "
                         f"{_num(lv['tree_over_chain'], '.3f')}")
        below = ", ".join(f"{lb} at c={s}" if s else f"{lb} never"
                          for lb, s in part["first_below_plain"].items())
        lines.append(f"  first load below the plain server: {below}")
        lines += [f"  as a table: {part['table_line'] or 'none (a load has no unflagged shape)'}",
                  *bound_lines(part.get("closed_loop_bound")), ""]
    lines.append("* flagged by the bench (too short: no request that started in the window "
                 "finished in it; too few requests; ...): the window's streamed tok/s, shown "
                 "but left out of the best shapes and the verdict")
    lines.append(f"verdict: {analysis['verdict']}")
    return "\n".join(lines) + "\n"


def bound_lines(bound: Mapping[str, Any] | None) -> list[str]:
    if bound is None:
        return ["  closed loop bound: none (a shape lacks a level)"]
    widest = bound.get("with_plain") or bound["drafting"]
    held = ", ".join(f"{lb} {t:,.0f}" for lb, t in widest["held_tok_per_s"].items())
    flagged = ",".join(map(str, bound["flagged_steps"]))
    lines = [f"  closed loop {'-'.join(map(str, bound['steps']))} streams, steps alike"
             f"{f' (c={flagged}: flagged levels streamed)' if flagged else ''}:",
             f"    one shape throughout: {held} tok/s"]
    for key, what in (("drafting", "drafting shape (no off)"), ("with_plain", "shape or plain")):
        if key in bound:
            b = bound[key]
            lines.append(f"    the best {what} per step: {b['best_per_step_tok_per_s']:,.0f} "
                         f"tok/s, x{b['gain']:.3f} the best single one ({b['best_single']})")
    return lines


def plot(fig: Figures, analysis: Mapping[str, Any], path: Path) -> None:
    """One panel per family: each shape's tok/s over the plain server's against the load
    (chains solid, trees dashed, plain the line at 1), the verdict in the title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = list(analysis["families"])
    if not families or PLAIN not in fig:
        return  # nothing to draw against
    figure, axes = plt.subplots(1, len(families), figsize=(6 * len(families), 4.4),
                                squeeze=False)
    for ax, family in zip(axes[0], families, strict=True):
        streams = [lv["streams"] for lv in analysis["families"][family]["levels"]]
        for lb in analysis["shapes"]:
            if lb == PLAIN:
                continue
            points = [(s, t / p) for s in streams
                      if (t := _tok(fig, lb, family, s, flagged=True)) is not None
                      and (p := _tok(fig, PLAIN, family, s, flagged=True))]
            if not points:
                continue
            line, = ax.plot(*zip(*points, strict=True), marker="o", label=lb,
                            linestyle="--" if _is_tree(lb) else "-")
            hollow = [(s, r) for s, r in points
                      if _flagged(fig[lb][family][s]) or _flagged(fig[PLAIN][family][s])]
            if hollow:  # flagged levels: drawn, hollow, deciding nothing
                ax.scatter(*zip(*hollow, strict=True), s=60, facecolors="white",
                           edgecolors=line.get_color(), zorder=3)
        ax.axhline(1.0, color="black", linewidth=1, label="plain")
        ax.set_xscale("log", base=2)
        ax.set_xticks(streams, [str(s) for s in streams])
        ax.minorticks_off()
        ax.set_xlabel("concurrent streams")
        ax.set_ylabel("output tok/s / plain server's")
        ax.set_title(f"family {family}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    figure.suptitle(f"SGLang's static draft shapes (steps x topk x draft tokens, trees dashed; "
                    "hollow: a level the bench flagged)"
                    f"\n{analysis['verdict']}", fontsize=10, wrap=True)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def write(folder: Path, order: Sequence[str] | None = None) -> dict[str, Any]:
    """shapes.txt, shapes.json and shapes.png in `folder` from what its shape folders hold."""
    fig = load(folder)
    analysis = analyse(fig, order)
    plot(fig, analysis, folder / "shapes.png")
    (folder / "shapes.txt").write_text(text(fig, analysis))
    (folder / "shapes.json").write_text(json.dumps(
        {"analysis": analysis,
         "figures": {lb: {f: {str(s): v for s, v in by.items()} for f, by in fams.items()}
                     for lb, fams in fig.items()}}, indent=1) + "\n")
    return analysis


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not Path(args[0]).is_dir():
        print("usage: python -m benchmarks.gpu.shape_report SHAPES_DIR", file=sys.stderr)
        return 2
    analysis = write(Path(args[0]))
    print((Path(args[0]) / "shapes.txt").read_text(), end="")
    return 0 if analysis["shapes"] else 2


if __name__ == "__main__":
    sys.exit(main())
