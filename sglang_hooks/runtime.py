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
from dataclasses import dataclass
from typing import Any

from sglang_hooks import lean_host, off_mode, plain_decode, verify_schedule
from sglang_hooks.contract import (
    PolicyError,
    PolicyTable,
    TierSelector,
    decode_settings,
    decode_table,
    has_policy_keys,
    lookup,
    server_state,
)
from sglang_hooks.counters import DepthCounters
from sglang_hooks.gpu_timer import HostIntervalTimer, LaunchTimer
from sglang_hooks.peers import PeerCheck

logger = logging.getLogger("specctl")

SOURCE_NONE, SOURCE_STARTUP, SOURCE_PUSH = "none", "startup", "push"
EXPORT_INTERVAL_S = 1.0
_MAX_PARKED = 256


def exploration_rng(version: int, seed: int = 0) -> random.Random:
    """Same seed on every TP rank, so ranks draw the same exploration depths."""
    return random.Random((seed << 32) ^ version)


@dataclass(frozen=True)
class Change:
    """A validated admin request: a table to install (`table_given`; None = release) and/or
    an off mode to switch to. `SchedulerRuntime.commit` applies it."""

    table: PolicyTable | None = None
    table_given: bool = False
    off_mode: str | None = None
    lean_host: bool | None = None  # the host-work trims (lean_host.py), if the request says
    lean_relay: bool | None = None  # the depth-0 relay trims (lean_relay.py), likewise
    fence_at_replay: bool | None = None  # under them, the plain decode's fence at its replay
    skip_draft_prefill: bool | None = None  # the draft's prefill while off (draft_prefill.py)
    plain_decode: bool | None = None  # depth 0 on the DECODE graphs (plain_decode.py)


def skippable_tiers(table: PolicyTable | None, mode: str) -> tuple[bool, ...]:
    """Per tier: may a depth-0 launch in it skip the draft extend under `mode`?

    Only tiers whose own depth is 0 (an exploration probe of depth 0 inside a speculative
    tier keeps the extend, so the tier's next iteration drafts from a current state). Under
    `skip-extend` a tier that probes positive depths keeps the extend too, so those probes
    measure the acceptance a warm draft gets; `skip-extend-all` skips there as well."""
    if table is None or mode == off_mode.SGLANG:
        return ()
    return tuple(
        t.depth == 0 and (mode == off_mode.SKIP_EXTEND_ALL
                          or not any(d > 0 for d in t.explore_depths))
        for t in table.tiers
    )


NOT_STARTED = "the adaptive speculative controller has not started"


class SchedulerRuntime:
    """State of one scheduler process. `active` once the adaptive controller is built."""

    def __init__(self, timer: LaunchTimer | None = None, seed: int = 0) -> None:
        self.active = False
        self.inactive_reason: str | None = NOT_STARTED
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
        # Set by the depth choice inside a launch, read by the launch and extend hooks.
        self.launched = False
        self.launch_explore = False
        self.launch_skips_extend = False
        self.spec_worker: Any = None  # the EAGLEWorkerV2 of the current launch
        self.off_mode = off_mode.DEFAULT_MODE
        self.lean_host = False  # lean_host.py: trimmed host work on the speculative iteration
        self.lean_relay = False  # lean_relay.py: a depth-0 iteration's lighter hand-over
        # lean_relay.py: a depth-0 plain decode fences at its graph's replay, not its outputs
        self.fence_at_replay = False
        # Set inside a launch: its draft work (the decode's extend or the prefill's) was
        # skipped for the stub, so lean_relay stashes the bonus tokens alone.
        self.launch_stubbed = False
        self.early_fences = 0  # depth-0 launches that handed the WAR barrier their own event
        self.replay_fences = 0  # of those, plain decodes that handed over their replay's
        self.lean_stashes = 0  # relays that stashed the bonus tokens alone
        self.lean_gathers = 0  # iterations that gathered the bonus tokens alone
        self.late_gathers = 0  # of those, launches that drafted and gathered the rest late
        # calls each decode-bookkeeping trim of lean_host.py took over (SPECCTL_LEAN_PREPARE)
        self.prepare_trims = dict.fromkeys(lean_host.PREPARE_TRIMS, 0)
        # (SGLang's gather, the FutureMap, the batch) owed to a launch that drafts
        self.owed_gather: tuple[Any, Any, Any] | None = None
        self.skip_draft_prefill = False  # draft_prefill.py: no draft prefill while off
        self.skipped_prefills = 0  # prefill batches whose draft extend was skipped
        self.last_batch_size = 0  # of the last decode launch: where admissions land
        self._skippable: tuple[bool, ...] = ()
        self.depth_switches = 0  # runtime-state switches SGLang made (table or its own)
        self.skipped_extends = 0
        self.unemitted_rows = 0  # rows of finished/retracted requests: launched, not counted
        self.empty_results = 0  # results with no row left to count
        # Agreement with the other TP ranks, settled before a table first takes control.
        self.peers: PeerCheck | None = None
        self._peers_pending = False
        self._pending_startup: PolicyTable | None = None

    # ------------------------------------------------------------------ activation

    def activate(self, captured_depths: Iterable[int], startup: PolicyTable | None,
                 peers: PeerCheck | None = None) -> None:
        """Start steering. With `peers` (several TP ranks), the start-up table waits until
        the ranks agree (`settle_peers`, at the first point where a table could act)."""
        self.captured_depths = frozenset(captured_depths)
        self.active = True
        self.inactive_reason = None
        if peers is None:
            if startup is not None:
                self._install(startup, SOURCE_STARTUP)
        else:
            self.peers = peers
            self._pending_startup = startup
            self._peers_pending = True
        self.flush()

    def deactivate(self, reason: str) -> None:
        self.active = False
        self.inactive_reason = reason
        self.selector = None
        self.source = SOURCE_NONE
        self._skippable = ()
        self.launch_skips_extend = self.launch_stubbed = False

    def settle_peers(self) -> None:
        """Agree with the other TP ranks before any table takes control here (once).

        Called at the first decode launch, push or state report, all of which every rank
        of the replica sees at the same step; the verdict is the same on every rank
        (peers.py). On refusal this rank stays on SGLang's own choice and says why."""
        if not self._peers_pending:
            return
        self._peers_pending = False
        startup, self._pending_startup = self._pending_startup, None
        assert self.peers is not None
        try:
            reason = self.peers.verdict()
        except Exception as err:  # a broken store: refuse rather than guess
            reason = f"cannot compare with the other TP ranks ({type(err).__name__}: {err})"
        if reason is not None:
            logger.error("specctl: not steering, SGLang's own choice stays: %s", reason)
            self.deactivate(reason)
            return
        logger.info("specctl: all %d TP ranks run the same plugin state", self.peers.world_size)
        if startup is not None:
            self._install(startup, SOURCE_STARTUP)

    # ------------------------------------------------------------------ admin RPC

    def apply_request(self, server_args: Mapping[str, Any]) -> Change:
        """Validate the specctl keys of a set_internal_state request. Raises PolicyError.

        Returns what to change (`commit` applies it): a table (None = release control) when
        the request carries table keys, an off mode when it carries `specctl_off_mode`.
        """
        if not has_policy_keys(server_args):
            raise PolicyError("server_args", "carries no specctl_* keys")
        self.settle_peers()
        if not self.active:
            raise PolicyError("specctl", f"the plugin is inactive on this server: "
                              f"{self.inactive_reason}")
        change = validate_change(server_args, self.captured_depths)
        if change.plain_decode:
            plain_decode.check_turning_on([plain_decode.state_report()])
        return change

    def reject(self, err: PolicyError) -> None:
        self.last_rejection = f"{err.field}: {err.message}"
        logger.warning("specctl: table push refused: %s", self.last_rejection)

    @staticmethod
    def _switched(what: str, now: bool, asked: bool) -> bool:
        """An on/off setting's new value, logged when it changes."""
        if asked != now:
            logger.info("specctl: %s %s", what, "on" if asked else "off")
        return asked

    def commit(self, change: Change | PolicyTable | None) -> None:
        """Apply a validated change; a bare table (or None: release) is a table change."""
        if not isinstance(change, Change):
            change = Change(table=change, table_given=True)
        if change.off_mode is not None:
            self.set_off_mode(change.off_mode)
        if change.lean_host is not None:
            self.lean_host = self._switched("host-work trims", self.lean_host, change.lean_host)
        if change.lean_relay is not None:
            self.lean_relay = self._switched("depth-0 relay trims", self.lean_relay,
                                             change.lean_relay)
        if change.fence_at_replay is not None:
            self.fence_at_replay = self._switched("depth-0 fence at the replay",
                                                  self.fence_at_replay, change.fence_at_replay)
        if change.skip_draft_prefill is not None:
            self.skip_draft_prefill = self._switched(
                "draft prefill skipped while off", self.skip_draft_prefill,
                change.skip_draft_prefill)
        if change.plain_decode is not None:
            plain_decode.set_live(change.plain_decode)
        if change.table_given:
            if change.table is None:
                self.selector = None
                self.source = SOURCE_NONE
                self.applied_iteration = self.iteration
                self._skippable = ()
                logger.info("specctl: control released to SGLang's adaptive choice")
            else:
                self._install(change.table, SOURCE_PUSH)
        self.last_rejection = None
        self.flush()

    def set_off_mode(self, mode: str) -> None:
        if mode != self.off_mode:
            logger.info("specctl: off mode %s -> %s", self.off_mode, mode)
        self.off_mode = mode
        self._skippable = skippable_tiers(self.table, mode)

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
        self._skippable = skippable_tiers(table, self.off_mode)
        logger.info("specctl: table v%d (%s) applied: %s", table.version, source,
                    table.describe())

    @property
    def table(self) -> PolicyTable | None:
        return None if self.selector is None else self.selector.table

    def report(self) -> dict[str, Any]:
        self.settle_peers()
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
        state["off_mode"] = self.off_mode
        state["lean_host"] = self.lean_host
        state["lean_relay"] = self.lean_relay
        state["lean_prepare"] = lean_host.PREPARE_ENABLED
        state["lean_prepare_runs"] = dict(self.prepare_trims)
        state["fence_at_replay"] = self.fence_at_replay
        state["early_fences"] = self.early_fences
        state["replay_fences"] = self.replay_fences
        state["lean_stashes"] = self.lean_stashes
        state["lean_gathers"] = self.lean_gathers
        state["late_gathers"] = self.late_gathers
        state["skip_draft_prefill"] = self.skip_draft_prefill
        state["skipped_draft_prefills"] = self.skipped_prefills
        state["depth_switches"] = self.depth_switches
        state["skipped_draft_extends"] = self.skipped_extends
        state["verify_schedule"] = verify_schedule.ENABLED
        state["verify_schedule_backends"] = verify_schedule.STATS.backends
        state["plain_decode"] = plain_decode.state_report()
        state["unemitted_rows"] = self.unemitted_rows
        state["empty_results"] = self.empty_results
        state["tp_ranks_checked"] = None if self.peers is None else self.peers.world_size
        return state

    # ------------------------------------------------------------------ hot path

    def choose(self, batch_size: int) -> int | None:
        """Depth for this launch, or None to let SGLang's own choice stand."""
        self.iteration += 1
        self.launched = True
        self.last_batch_size = batch_size
        if self._peers_pending:
            self.settle_peers()
        selector = self.selector
        if selector is None:
            self.launch_explore = self.launch_skips_extend = False
            return None
        depth, self.launch_explore = selector.select(batch_size)
        skippable = self._skippable
        self.launch_skips_extend = depth == 0 and bool(skippable) and skippable[selector.tier or 0]
        return depth

    def prefill_skips_draft(self, admitted: int) -> bool:
        """Whether a prefill batch of `admitted` requests skips the draft's extend: the switch
        is on and the tier those requests decode in next is one whose depth-0 launches skip
        theirs. That tier is the table's lookup at the last decode launch's batch size plus
        the admitted requests, from the tier the selector is in, without moving it."""
        if not (self.active and self.skip_draft_prefill and self._skippable):
            return False
        selector = self.selector
        if selector is None:
            return False
        tier = lookup(selector.table, self.last_batch_size + admitted, selector.tier)
        return self._skippable[tier]

    def record_result(
        self, depth: int, batch_size: int, tokens: int, launch: Any, now: float | None = None
    ) -> None:
        """Count one processed decode result. `launch` is what the launch hook attached."""
        if self.parked:
            self._drain_parked()
        if batch_size <= 0:  # every row finished or was retracted before it was processed
            self.empty_results += 1
            if launch is not None and self.timer.seconds(launch[1]) is None \
                    and len(self.parked) < _MAX_PARKED:
                self.parked.append((launch[1], depth, 0, 0, False))  # recycle its events later
            return
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
            if batch_size > 0:
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


def validate_change(server_args: Mapping[str, Any], captured_depths: Iterable[int] | None
                    ) -> Change:
    """The change a request's specctl keys ask for. Raises PolicyError naming the wire key."""
    settings, table_keys = off_mode.split_settings(server_args)
    asked = decode_settings(settings)
    table, given = None, has_policy_keys(table_keys)
    if given:
        table = decode_table(table_keys, captured_depths=captured_depths)
    return Change(table=table, table_given=given, off_mode=asked.off_mode,
                  lean_host=asked.lean_host, lean_relay=asked.lean_relay,
                  fence_at_replay=asked.fence_at_replay,
                  skip_draft_prefill=asked.skip_draft_prefill, plain_decode=asked.plain_decode)
