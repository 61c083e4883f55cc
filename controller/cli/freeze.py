"""`specctl freeze`: write the learned table to a policy file, or check one.

The frozen table is the model's proposal without exploration (a frozen policy never probes),
with its provenance: the store, group, targets, the time span and amount of evidence, the
model version, and the predicted gain over three static policies on the observed load mix
(full depth, drafting off, the best single depth).
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from controller.cli import app
from controller.cli.args import API_KEY_ENV, API_KEY_HELP, fail, output_file_problem
from controller.cli.curves import CONFIG_HELP, STORE_HELP, locate_store
from sglang_hooks.contract import PolicyTable

if TYPE_CHECKING:
    from rich.console import Console

    from controller.cli.learned import GroupModel
    from controller.daemon.policy_file import PolicyFile


def predicted_by_policy(model: GroupModel, table: PolicyTable) -> dict[str, float]:
    """Decode tok/s on the observed load mix (iteration-weighted buckets) for each policy."""
    import numpy as np

    hist = model.batch_histogram()
    reps = model.bucket_batches()
    buckets = [b for b in hist if b in reps]
    curves = model.learner.curves(np.asarray([reps[b] for b in buckets], float))
    weights = np.asarray([hist[b] for b in buckets])
    weights = weights / weights.sum()

    def mix(depth_of: dict[int, int]) -> float:
        tok = [curves[depth_of[b]][i].tok_per_s for i, b in enumerate(buckets)]
        return float(np.dot(weights, tok))

    depths = sorted(curves)
    single = {d: mix({b: d for b in buckets}) for d in depths}
    out = {"table": mix({b: table.depth_for(round(reps[b])) for b in buckets})}
    out["full_depth"] = single[max(depths)]
    if 0 in single:
        out["off"] = single[0]
    best = max(single, key=lambda d: single[d])
    out["best_single_depth"] = single[best]
    out[f"depth_{best}"] = single[best]
    return {k: round(v, 2) for k, v in out.items() if np.isfinite(v)}


def build_policy(model: GroupModel) -> PolicyFile:
    from controller.daemon.handback import without_probes
    from controller.daemon.policy_file import PolicyFile, Provenance, TimeWindow

    proposal = model.propose()
    version = (model.live_table.version + 1) if model.live_table else proposal.table.version
    table = without_probes(proposal.table, version)
    predicted = predicted_by_policy(model, table)
    gains = {
        k: round(predicted["table"] / v - 1.0, 4)
        for k, v in predicted.items()
        if k in ("full_depth", "off", "best_single_depth") and v > 0 and "table" in predicted
    }
    start, end = model.window
    provenance = Provenance(
        created_at=dt.datetime.now(dt.UTC).replace(microsecond=0),
        created_by="specctl freeze",
        store=str(model.store),
        group=model.group,
        targets=model.targets,
        window=TimeWindow(start=_time(start), end=_time(end)),
        samples=len(model.samples),
        iterations=round(sum(s.iterations for s in model.samples), 1),
        model_version=model.learner.version,
        captured_depths=model.learner.captured,
        batch_histogram={b: round(w, 4) for b, w in model.batch_histogram().items()},
        predicted_tok_per_s=predicted,
        predicted_gain=gains,
        fingerprint=table.fingerprint,
    )
    return PolicyFile(table=table, provenance=provenance)


def _version(table: PolicyTable) -> str:
    # Version numbers can repeat across stores and runs; the fingerprint names the tiers.
    return f"version {table.version}, fingerprint #{table.fingerprint}"


def _time(t: float) -> dt.datetime:
    # A simulator clock starts near 0; it still reads as a span, dated from the epoch.
    return dt.datetime.fromtimestamp(t, dt.UTC).replace(microsecond=0)


def check(path: Path, url: str | None, console: Console, api_key: str | None = None) -> None:
    from controller.bench.server_client import ServerClient
    from controller.daemon.policy_file import load
    from sglang_hooks.draft_shape import DraftShape

    captured: tuple[int, ...] | None = None
    trees: tuple[DraftShape, ...] = ()
    if url is not None:
        with ServerClient(url, api_key=api_key) as server:
            state = server.state()
            captured, trees = state.captured_depths, state.captured_trees
        if state.shapes is not None and 0 not in captured:
            _check_no_off(path)
    policy = load(path, captured_depths=captured, captured_trees=trees)
    console.print(f"[green]ok[/green] {path}: {policy.table.describe()} ({_version(policy.table)})")
    if captured is not None:
        shapes = f"captured: {list(captured)}" + (
            f", trees {[t.label for t in trees]}" if trees else ""
        )
        console.print(f"every depth is captured by {url} ({shapes})")
    prov = policy.provenance
    if prov.group or prov.samples is not None:
        console.print(
            f"from group {prov.group or '?'}, {prov.samples or 0} samples, "
            f"model {prov.model_version or '?'}"
        )


def _check_no_off(path: Path) -> None:
    """A shape server captures off only when started with plain: say so, not "restart it
    capturing depth 0", which `specctl serve --shapes` has no option for."""
    from controller.daemon.policy_file import PolicyFileError, load
    from sglang_hooks.contract import off_field

    where = off_field(load(path).table.tiers)
    if where is not None:
        raise PolicyFileError(path, f"table.{where}", "off (depth 0) is captured on a shape "
                              "server only when plain is listed; restart it with plain added "
                              "to `specctl serve --shapes`")


@app.command("freeze")
def freeze(
    store: Annotated[Path | None, typer.Option(help=STORE_HELP)] = None,
    config: Annotated[Path | None, typer.Option(help=CONFIG_HELP)] = None,
    group: Annotated[str | None, typer.Option(help="Target group (default: the only one).")] = None,
    out: Annotated[
        Path, typer.Option(help="Policy file to write (its folder must exist).")
    ] = Path("policy.yaml"),
    check_file: Annotated[
        Path | None,
        typer.Option("--check", help="Validate this policy file instead of writing one."),
    ] = None,
    url: Annotated[
        str | None,
        typer.Option(help="With --check: also check every depth is captured by this server."),
    ] = None,
    api_key: Annotated[
        str | None, typer.Option(envvar=API_KEY_ENV, help="With --url: " + API_KEY_HELP)
    ] = None,
) -> None:
    """Write the learned table to a policy file, or check one.

    The plugin loads a policy file at server start-up (SPECCTL_POLICY_FILE=policy.yaml) and
    the daemon pushes it as-is in frozen mode; `table` is the only part either reads, the
    `provenance` says where it came from and what it is predicted to gain.

    \b
    Examples:
      specctl demo && specctl freeze --out policy.yaml
      specctl freeze --config controller.yaml --out policy.yaml
      specctl freeze --check policy.yaml
      specctl freeze --check policy.yaml --url http://127.0.0.1:30000
    """
    from controller.daemon.config import url_problem

    if url is not None and (problem := url_problem(url)) is not None:
        raise typer.BadParameter(problem, param_hint="--url")
    if check_file is None and (problem := output_file_problem(out, "--out")) is not None:
        raise fail(problem)
    from rich.console import Console

    from controller.bench.server_client import ServerError
    from controller.cli.learned import CurvesError, load_group_model
    from controller.daemon.policy_file import PolicyFileError, dump

    # soft_wrap: each message stays one line when the output is a file or a pipe.
    console = Console(soft_wrap=True)
    try:
        if check_file is not None:
            check(check_file, url, console, api_key)
            return
        path, why = locate_store(store, config)
        model = load_group_model(path, group)
        policy = build_policy(model)
        dump(policy, out)
    except (PolicyFileError, CurvesError, ServerError) as e:
        raise fail(str(e)) from None
    except OSError as e:
        raise fail(f"--out {out}: cannot write it ({e.strerror or e})") from None
    prov = policy.provenance
    if why is not None:
        console.print(f"store {path} ({why})", highlight=False)
    console.print(f"wrote {out}: [bold]{policy.table.describe()}[/bold] ({_version(policy.table)})")
    console.print(
        f"from {prov.samples} samples of group {prov.group} ({', '.join(prov.targets)}), "
        f"{prov.iterations:,.0f} decode iterations"
    )
    pred = prov.predicted_tok_per_s or {}
    for name, gain in (prov.predicted_gain or {}).items():
        console.print(
            f"  predicted {pred.get('table', 0):,.0f} tok/s vs {name} "
            f"{pred.get(name, 0):,.0f}: {gain:+.1%}"
        )
