"""Drivers of the `Controller`: real time (apscheduler) or a simulated, accelerated clock.

Wall clock: a BackgroundScheduler runs one scrape job and one decide job per target and one fit
job per group, each `coalesce=True, max_instances=1` on a thread pool wide enough for every job,
so a target whose calls hang until their timeout only delays its own jobs. A scrape that shows a
change of load or acceptance refits and decides at once, in the scrape job (`Controller.react`).
Before the jobs start, every server is read once (`Controller.start`: what was found there);
when they have stopped, however the run ends, every server is handed back
(`Controller.hand_back`, the config's `on_exit`).

Simulated clock: in-process `SimulatedServer`s advance by one scrape interval per tick and the
controller is called directly; `speedup` paces ticks against the wall clock (None: as fast as
the CPU allows, for evaluations). An in-process simulator ends with the daemon: there is
nothing to hand back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler

from controller.daemon.config import ControllerConfig, TargetConfig
from controller.daemon.loop import Controller, PushEvent
from controller.daemon.transport import HttpTransport, InProcessTransport, ServerTransport

log = logging.getLogger("specctl.daemon")


class ClockedServer(Protocol):
    """What the simulated-clock driver needs from a simulated server."""

    @property
    def now(self) -> float: ...

    def advance(self, seconds: float) -> None: ...

    def metrics_text(self) -> str: ...

    def server_info(self) -> dict[str, Any]: ...

    def set_internal_state(
        self, body: dict[str, Any], authorization: str | None
    ) -> tuple[int, Any]: ...


def build_simulated_server(tc: TargetConfig) -> ClockedServer:
    from sims.profile import load_profile
    from sims.server import SimulatedServer
    from sims.workload import load_scenario

    assert tc.simulated is not None
    profile = load_profile(tc.simulated.profile)
    scenario = load_scenario(tc.simulated.scenario)
    server: ClockedServer = SimulatedServer(
        profile,
        scenario.workload,
        seed=tc.simulated.seed,
        admin_key=tc.resolved_admin_key(),
        api_key=tc.resolved_api_key(),
    )
    return server


def build_transports(
    config: ControllerConfig,
) -> tuple[dict[str, ServerTransport], dict[str, ClockedServer]]:
    transports: dict[str, ServerTransport] = {}
    sims: dict[str, ClockedServer] = {}
    for tc in config.targets:
        if tc.simulated is not None:
            sims[tc.name] = build_simulated_server(tc)
            transports[tc.name] = InProcessTransport(sims[tc.name])
        else:
            assert tc.url is not None
            transports[tc.name] = HttpTransport(tc.url, tc.timeout_s, tc.resolved_api_key())
    return transports, sims


class ResumedClock:
    """A simulated server whose clock reads `offset` seconds ahead of its own.

    A fresh simulated server starts at t=0; a store filled by an earlier run already holds
    samples and pushes up to some later t. Resuming after them keeps time monotonic in the
    store, so the earlier run's records stay in the past (a pending push check from it is due
    at once) instead of lying in this run's future.
    """

    def __init__(self, inner: ClockedServer, offset: float) -> None:
        self.inner = inner
        self.offset = offset

    @property
    def now(self) -> float:
        return self.inner.now + self.offset

    def advance(self, seconds: float) -> None:
        self.inner.advance(seconds)

    def metrics_text(self) -> str:
        return self.inner.metrics_text()

    def server_info(self) -> dict[str, Any]:
        return self.inner.server_info()

    def set_internal_state(
        self, body: dict[str, Any], authorization: str | None
    ) -> tuple[int, Any]:
        return self.inner.set_internal_state(body, authorization)


def resume_after_store(
    controller: Controller, sims: dict[str, ClockedServer]
) -> tuple[dict[str, ClockedServer], float]:
    """Shift simulated clocks past the store's last record; returns (servers, offset)."""
    store = controller.store
    times = [store.last_sample_time(target=name) for name in controller.targets]
    times += [p.t for p in store.pushes()[-1:]]
    last = max((t for t in times if t is not None), default=None)
    if last is None:
        return sims, 0.0
    offset = last + controller.config.schedule.scrape_interval_s
    return {name: ResumedClock(s, offset) for name, s in sims.items()}, offset


@dataclass
class TickInfo:
    now: float
    events: list[PushEvent]


def run_simulated(
    controller: Controller,
    servers: dict[str, ClockedServer],
    *,
    until_s: float,
    speedup: float | None,
    on_tick: Callable[[TickInfo], None] | None = None,
    stop: threading.Event | None = None,
) -> float:
    """Advance every simulator tick by tick to `until_s`; returns the simulated time reached."""
    sched = controller.config.schedule
    tick = sched.scrape_interval_s
    fit_every = max(1, round(sched.fit_interval_s / tick))
    decide_every = max(1, round(sched.decide_interval_s / tick))
    start_wall = time.monotonic()
    start_sim = min(s.now for s in servers.values())
    now = start_sim
    i = 0
    while now < until_s and not (stop is not None and stop.is_set()):
        step = min(tick, until_s - now)
        for server in servers.values():
            server.advance(step)
        now += step
        i += 1
        events = controller.step(now, fit_due=i % fit_every == 0, decide_due=i % decide_every == 0)
        if on_tick is not None:
            on_tick(TickInfo(now, events))
        if speedup is not None:
            ahead = (now - start_sim) / speedup - (time.monotonic() - start_wall)
            if ahead > 0:
                time.sleep(ahead)
    return now


def run_wall(
    controller: Controller,
    *,
    stop: threading.Event,
    clock: Callable[[], float] = time.time,
    progress: Callable[[float], None] | None = None,
) -> None:
    """Run the jobs on real time until `stop` is set (or schedule.duration_s passes)."""
    sched = controller.config.schedule
    jobs = 2 * len(controller.targets) + len(controller.groups) + 1
    scheduler = BackgroundScheduler(
        executors={"default": ThreadPoolExecutor(max_workers=jobs + 1)},
        job_defaults={"coalesce": True, "max_instances": 1},
    )

    def guarded(fn: Callable[[str, float], Any], key: str) -> Callable[[], None]:
        def job() -> None:
            try:
                fn(key, clock())
            except Exception:  # one failing job must not take the scheduler down
                log.exception("job %s(%s) failed", fn.__name__, key)

        return job

    def scrape_and_react(name: str, now: float) -> None:
        # A change of load or acceptance is decided on right after the scrape that shows it,
        # on this target's own thread (controller/daemon/reaction.py).
        controller.react(name, now, controller.scrape(name, now))

    for name in controller.targets:
        scheduler.add_job(
            guarded(scrape_and_react, name),
            "interval",
            seconds=sched.scrape_interval_s,
            id=f"scrape:{name}",
            misfire_grace_time=max(1, int(sched.scrape_interval_s)),
            next_run_time=_now_dt(),  # first scrape at once: the baseline is in place sooner
        )
        scheduler.add_job(
            guarded(controller.decide, name),
            "interval",
            seconds=sched.decide_interval_s,
            id=f"decide:{name}",
            misfire_grace_time=max(1, int(sched.decide_interval_s)),
        )
    for group in controller.groups:
        scheduler.add_job(
            guarded(controller.fit, group),
            "interval",
            seconds=sched.fit_interval_s,
            id=f"fit:{group}",
            misfire_grace_time=max(1, int(sched.fit_interval_s)),
        )
    if progress is not None:
        scheduler.add_job(
            guarded(lambda _key, now: progress(now), "progress"),
            "interval",
            seconds=max(60.0, 4 * sched.decide_interval_s),
            id="progress",
        )
    deadline = None if sched.duration_s is None else time.monotonic() + sched.duration_s
    try:
        controller.start(clock())
        scheduler.start()
        while not stop.is_set():
            if deadline is not None and time.monotonic() >= deadline:
                break
            stop.wait(0.2)
    finally:
        if scheduler.running:
            scheduler.shutdown(wait=True)
        # After the jobs: nothing pushes between the hand-back and the exit.
        controller.hand_back(clock())


def _now_dt() -> Any:
    import datetime as dt

    return dt.datetime.now(dt.UTC)
