"""The sweep: force each depth through the admin RPC, run every concurrency level, restore.

The server's table is read before anything is pushed and pushed back in a `finally`, so an
error, Ctrl-C (the event loop cancels the sweep) or SIGTERM (handled the same way by
`run_sweep`) leaves the server as it was. Between levels the table is read back: if another
controller (a running daemon) pushed meanwhile, the sweep stops instead of measuring the
wrong depth.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from controller.bench.loadgen import (
    LevelLoad,
    LiveCounters,
    StopRule,
    make_client,
    run_level,
    warm_up,
)
from controller.bench.metrics import (
    ITL_HISTOGRAM,
    TTFT_HISTOGRAM,
    Scrape,
    mean_between,
    total,
    work_between,
)
from controller.bench.prompts import Prompt
from controller.bench.server_client import ServerClient, ServerError, ServerState
from controller.bench.server_facts import server_facts
from sglang_hooks.contract import PolicyError, single_depth_table, validate_tiers

NO_SPEC = "no-spec"


def series_name(depth: int | None) -> str:
    return NO_SPEC if depth is None else f"d{depth}"


@dataclass(frozen=True)
class SweepPlan:
    url: str
    depths: tuple[int, ...]
    concurrencies: tuple[int, ...]
    stop: StopRule
    prompts: Sequence[Prompt]
    prompt_source: str
    admin_key: str | None = None
    no_spec_url: str | None = None
    model: str | None = None
    temperature: float = 0.0

    def levels(self) -> list[tuple[int | None, int]]:
        """(depth or None for the no-spec server, concurrency) in the order they run."""
        out: list[tuple[int | None, int]] = [
            (d, c) for d in self.depths for c in self.concurrencies
        ]
        if self.no_spec_url:
            out += [(None, c) for c in self.concurrencies]
        return out


@dataclass(frozen=True)
class LevelResult:
    series: str  # "d3", or "no-spec" for the second server
    depth: int | None
    concurrency: int
    requests: int  # completed requests
    errors: int
    elapsed_s: float
    output_tok_per_s: float
    ttft_p50_ms: float | None
    ttft_p90_ms: float | None
    tpot_p50_ms: float | None
    tpot_p90_ms: float | None
    mean_batch: float | None  # from the server's own counters, when it exports them
    accept_length: float | None
    client_cpu_share: float  # client CPU seconds per wall second (1.0 = one core busy)
    # The server ran clearly bigger batches than this level sent: someone else's traffic (or
    # streams left over from the level before) was decoding too, so the numbers are not this
    # level's alone.
    foreign_traffic: bool = False
    # What `specctl sim fit` replays: the decode step from the server's counters, and the
    # request shape as the server counted it (mean prompt tokens, mean output tokens).
    step_ms: float | None = None
    prompt_tokens: float | None = None
    output_tokens: float | None = None
    # The same level as the server itself timed it (SGLang's latency histograms, means):
    # no client or network time in them.
    server_ttft_ms: float | None = None
    server_itl_ms: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class SweepOutcome:
    plan: SweepPlan
    before: ServerState
    results: list[LevelResult] = field(default_factory=list)
    # What each server said about itself in /server_info (`server_facts`): "spec", "no_spec".
    servers: dict[str, dict[str, Any]] = field(default_factory=dict)
    pushed: bool = False  # whether the sweep changed the server's table at all
    restored: str | None = None  # the table pushed back at the end, described
    interrupted: str | None = None  # why the sweep stopped early, if it did


# A level's mean batch may exceed its concurrency by this much before it counts as foreign
# traffic (one stream finishing while the next starts can briefly overlap in a batch).
FOREIGN_BATCH_MARGIN = 0.5
FOREIGN_BATCH_SHARE = 0.1


def has_foreign_traffic(concurrency: int, mean_batch: float | None) -> bool:
    if mean_batch is None:
        return False
    return mean_batch > concurrency + max(FOREIGN_BATCH_MARGIN, FOREIGN_BATCH_SHARE * concurrency)


def _percentile_ms(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return 1000.0 * values[0]
    return 1000.0 * statistics.quantiles(values, n=100, method="inclusive")[round(q) - 1]


def summarize(
    depth: int | None, load: LevelLoad, before: Scrape | None, after: Scrape | None
) -> LevelResult:
    done = load.completed
    ttft = [r.ttft_s for r in done if r.ttft_s is not None]
    tpot = [t for r in done if (t := r.tpot_s) is not None]
    mean_batch = accept = step = ttft_s = itl_s = None
    if before is not None and after is not None:
        ttft_s = mean_between(before, after, TTFT_HISTOGRAM)
        itl_s = mean_between(before, after, ITL_HISTOGRAM)
        work = work_between(before, after)
        # Only the forced depth should have run; exploration off, so take every depth's work.
        w = work.get(depth) if depth is not None else total(work.values())
        if w is not None:
            mean_batch, accept, step = w.mean_batch, w.accept_length, w.step_ms
    prompts = [r.prompt_tokens for r in load.requests if r.prompt_tokens is not None]
    return LevelResult(
        series=series_name(depth),
        depth=depth,
        concurrency=load.concurrency,
        requests=len(done),
        errors=len(load.errors),
        elapsed_s=round(load.elapsed_s, 3),
        output_tok_per_s=load.output_tok_per_s,
        ttft_p50_ms=_percentile_ms(ttft, 50),
        ttft_p90_ms=_percentile_ms(ttft, 90),
        tpot_p50_ms=_percentile_ms(tpot, 50),
        tpot_p90_ms=_percentile_ms(tpot, 90),
        mean_batch=mean_batch,
        accept_length=accept,
        client_cpu_share=load.client_cpu_s / load.elapsed_s if load.elapsed_s > 0 else math.nan,
        foreign_traffic=has_foreign_traffic(load.concurrency, mean_batch),
        step_ms=step,
        prompt_tokens=statistics.fmean(prompts) if prompts else None,
        output_tokens=statistics.fmean(r.output_tokens for r in done) if done else None,
        server_ttft_ms=None if ttft_s is None else 1000.0 * ttft_s,
        server_itl_ms=None if itl_s is None else 1000.0 * itl_s,
    )


class LevelObserver:
    """Hooks a progress display into the sweep (no-op by default)."""

    def sweep_started(self, outcome: SweepOutcome) -> None:
        """`outcome` fills in as levels finish; keep it to report a sweep cut short."""

    def level_started(self, series: str, concurrency: int, live: LiveCounters) -> None: ...

    def level_finished(self, result: LevelResult) -> None: ...

    def message(self, text: str) -> None: ...

    def warning(self, text: str) -> None:
        self.message(f"warning: {text}")


def check_depths(depths: Sequence[int], state: ServerState) -> None:
    """Fail before any load if a depth cannot be forced (the server would answer 400)."""
    for depth in depths:
        try:
            validate_tiers(single_depth_table(depth).tiers, state.captured_depths)
        except PolicyError as err:
            raise ServerError(f"--depths {depth}: {err.field}: {err.message}") from None


# How long a level waits for the server to stop decoding before it measures anyway.
IDLE_TIMEOUT_S = 30.0


async def wait_idle(
    server: ServerClient, timeout_s: float | None = None, quiet_s: float = 0.3
) -> bool:
    """Wait until the server stops decoding: a stream cut at a level's deadline may still run
    on a server that does not abort on disconnect, and would inflate the next level. Decoding
    is seen in the contract's iteration counters (SGLang's running-requests gauge is refreshed
    only every few dozen iterations, so it stays stale once the server is idle).

    False if the server was still decoding after `timeout_s` (traffic from someone else)."""
    deadline = time.monotonic() + (IDLE_TIMEOUT_S if timeout_s is None else timeout_s)
    last = _iterations(server)
    while last is not None:
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(quiet_s)  # an await, so Ctrl-C / SIGTERM cancel here at once
        now = _iterations(server)
        if now is None or now == last:
            return True
        last = now
    return True


async def _settle(server: ServerClient, url: str, observer: LevelObserver) -> None:
    if not await wait_idle(server):
        observer.warning(
            f"{url} kept decoding for {IDLE_TIMEOUT_S:g} s with no load from this "
            "sweep; another client is using it, so the next level measures its traffic too"
        )


def _iterations(server: ServerClient) -> float | None:
    scrape = _scrape_or_none(server)
    if scrape is None or not scrape.has_contract_counters():
        return None
    return sum(w.iterations for w in scrape.counters.values())


def _scrape_or_none(server: ServerClient) -> Scrape | None:
    try:
        return server.scrape()
    except ServerError:
        return None


async def _run_levels(
    outcome: SweepOutcome,
    server: ServerClient,
    observer: LevelObserver,
) -> None:
    plan = outcome.plan
    model = plan.model or server.model_id() or "default"
    base_version = outcome.before.version
    offset = 0
    for i, depth in enumerate(plan.depths):
        forced = single_depth_table(depth, version=base_version + 1 + i)
        outcome.pushed = True  # set first: a push that times out may still have landed
        server.push(forced)
        observer.message(f"forced {series_name(depth)} on {plan.url} (version {forced.version})")
        async with make_client(plan.url, max(plan.concurrencies)) as http:
            if i == 0:
                await warm_up(http, plan.prompts[-1], model, plan.temperature)
            for c in plan.concurrencies:
                live = LiveCounters()
                await _settle(server, plan.url, observer)
                observer.level_started(series_name(depth), c, live)
                scrape0 = _scrape_or_none(server)
                load = await run_level(
                    http, plan.prompts, c, plan.stop, model=model,
                    temperature=plan.temperature, prompt_offset=offset, live=live,
                )  # fmt: skip
                offset += live.started
                now = server.state()
                if now.version != forced.version:
                    raise ServerError(
                        f"the table on {plan.url} changed during the sweep (now version "
                        f"{now.version}, source {now.source!r}: {now.describe()}); stop other "
                        "controllers (e.g. the specctl daemon) before benchmarking"
                    )
                result = summarize(depth, load, scrape0, _scrape_or_none(server))
                outcome.results.append(result)
                observer.level_finished(result)
    if plan.no_spec_url:
        await _run_no_spec(outcome, observer, offset)


async def _run_no_spec(outcome: SweepOutcome, observer: LevelObserver, offset: int) -> None:
    plan = outcome.plan
    assert plan.no_spec_url is not None
    with ServerClient(plan.no_spec_url) as other:
        if not other.health():
            raise ServerError(f"{plan.no_spec_url}/health is not OK (--no-spec-url)")
        outcome.servers["no_spec"] = server_facts(other.server_info())
        model = plan.model or other.model_id() or "default"
        async with make_client(plan.no_spec_url, max(plan.concurrencies)) as http:
            await warm_up(http, plan.prompts[-1], model, plan.temperature)
            for c in plan.concurrencies:
                live = LiveCounters()
                await _settle(other, plan.no_spec_url, observer)
                observer.level_started(NO_SPEC, c, live)
                scrape0 = _scrape_or_none(other)
                load = await run_level(
                    http, plan.prompts, c, plan.stop, model=model,
                    temperature=plan.temperature, prompt_offset=offset, live=live,
                )  # fmt: skip
                offset += live.started
                result = summarize(None, load, scrape0, _scrape_or_none(other))
                outcome.results.append(result)
                observer.level_finished(result)


async def sweep(plan: SweepPlan, observer: LevelObserver | None = None) -> SweepOutcome:
    """Run the whole plan; the server's previous table is restored however this ends."""
    observer = observer or LevelObserver()
    with ServerClient(plan.url, plan.admin_key) as server:
        before = server.state()
        check_depths(plan.depths, before)
        outcome = SweepOutcome(plan=plan, before=before)
        outcome.servers["spec"] = server_facts(server.server_info())
        observer.sweep_started(outcome)
        try:
            await _run_levels(outcome, server, observer)
        except asyncio.CancelledError:
            outcome.interrupted = "interrupted"
            raise
        except Exception as err:
            outcome.interrupted = str(err)
            raise
        finally:
            _restore(server, before, outcome, observer)
    return outcome


def _restore(
    server: ServerClient, before: ServerState, outcome: SweepOutcome, observer: LevelObserver
) -> None:
    try:
        now = server.state()
        if now.version == before.version and now.table == before.table:
            outcome.pushed = False  # the push was refused (e.g. a bad key): nothing to undo
            outcome.restored = before.describe()
            return
        server.push(before.table)
    except ServerError as err:
        observer.message(f"could not restore the previous table: {err}")
        return
    outcome.restored = before.describe()
    observer.message(f"restored the previous table on {server.url}: {before.describe()}")


def run_sweep(plan: SweepPlan, observer: LevelObserver | None = None) -> SweepOutcome:
    """Run `sweep` in a fresh event loop; SIGTERM cancels it like Ctrl-C does."""

    async def main() -> SweepOutcome:
        task = asyncio.current_task()
        loop = asyncio.get_running_loop()
        if task is not None:
            # Not available off the main thread; Ctrl-C still works there.
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(signal.SIGTERM, task.cancel)
        try:
            return await sweep(plan, observer)
        finally:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(signal.SIGTERM)

    return asyncio.run(main())
