"""The work behind `specctl demo`: the daemon learning a simulated Kimi-K2.5 server.

A simulated server (profile kimi-k25-8x-rtxpro6000-pcie, the ramp scenario: 1 -> 250 -> 1
clients over 30 simulated minutes) runs in-process; the real daemon scrapes it, stores samples
in SQLite, fits the learner and pushes tables through the admin RPC payloads, on an accelerated
clock. At the end: the learned tok/s curves and the table it would freeze.
"""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.logging import RichHandler
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from controller.cli.tables import print_table
from controller.daemon.config import parse_config
from controller.daemon.loop import Controller
from controller.daemon.own_metrics import DaemonMetrics
from controller.daemon.policy_file import PolicyFile, Provenance, dump, dumps
from controller.daemon.runner import TickInfo, build_transports, run_simulated
from controller.daemon.store import Store
from sglang_hooks.contract import PolicyTable, Tier

DEMO_PROFILE = "kimi-k25-8x-rtxpro6000-pcie"
CURVE_BATCHES = (1, 2, 4, 8, 16, 24, 32, 48)


def demo_config(store_path: Path, profile: str, scenario: str, seed: int) -> Any:
    return parse_config(
        {
            "targets": [
                {
                    "name": "sim-kimi",
                    "group": profile,
                    "simulated": {"profile": profile, "scenario": scenario, "seed": seed},
                }
            ],
            "schedule": {"clock": "simulated", "scrape_interval_s": 10.0},
            "store": {"path": str(store_path)},
            "metrics": {"enabled": False},
            "seed": seed,
        },
        "demo config",
    )


def frozen_table(table: PolicyTable) -> PolicyTable:
    """The table without exploration (a frozen deployment never probes), one tier per run of
    equal depth."""
    tiers: list[Tier] = []
    for t in table.tiers:
        if not tiers or tiers[-1].depth != t.depth:
            tiers.append(Tier(t.min_batch, t.depth, t.hysteresis if tiers else 0))
    return PolicyTable.build(tiers, version=table.version)


def _remove_database(path: Path) -> None:
    """A SQLite file and its WAL companions (a stale -wal would be replayed into a new file)."""
    for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        p.unlink(missing_ok=True)


def _scratch_store(store_path: Path) -> tuple[Path, str | None]:
    """Where the run writes its store before it replaces `store_path`; a temporary folder
    (and why) when `store_path`'s folder cannot be written."""
    try:
        store_path.parent.mkdir(parents=True, exist_ok=True)
        scratch = store_path.with_name(f".{store_path.name}.{os.getpid()}.partial")
        _remove_database(scratch)
        scratch.touch()
        return scratch, None
    except OSError as err:
        folder = Path(tempfile.mkdtemp(prefix="specctl-demo-"))
        why = (
            f"cannot write {store_path.parent} ({err.strerror or err}); the store is kept in "
            f"{folder} instead, pass it to `specctl curves --store`"
        )
        return folder / store_path.name, why


def run_demo(
    scenario: str, duration_s: float, seed: int, freeze: Path | None, store_path: Path
) -> Path:
    """Run the demo; returns where its store is. `store_path` (the previous demo's store) is
    replaced only when the run completes."""
    console = Console(soft_wrap=True)
    handler = RichHandler(console=console, show_path=False, show_level=False, markup=False)
    logger = logging.getLogger("specctl")
    logger.handlers[:] = [handler]
    logger.setLevel(logging.INFO)
    logger.propagate = False
    scratch, moved = _scratch_store(store_path)
    if moved is not None:
        console.print(f"[yellow]note:[/yellow] {moved}")
        store_path = scratch
    cfg = demo_config(scratch, DEMO_PROFILE, scenario, seed)
    transports, sims = build_transports(cfg)
    store = Store(cfg.store.resolved_path())
    controller = Controller(cfg, store, transports, metrics=DaemonMetrics())
    server: Any = sims["sim-kimi"]
    try:
        console.print(
            f"[bold]specctl demo[/bold]: simulated {DEMO_PROFILE}, scenario {scenario} "
            f"({duration_s / 60:.0f} simulated minutes); the daemon scrapes every "
            f"{cfg.schedule.scrape_interval_s:.0f} s, fits every {cfg.schedule.fit_interval_s:.0f}"
            f" s and pushes at most every {cfg.guardrails.min_dwell_s:.0f} s"
        )
        with Progress(
            TextColumn("[progress.description]{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            console=console,
        ) as progress:
            task = progress.add_task("simulated time", total=duration_s, info="")

            def on_tick(info: TickInfo) -> None:
                st = controller.targets["sim-kimi"]
                live = st.live.table.describe() if st.live and st.live.table else "-"
                running = int(server.engine.gauges.num_running_reqs)
                progress.update(
                    task,
                    completed=info.now,
                    info=f"t={info.now:5.0f}s running={running:3d} table: {live}",
                )

            run_simulated(controller, sims, until_s=duration_s, speedup=None, on_tick=on_tick)
        _summary(console, controller, server, freeze, scenario)
    except BaseException:
        controller.close()
        store.close()
        if scratch != store_path:
            _remove_database(scratch)
        raise
    controller.close()
    store.close()
    if scratch != store_path:
        _remove_database(store_path)
        os.replace(scratch, store_path)
    console.print(
        f"\nsamples stored in {store_path}: `specctl curves` shows what was learned, "
        "`specctl freeze` writes the table down"
    )
    return store_path


def _summary(
    console: Console, controller: Controller, server: Any, freeze: Path | None, scenario: str
) -> None:
    group = controller.groups[DEMO_PROFILE]
    learner: Any = group.learner
    stats = server.stats()
    console.print(
        f"\n{controller.store.count_samples()} samples stored, "
        f"{len(controller.store.pushes())} pushes, {controller.store.count_rollbacks()} rollbacks; "
        f"server output {stats.tokens_generated / max(stats.now, 1e-9):.1f} tok/s over the run"
    )
    if learner is None:
        console.print("[red]the learner never started (no /server_info answer)[/red]")
        return
    curves = learner.curves(np.asarray(CURVE_BATCHES, dtype=float))
    t = Table(title="learned decode tok/s per depth (90% band)", header_style="bold")
    t.add_column("batch", justify="right")
    for d in sorted(curves):
        t.add_column(f"d{d}" if d else "off (d0)", justify="right")
    t.add_column("best", justify="right")
    for i, b in enumerate(CURVE_BATCHES):
        row = [str(b)]
        for d in sorted(curves):
            p = curves[d][i]
            band = (p.hi - p.lo) / 2
            row.append("-" if not np.isfinite(p.tok_per_s) else f"{p.tok_per_s:.0f} ±{band:.0f}")
        row.append(f"d{learner.best_depth(b)}")
        t.add_row(*row)
    print_table(console, t)
    st = controller.targets["sim-kimi"]
    now = float(server.now)
    hist = controller.batch_histogram(st, now)
    live = st.live.table if st.live else None
    proposal = learner.propose(now, live, hist or None)
    table = frozen_table(proposal.table)
    provenance = Provenance.model_validate(
        dict(
            created_by="specctl demo",
            group=DEMO_PROFILE,
            targets=["sim-kimi"],
            samples=controller.store.count_samples(),
            model_version=learner.version,
            captured_depths=list(group.captured),
            predicted_tok_per_s={
                str(k): round(v, 1) for k, v in proposal.predicted_tok_per_s.items()
            },
            scenario=scenario,
        )
    )
    policy = PolicyFile(table=table, provenance=provenance)
    console.print(f"\n[bold]table it would freeze:[/bold] {table.describe()}")
    console.print(dumps(policy), markup=False, highlight=False, soft_wrap=True)
    if freeze is not None:
        path = dump(policy, freeze)
        console.print(
            f"written to {path}; use it with `frozen_policy: {path}` in controller.yaml",
            highlight=False,
        )
