"""The plugin's per-scheduler-process state: live table, depth choice, counts, reporting.

Version-neutral: the hook functions (hooks.py) translate SGLang's objects into the plain
calls below, so this module is tested without SGLang and the adapters stay small.

Thread model: everything here runs on the scheduler thread, between or inside iterations;
no locks are needed. Every TP rank of a replica holds its own copy and sees the same calls in
the same order (same batches, same admin requests at the same step), and exploration draws
come from an RNG seeded by the table's version, so all ranks pick the same depth.
"""

from __future__ import annotations

import logging
import random
import time
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

from sglang_hooks.contract import (
    PolicyError,
    PolicyTable,
    TierSelector,
    decode_table,
    has_policy_keys,
    server_state,
)
from sglang_hooks.counters import DepthCounters
from sglang_hooks.gpu_timer import HostIntervalTimer, LaunchTimer

logger = logging.getLogger("specctl")

SOURCE_NONE, SOURCE_STARTUP, SOURCE_PUSH = "none", "startup", "push"
EXPORT_INTERVAL_S = 1.0
_MAX_PARKED = 256


def exploration_rng(version: int, seed: int = 0) -> random.Random:
    """Same seed on every TP rank, so ranks draw the same exploration depths."""
    return random.Random((seed << 32) ^ version)


class SchedulerRuntime:
    """State of one scheduler process. `active` once the adaptive controller is built."""

    def __init__(self, timer: LaunchTimer | None = None, seed: int = 0) -> None:
        self.active = False
        self.inactive_reason: str | None = "the adaptive speculative controller has not started"
        self.captured_depths: frozenset[int] = frozenset()
        self.selector: TierSelector | None = None
        self.source = SOURCE_NONE
        self.last_rejection: str | None = None
        self.applied_iteration: int | None = None
        self.iteration = 0  # decode launches seen by this process
        self.seed = seed
        self.timer: LaunchTimer = timer or HostIntervalTimer()
        self.counters = DepthCounters()
        self.unattributed_results = 0
        self.parked: deque[tuple[Any, int, int, int, bool]] = deque()
        self.exporter: Any = None  # set on the metrics rank (exporter.PrometheusExporter)
        self._next_export = 0.0
        self._export_failed = False
        # Set by the depth choice inside a launch, read by the launch hook right after.
        self.launched = False
        self.launch_explore = False

    # ------------------------------------------------------------------ activation

    def activate(self, captured_depths: Iterable[int], startup: PolicyTable | None) -> None:
        self.captured_depths = frozenset(captured_depths)
        self.active = True
        self.inactive_reason = None
        if startup is not None:
            self._install(startup, SOURCE_STARTUP)
        self.flush()

    def deactivate(self, reason: str) -> None:
        self.active = False
        self.inactive_reason = reason
        self.selector = None
        self.source = SOURCE_NONE

    # ------------------------------------------------------------------ admin RPC

    def apply_request(self, server_args: Mapping[str, Any]) -> PolicyTable | None:
        """Validate the specctl keys of a set_internal_state request. Raises PolicyError.

        Returns the decoded table (None = release control); `commit` installs it.
        """
        if not has_policy_keys(server_args):
            raise PolicyError("server_args", "carries no specctl_* keys")
        if not self.active:
            raise PolicyError("specctl", f"the plugin is inactive on this server: "
                              f"{self.inactive_reason}")
        return decode_table(server_args, captured_depths=self.captured_depths)

    def reject(self, err: PolicyError) -> None:
        self.last_rejection = f"{err.field}: {err.message}"
        logger.warning("specctl: table push refused: %s", self.last_rejection)

    def commit(self, table: PolicyTable | None) -> None:
        if table is None:
            self.selector = None
            self.source = SOURCE_NONE
            self.applied_iteration = self.iteration
            logger.info("specctl: control released to SGLang's adaptive choice")
        else:
            self._install(table, SOURCE_PUSH)
        self.last_rejection = None
        self.flush()

    def _install(self, table: PolicyTable, source: str) -> None:
        selector = self.selector
        if selector is not None and selector.table.tiers == table.tiers:
            # Same tiers, new version (a daemon re-pushing what runs): keep the hysteresis
            # tier and the exploration draws going; every rank does the same, so they agree.
            selector.table = table
        else:
            self.selector = TierSelector(table, rng=exploration_rng(table.version, self.seed))
        self.source = source
        self.applied_iteration = self.iteration
        logger.info("specctl: table v%d (%s) applied: %s", table.version, source,
                    table.describe())

    @property
    def table(self) -> PolicyTable | None:
        return None if self.selector is None else self.selector.table

    def report(self) -> dict[str, Any]:
        state = server_state(
            self.table,
            self.captured_depths,
            source=self.source,
            last_rejection=self.last_rejection,
            applied_iteration=self.applied_iteration,
        )
        # Extra fields (the contract's readers ignore unknown keys).
        state["active"] = self.active
        state["inactive_reason"] = self.inactive_reason
        state["iteration"] = self.iteration
        state["unattributed_results"] = self.unattributed_results
        return state

    # ------------------------------------------------------------------ hot path

    def choose(self, batch_size: int) -> int | None:
        """Depth for this launch, or None to let SGLang's own choice stand."""
        self.iteration += 1
        self.launched = True
        selector = self.selector
        if selector is None:
            self.launch_explore = False
            return None
        depth, self.launch_explore = selector.select(batch_size)
        return depth

    def record_result(
        self, depth: int, batch_size: int, tokens: int, launch: Any, now: float | None = None
    ) -> None:
        """Count one processed decode result. `launch` is what the launch hook attached."""
        if self.parked:
            self._drain_parked()
        if launch is None:
            self.unattributed_results += 1
        else:
            explore, token = launch
            seconds = self.timer.seconds(token)
            if seconds is None:
                if len(self.parked) < _MAX_PARKED:
                    self.parked.append((token, depth, batch_size, tokens, explore))
                else:
                    self.unattributed_results += 1
            else:
                self.counters.record(depth, batch_size, tokens, seconds, explore)
        if self.exporter is not None:
            now = time.monotonic() if now is None else now
            if now >= self._next_export:
                self._next_export = now + EXPORT_INTERVAL_S
                self.flush()

    def _drain_parked(self) -> None:
        while self.parked:
            token, depth, batch_size, tokens, explore = self.parked[0]
            seconds = self.timer.seconds(token)
            if seconds is None:
                return
            self.parked.popleft()
            self.counters.record(depth, batch_size, tokens, seconds, explore)

    def flush(self) -> None:
        """Write the pending counts and gauges to prometheus. Never raises: a failed write
        (e.g. the multiprocess folder is full) must not fail the admin request or the
        iteration that triggered it; it is logged once."""
        if self.exporter is None:
            return
        try:
            self.exporter.export(self)
        except Exception:
            if not self._export_failed:
                self._export_failed = True
                logger.exception("specctl: writing the per-depth metrics failed; serving "
                                 "continues, /metrics may lag")
