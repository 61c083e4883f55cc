"""The work behind `specctl daemon`: logging on the controller's clock, then the loop until
interrupted (or `schedule.duration_s`)."""

from __future__ import annotations

import contextlib
import logging
import math
import signal
import sqlite3
import sys
import threading
import time
from collections.abc import Callable

from controller.cli.args import fail
from controller.daemon.bench_seed import BenchSeedError, read_bench
from controller.daemon.config import ConfigError, ControllerConfig
from controller.daemon.frozen import FrozenPolicyError
from controller.daemon.loop import Controller, TargetState
from controller.daemon.model import validate_learner_overrides
from controller.daemon.own_metrics import DaemonMetrics
from controller.daemon.runner import (
    ClockedServer,
    TickInfo,
    build_transports,
    resume_after_store,
    run_simulated,
    run_wall,
)
from controller.daemon.store import Store, StoreError

log = logging.getLogger("specctl.daemon")


class ClockFormatter(logging.Formatter):
    """Log lines stamped with the controller's clock (simulated time in simulated mode)."""

    def __init__(self, clock: Callable[[], str]) -> None:
        super().__init__("%(message)s")
        self.clock = clock

    def format(self, record: logging.LogRecord) -> str:
        level = "" if record.levelno == logging.INFO else f"{record.levelname.lower()}: "
        return f"[{self.clock()}] {level}{super().format(record)}"


def setup_logging(clock: Callable[[], str], verbose: bool = False) -> logging.Handler:
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(ClockFormatter(clock))
    logger = logging.getLogger("specctl")
    for old in list(logger.handlers):
        logger.removeHandler(old)
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)
    logger.propagate = False
    return handler


def open_controller(
    cfg: ControllerConfig,
) -> tuple[Controller, dict[str, ClockedServer], DaemonMetrics]:
    """Build transports, store, metrics and controller; raise typer.Exit on bad input."""
    problem = validate_learner_overrides(dict(cfg.learner))
    if problem:
        raise fail(problem)
    try:
        for target in cfg.targets:  # a missing *_env variable, named before any file is made
            target.resolved_admin_key()
            target.resolved_api_key()
            if target.seed_bench is not None:
                read_bench(target.seed_bench)
        transports, sims = build_transports(cfg)
        store = Store(cfg.store.resolved_path())
        metrics = DaemonMetrics()
        controller = Controller(cfg, store, transports, metrics=metrics)
    except BenchSeedError as err:
        raise fail(f"targets: {err}") from None
    except (ConfigError, StoreError, FrozenPolicyError, ValueError) as err:
        raise fail(str(err)) from None
    except (OSError, sqlite3.Error) as err:
        # An unusable store.path (a file where a folder should be, no permission, read-only).
        detail = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise fail(
            f"store.path {cfg.store.resolved_path()}: cannot open the store ({detail}); "
            "set store.path to a writable location"
        ) from None
    return controller, sims, metrics


def run_daemon(
    cfg: ControllerConfig, stop: threading.Event | None = None, verbose: bool = False
) -> Controller:
    stop = stop or threading.Event()
    sim_now = [0.0]
    if cfg.schedule.clock == "simulated":
        setup_logging(lambda: f"sim {sim_now[0]:7.0f}s", verbose)
    else:
        setup_logging(lambda: time.strftime("%H:%M:%S"), verbose)
    controller, sims, metrics = open_controller(cfg)
    if cfg.metrics.enabled:
        try:
            port = metrics.serve(cfg.metrics.host, cfg.metrics.port)
        except OSError as err:
            raise fail(
                f"metrics.port: cannot listen on {cfg.metrics.host}:{cfg.metrics.port} ({err}); "
                "pick another port or set metrics.enabled: false"
            ) from None
        log.info("daemon metrics on http://%s:%d/metrics", cfg.metrics.host, port)
    names = ", ".join(f"{t.name} ({t.group})" for t in cfg.targets)
    mode = "frozen policy " + str(cfg.frozen_policy) if cfg.frozen_policy else "learning"
    log.info(
        "specctl daemon: %s; targets: %s; store %s",
        mode,
        names,
        cfg.store.resolved_path(),
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        # Outside the main thread (tests) this raises: the caller sets `stop` itself.
        with contextlib.suppress(ValueError):
            signal.signal(sig, lambda *_: stop.set())
    try:
        progress = _Progress(controller, every_s=max(60.0, cfg.schedule.decide_interval_s * 4))
        seed_now = 0.0 if cfg.schedule.clock == "simulated" else time.time()
        try:
            controller.seed_from_benches(seed_now)
        except BenchSeedError as err:
            raise fail(f"targets: {err}") from None
        if cfg.schedule.clock == "simulated":
            sims, offset = resume_after_store(controller, sims)
            if offset:
                log.info("simulated clock resumes at t=%.0f s, after the stored records", offset)
            duration = math.inf if cfg.schedule.duration_s is None else cfg.schedule.duration_s
            until = offset + duration

            def on_tick(info: TickInfo) -> None:
                sim_now[0] = info.now
                progress(info.now)

            run_simulated(
                controller,
                sims,
                until_s=until,
                speedup=cfg.schedule.speedup,
                on_tick=on_tick,
                stop=stop,
            )
        else:
            run_wall(controller, stop=stop, progress=progress)
    finally:
        controller.close()
        log.info(
            "stopped: %d samples stored, %d pushes",
            controller.store.count_samples(),
            len(controller.store.pushes()),
        )
    return controller


class _Progress:
    """One progress line per `every_s` of clock time: samples, fits, the live tables."""

    def __init__(self, controller: Controller, every_s: float) -> None:
        self.controller = controller
        self.every_s = every_s
        self.next_at = every_s

    def __call__(self, now: float) -> None:
        if now < self.next_at:
            return
        self.next_at = now + self.every_s
        c = self.controller
        parts = []
        for name, st in c.targets.items():
            parts.append(f"{name}: {_table_status(st)}")
        log.info("progress: %d samples stored; %s", c.store.count_samples(), "; ".join(parts))


def _table_status(st: TargetState) -> str:
    """What the target runs, as far as the daemon knows between two reads of /server_info."""
    if st.live is not None:
        if st.live.table is None:
            return "SGLang's own choice"
        return f"{st.live.table.label()} {st.live.table.describe()}"
    if st.pending is not None:
        return f"{st.pending.new.label()} {st.pending.new.describe()} (pushed, under check)"
    return "not read yet"
