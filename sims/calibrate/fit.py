"""Fit a simulator profile's cost model (`target.*`, `draft.*`) to measured step times.

Input: the CSV files `sims.calibrate.bench` writes (one row per measured shape). Output: the
fitted fields, and the error of the resulting `Profile` against every measurement, split into
the points the fit saw and held-out points it did not.

The fit minimises relative error (log residuals) with a small Levenberg-Marquardt loop over
positive parameters (numpy only), evaluating the very cost model the simulator runs
(`Profile.target_ms`, `draft_step_ms`, `draft_extend_ms`), so what is fitted is what is used.

    python -m sims.calibrate.fit --preset llama8b --profile h200-llama8b-eagle3 --write
"""

from __future__ import annotations

import argparse
import csv
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sims.profile import Profile, load_profile

# Held out of every fit and scored separately: interpolation in depth and in batch size.
HELD_OUT_TOKENS = (3, 6)
HELD_OUT_BATCHES = (4, 32)


@dataclass(frozen=True)
class Point:
    kind: str  # target | draft_step | draft_extend | iteration
    context: int
    batch: int
    tokens: int
    depth: int | None
    ms: float

    @property
    def held_out(self) -> bool:
        """Never fitted: held-out shapes, and whole iterations (a check of the sum's parts)."""
        return (
            self.kind == "iteration"
            or self.tokens in HELD_OUT_TOKENS
            or self.batch in HELD_OUT_BATCHES
        )


def load_points(paths: Iterable[Path]) -> list[Point]:
    points = []
    for path in paths:
        with Path(path).open(newline="") as fh:
            for row in csv.DictReader(fh):
                points.append(
                    Point(
                        kind=row["kind"],
                        context=int(row["context"]),
                        batch=int(row["batch"]),
                        tokens=int(row["tokens"]),
                        depth=int(row["depth"]) if row["depth"] not in ("", None) else None,
                        ms=float(row["ms"]),
                    )
                )
    if not points:
        raise ValueError(f"no measurements in {', '.join(map(str, paths))}")
    return points


# ----------------------------------------------------------------------------- optimiser


def levenberg_marquardt(
    residuals: Callable[[np.ndarray], np.ndarray],
    x0: np.ndarray,
    iterations: int = 200,
    tol: float = 1e-10,
) -> np.ndarray:
    """Minimise sum(residuals(x)**2) from x0 (forward-difference Jacobian, adaptive damping)."""
    x = np.asarray(x0, dtype=float).copy()
    r = residuals(x)
    cost = float(r @ r)
    damping = 1e-3
    for _ in range(iterations):
        jac = np.empty((r.size, x.size))
        for j in range(x.size):
            step = 1e-6 * max(1.0, abs(x[j]))
            xj = x.copy()
            xj[j] += step
            jac[:, j] = (residuals(xj) - r) / step
        grad = jac.T @ r
        hess = jac.T @ jac
        improved = False
        for _ in range(30):
            lhs = hess + damping * np.diag(np.diag(hess) + 1e-12)
            try:
                delta = np.linalg.solve(lhs, -grad)
            except np.linalg.LinAlgError:
                damping *= 10.0
                continue
            x_new = x + delta
            r_new = residuals(x_new)
            cost_new = float(r_new @ r_new)
            if np.isfinite(cost_new) and cost_new < cost:
                improved = True
                converged = cost - cost_new < tol * max(cost, 1e-30)
                x, r, cost = x_new, r_new, cost_new
                damping = max(damping / 3.0, 1e-12)
                break
            damping *= 4.0
        if not improved or converged:
            break
    return x


# ----------------------------------------------------------------------------- fitting


def _with(base: Profile, target: dict[str, Any] | None = None,
          draft: dict[str, Any] | None = None) -> Profile:
    data = base.model_dump()
    if target:
        data["target"].update(target)
    if draft:
        data["draft"].update(draft)
    return Profile.model_validate(data)


def _log_residuals(model_ms: np.ndarray, measured_ms: np.ndarray) -> np.ndarray:
    return np.log(np.maximum(model_ms, 1e-9) / measured_ms)


TARGET_LINEAR = ("fixed_ms", "weight_read_ms", "kv_us_per_req_per_1k_ctx", "compute_us_per_token")


def fit_target(
    base: Profile, points: Sequence[Point], weight_read_ms: float | None = None
) -> dict[str, Any]:
    """Fitted `target` fields (the base profile's moe experts/top_k are kept).

    weight_read_ms: pin the dense-weight floor (bytes / measured bandwidth) instead of fitting
    it, so that `fixed_ms` reads as what it is: per-forward overhead above that floor.
    Both placements of the KV read are fitted (`kv_in_roofline`); the better one is kept.
    """
    fits = [_fit_target(base, points, inside, weight_read_ms) for inside in (True, False)]
    return min(fits, key=lambda f: f[1])[0]


def _fit_target(
    base: Profile, points: Sequence[Point], kv_in_roofline: bool, pinned_weights: float | None
) -> tuple[dict[str, Any], float]:
    pts = [p for p in points if p.kind == "target"]
    if not pts:
        raise ValueError("no 'target' measurements to fit")
    b = np.array([p.batch for p in pts], float)
    n = np.array([p.tokens for p in pts], float)
    ctx = np.array([p.context for p in pts], float)
    ms = np.array([p.ms for p in pts], float)
    moe = base.target.moe
    names = [f for f in TARGET_LINEAR if not (pinned_weights and f == "weight_read_ms")]
    names += ["expert_read_ms"] if moe else []

    def fields(x: np.ndarray) -> dict[str, Any]:
        vals = np.exp(x[: len(names)])
        out: dict[str, Any] = dict(zip(names, vals.tolist(), strict=True))
        if pinned_weights:
            out["weight_read_ms"] = pinned_weights
        out["roofline_sharpness"] = 1.0 + 15.0 / (1.0 + math.exp(-min(max(x[-1], -30.0), 30.0)))
        if moe:
            out["moe"] = {"experts": moe.experts, "top_k": moe.top_k,
                          "expert_read_ms": out.pop("expert_read_ms")}
        out["comm_ms"] = 0.0
        out["comm_us_per_token"] = 0.0
        out["kv_in_roofline"] = kv_in_roofline
        return out

    def model(x: np.ndarray) -> np.ndarray:
        c = fields(x)
        kv = c["kv_us_per_req_per_1k_ctx"] * b * (ctx / 1000.0) / 1000.0
        mem = c["weight_read_ms"] + (kv if kv_in_roofline else 0.0)
        t = b * n
        if moe:
            mem = mem + c["moe"]["expert_read_ms"] * (1.0 - (1.0 - moe.top_k / moe.experts) ** t)
        compute = c["compute_us_per_token"] * t / 1000.0
        p = c["roofline_sharpness"]
        core = (mem**p + compute**p) ** (1.0 / p) + (0.0 if kv_in_roofline else kv)
        return np.asarray(c["fixed_ms"] + core)

    floor = float(ms.min())
    best: np.ndarray | None = None
    best_cost = math.inf
    # A few starts: the roofline knee makes the problem non-convex.
    for share, knee in ((0.3, 0.0), (0.1, 1.5), (0.5, -1.5), (0.2, 3.0)):
        x0 = [math.log(floor * share)]
        x0 += [] if pinned_weights else [math.log(floor * (1 - share))]
        x0 += [math.log(30.0), math.log(20.0)]
        if moe:
            x0.append(math.log(floor * 2))
        x0.append(knee)
        x = levenberg_marquardt(lambda x: _log_residuals(model(x), ms), np.array(x0))
        cost = float(np.sum(_log_residuals(model(x), ms) ** 2))
        if cost < best_cost:
            best, best_cost = x, cost
    assert best is not None
    check = _with(base, target=fields(best))
    assert np.allclose(check.target_ms(b, n, ctx), model(best))  # the simulator's own model
    return _rounded(fields(best)), best_cost


def nonneg_lstsq(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with x >= 0 (active set: drop the most negative column, refit)."""
    free = list(range(a.shape[1]))
    x = np.zeros(a.shape[1])
    while free:
        coef, *_ = np.linalg.lstsq(a[:, free], y, rcond=None)
        if (coef >= 0).all():
            x[free] = coef
            break
        free.pop(int(np.argmin(coef)))
    return x


DRAFT_FIELDS = (
    "step_fixed_ms", "step_us_per_req", "extend_fixed_ms", "extend_us_per_token",
    "extend_us_per_req", "kv_us_per_req_per_1k_ctx",
)


def fit_draft(points: Sequence[Point]) -> dict[str, Any]:
    """Fitted draft step / extend costs: linear in batch, batch tokens and batch * context.

    step(B, C)      = step_fixed + step_per_req * B + kv * B * C
    extend(B, n, C) = extend_fixed + per_token * B * n + per_req * B + kv * B * C
    One least-squares problem over both kinds (relative error), all coefficients >= 0.
    """
    steps = [p for p in points if p.kind == "draft_step"]
    extends = [p for p in points if p.kind == "draft_extend"]
    if not steps or not extends:
        raise ValueError("no draft_step / draft_extend measurements to fit")
    rows, ys = [], []
    for p in steps:
        rows.append([1.0, p.batch, 0.0, 0.0, 0.0, p.batch * p.context / 1000.0])
        ys.append(p.ms)
    for p in extends:
        rows.append([0.0, 0.0, 1.0, p.batch * p.tokens, p.batch, p.batch * p.context / 1000.0])
        ys.append(p.ms)
    y = np.array(ys)
    coef = nonneg_lstsq(np.array(rows) / y[:, None], np.ones_like(y))
    scale = np.array([1.0, 1000.0, 1.0, 1000.0, 1000.0, 1000.0])  # ms -> us where per-unit
    return _rounded(dict(zip(DRAFT_FIELDS, (coef * scale).tolist(), strict=True)))


def _rounded(d: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out[k] = _rounded(v)
        elif isinstance(v, float):
            out[k] = float(f"{v:.4g}")
        else:
            out[k] = v
    return out


# ----------------------------------------------------------------------------- scoring


@dataclass(frozen=True)
class Scored:
    point: Point
    model_ms: float

    @property
    def rel_error(self) -> float:
        return self.model_ms / self.point.ms - 1.0


def predict(profile: Profile, p: Point) -> float:
    """The profile's modelled time for one measured shape."""
    if p.kind == "target":
        return float(profile.target_ms(p.batch, p.tokens, p.context))
    if p.kind == "draft_step":
        return float(profile.draft_step_ms(p.batch, p.context))
    if p.kind == "draft_extend":
        return float(profile.draft_extend_ms(p.batch, p.tokens, p.context))
    if p.kind == "iteration":
        # GPU time of one speculative iteration: the measurement has no CPU scheduling terms.
        depth = p.depth or 0
        return float(
            profile.target_ms(p.batch, depth + 1, p.context)
            + profile.draft_extend_ms(p.batch, depth + 1, p.context)
            + depth * profile.draft_step_ms(p.batch, p.context)
        )
    raise ValueError(f"unknown measurement kind {p.kind!r}")


def score(profile: Profile, points: Sequence[Point]) -> list[Scored]:
    return [Scored(p, predict(profile, p)) for p in points]


def error_summary(scored: Sequence[Scored]) -> dict[str, float]:
    errs = np.abs([s.rel_error for s in scored])
    if errs.size == 0:
        return {"points": 0, "median": math.nan, "worst": math.nan}
    return {"points": int(errs.size), "median": float(np.median(errs)),
            "worst": float(errs.max())}


def fit_report(profile: Profile, points: Sequence[Point]) -> dict[str, dict[str, float]]:
    """Error of `profile` per measurement kind, on fitted and on held-out points."""
    out = {}
    for kind in ("target", "draft_step", "draft_extend", "iteration"):
        sc = score(profile, [p for p in points if p.kind == kind])
        if kind != "iteration":  # whole iterations are never fitted
            out[f"{kind}/fitted"] = error_summary([s for s in sc if not s.point.held_out])
        out[f"{kind}/held_out"] = error_summary([s for s in sc if s.point.held_out])
    return out


def fit_profile(
    base: Profile, points: Sequence[Point], weight_read_ms: float | None = None
) -> Profile:
    """`base` with target.* and draft.* fitted to the non-held-out points."""
    train = [p for p in points if not p.held_out]
    target = fit_target(base, train, weight_read_ms)
    return _with(base, target=target, draft=fit_draft(train))


# ----------------------------------------------------------------------------- outputs


def best_depths(profile: Profile, batches: Sequence[int]) -> list[dict[str, Any]]:
    """Best captured depth (or no speculation) per batch size, by `decode_tok_per_s`."""
    rows = []
    for b in batches:
        options: dict[str, float] = {"off": float(profile.decode_tok_per_s(None, b))}
        for d in profile.captured_depths:
            options[str(d)] = float(profile.decode_tok_per_s(d, b))
        best = max(options, key=lambda k: options[k])
        rows.append({"batch": b, "best": best, "tok_s": options})
    return rows


def floor_check(points: Sequence[Point], active_bytes: int, kv_bytes_per_token: int,
                bandwidth_tb_s: float) -> list[dict[str, float]]:
    """Plain decode at B=1 against bytes / measured bandwidth, per context."""
    out = []
    for p in points:
        if p.kind == "target" and p.batch == 1 and p.tokens == 1:
            nbytes = active_bytes + kv_bytes_per_token * p.context
            floor = nbytes / (bandwidth_tb_s * 1e12) * 1000.0
            out.append({"context": p.context, "measured_ms": p.ms, "floor_ms": round(floor, 4),
                        "floor_share": round(floor / p.ms, 3)})
    return out


def write_profile(profile: Profile, path: Path, header: str) -> None:
    """Write `profile` as YAML, `header` as leading comment lines."""
    import yaml

    class _Dumper(yaml.SafeDumper):
        pass

    def _list(dumper: yaml.SafeDumper, items: list[Any]) -> Any:
        numeric = all(isinstance(i, int | float) for i in items)
        return dumper.represent_sequence("tag:yaml.org,2002:seq", items, flow_style=numeric)

    _Dumper.add_representer(list, _list)
    data = profile.model_dump(exclude_none=True)
    body = yaml.dump(data, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=1000)
    comment = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    path.write_text(comment + body)


def plot_fit(profile: Profile, points: Sequence[Point], title: str, path: Path) -> None:
    """Measured vs modelled target step time per batch size and depth, one panel a context."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    contexts = sorted({p.context for p in points if p.kind == "target"})
    fig, axes = plt.subplots(1, len(contexts) + 1, figsize=(5.2 * (len(contexts) + 1), 4.6))
    colors = {1: "C0", 2: "C1", 4: "C2", 8: "C3", 3: "C4", 6: "C5"}
    for ax, ctx in zip(axes, contexts, strict=False):
        for n, color in colors.items():
            pts = sorted((p for p in points if p.kind == "target" and p.context == ctx
                          and p.tokens == n), key=lambda p: p.batch)
            if not pts:
                continue
            bs = np.array([p.batch for p in pts], float)
            grid = np.geomspace(bs.min(), bs.max(), 80)
            held = "held out" if n in HELD_OUT_TOKENS else "fitted"
            ax.plot(grid, profile.target_ms(grid, n, ctx), color=color, lw=1.2)
            ax.plot(bs, [p.ms for p in pts], "o" if held == "fitted" else "s", color=color,
                    mfc="none" if held == "held out" else color, ms=5,
                    label=f"n={n} ({held})")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("batch size B (requests)")
        ax.set_ylabel("target forward of B x n tokens (ms)")
        ax.set_title(f"{title}: target, context {ctx}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    ax = axes[-1]
    sc = score(profile, [p for p in points if p.kind == "iteration"])
    for depth, color in zip((0, 1, 3, 7), ("C0", "C1", "C2", "C3"), strict=True):
        chosen = [s for s in sc if s.point.depth == depth]
        ax.plot([s.point.ms for s in chosen], [s.model_ms for s in chosen], "o", color=color,
                label=f"depth {depth}")
    lim = [min(s.point.ms for s in sc) * 0.8, max(s.point.ms for s in sc) * 1.2]
    ax.plot(lim, lim, "k--", lw=0.8, label="model = measured")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured whole iteration (ms)")
    ax.set_ylabel("modelled: target + extend + depth x draft step (ms)")
    ax.set_title("iterations (never fitted), all contexts")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--preset", required=True, help="bench preset (llama8b, moe)")
    ap.add_argument("--data", type=Path, default=Path(__file__).parent / "data",
                    help="folder with steps_<preset>.csv and meta.json")
    ap.add_argument("--profile", required=True,
                    help="profile (name or YAML path) whose target/draft fields to fit")
    ap.add_argument("--write", action="store_true", help="rewrite the profile YAML in place")
    ap.add_argument("--plot", type=Path, help="write a measured-vs-model PNG here")
    ap.add_argument("--report", type=Path, help="write the fit report JSON here")
    args = ap.parse_args(argv)
    import json

    from sims.calibrate.shapes import PRESETS
    from sims.profile import PROFILES_DIR

    base = load_profile(args.profile)
    points = load_points([args.data / f"steps_{args.preset}.csv"])
    meta = json.loads((args.data / "meta.json").read_text())
    ceilings = meta.get("ceilings")
    if not ceilings:  # a run with --skip-ceilings, or on a CPU: no bandwidth to read weights at
        ap.error(f"{args.data / 'meta.json'} has no memory ceilings (the benchmark ran with "
                 "--skip-ceilings or without a GPU); run sims.calibrate.bench again without it")
    bandwidth = max(ceilings["copy_tb_s"], ceilings["read_tb_s"])
    shape = PRESETS[args.preset].target
    weight_ms = shape.dense_bytes() / (bandwidth * 1e12) * 1000.0
    fitted = fit_profile(base, points, weight_read_ms=weight_ms)
    errors = fit_report(fitted, points)
    report = {
        "profile": fitted.name,
        "device": meta["device_info"],
        "ceilings": ceilings,
        "weight_read_ms_pinned": round(weight_ms, 4),
        "target": fitted.target.model_dump(),
        "draft": fitted.draft.model_dump(),
        "errors": errors,
        "b1_decode_vs_floor": floor_check(
            points, shape.active_bytes(1), shape.kv_bytes_per_token(), bandwidth
        ),
        "best_depth_by_batch": best_depths(fitted, (1, 2, 4, 8, 16, 32, 48, 64, 128, 256)),
    }
    for key, summary in errors.items():
        print(f"{key:>24}: {summary['points']:3d} points, median |err| "
              f"{summary['median']:.1%}, worst {summary['worst']:.1%}")
    for row in report["best_depth_by_batch"]:
        print(f"B={row['batch']:4d}: best {row['best']:>3}  "
              + " ".join(f"{k}:{v:.0f}" for k, v in row["tok_s"].items()))
    if args.write:
        path = Path(args.profile)
        if not path.suffix:
            path = PROFILES_DIR / f"{args.profile}.yaml"
        header = (
            f"{fitted.description}\n"
            "target.* and draft.* are fitted to step times measured on an H200 by\n"
            f"sims/calibrate (python -m sims.calibrate.fit --preset {args.preset} --profile "
            f"{fitted.name} --write);\n"
            "acceptance and scheduler fields come from the cited sources. See "
            "docs/simulator.md, 'Calibrating the cost model on a GPU'."
        )
        write_profile(fitted, path, header)
        print(f"wrote {path}")
    if args.report:
        args.report.write_text(json.dumps(report, indent=1))
    if args.plot:
        plot_fit(fitted, points, fitted.name, args.plot)
        print(f"wrote {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
