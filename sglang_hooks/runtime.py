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

from sglang_hooks import lean_host, plain_decode
from sglang_hooks.contract import (
    OFF_PATH_KEY,
    OffPathFeature,
    PolicyError,
    PolicyTable,
    TierSelector,
    decode_table,
    has_policy_keys,
    lookup,
    off_path_state,
    server_state,
)
from sglang_hooks.counters import DepthCounters
from sglang_hooks.draft_shape import DraftShape, Shape
from sglang_hooks.gpu_timer import HostIntervalTimer, LaunchTimer
from sglang_hooks.peers import PeerCheck

logger = logging.getLogger("specctl")

SOURCE_NONE, SOURCE_STARTUP, SOURCE_PUSH = "none", "startup", "push"
EXPORT_INTERVAL_S = 1.0
_MAX_PARKED = 256


def exploration_rng(version: int, seed: int = 0) -> random.Random:
    """Same seed on every TP rank, so ranks draw the same exploration depths."""
    return random.Random((seed << 32) ^ version)


def skippable_tiers(table: PolicyTable | None) -> tuple[bool, ...]:
    """Per tier: may a depth-0 launch in it skip the draft extend?

    Only tiers whose own depth is 0 (an exploration probe of depth 0 inside a speculative
    tier keeps the extend, so the tier's next iteration drafts from a current state), and of
    those only tiers that probe no positive depth: those probes then measure the acceptance a
    warm draft gets."""
    if table is None:
        return ()
    return tuple(t.depth == 0 and t.topk == 1 and not any(d > 0 for d in t.explore_depths)
                 and not t.explore_trees for t in table.tiers)


NOT_STARTED = "the adaptive speculative controller has not started"


class SchedulerRuntime:
    """State of one scheduler process. `active` once the adaptive controller is built."""

    def __init__(self, timer: LaunchTimer | None = None, seed: int = 0) -> None:
        self.active = False
        self.inactive_reason: str | None = NOT_STARTED
        self.captured_depths: frozenset[int] = frozenset()
        self.captured_trees: frozenset[DraftShape] = frozenset()  # on a shape server (shapes.py)
        self.tree_results = 0  # decode results of a tree (counted by shape, tree_counters)
        self.selector: TierSelector | None = None
        self.source = SOURCE_NONE
        self.last_rejection: str | None = None
        self.applied_iteration: int | None = None
        self.iteration = 0  # decode launches seen by this process
        self.seed = seed
        self.timer: LaunchTimer = timer or HostIntervalTimer()
        self.counters = DepthCounters()
        self.tree_counters = DepthCounters()  # a shape server's tree results, by label
        self.unattributed_results = 0
        self.parked: deque[tuple[Any, int | str, int, int, bool]] = deque()
        self.exporter: Any = None  # set on the metrics rank (exporter.PrometheusExporter)
        self._next_export = 0.0
        self._export_failed = False
        # Set by the depth choice inside a launch, read by the launch and extend hooks.
        self.launched = False
        self.launch_explore = False
        self.launch_skips_extend = False
        self.spec_worker: Any = None  # the EAGLEWorkerV2 of the current launch
        # What depth 0 runs (`use_off_path`, once steering starts): the path (settings.py) and
        # the adapter's pieces of it (OffPathFeature); none until then.
        self.off_path: str | None = None
        self.features: frozenset[OffPathFeature] = frozenset()
        self.skips_extend = False  # a table's depth-0 tier skips the draft extend
        self.skips_draft_prefill = False  # draft_prefill.py: no draft prefill while off
        self.host_trims = False  # lean_host.py: trimmed host work on the speculative iteration
        # plain_decode.py: depth 0 on the DECODE graphs, fenced at their replay (fence.py)
        self.plain_decode_path = False
        self.replay_fences = 0  # depth-0 plain decodes that handed the WAR barrier their event
        # calls each decode-bookkeeping trim of lean_host.py took over
        self.prepare_trims = dict.fromkeys(lean_host.PREPARE_TRIMS, 0)
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
                 peers: PeerCheck | None = None,
                 captured_trees: Iterable[DraftShape] = (), agreed: bool = False) -> None:
        """Start steering. With `peers` (several TP ranks), the start-up table waits until
        the ranks agree (`settle_peers`, at the first point where a table could act), unless
        they `agreed` already (a shape server's ranks agree before its capture)."""
        self.captured_depths = frozenset(captured_depths)
        self.captured_trees = frozenset(captured_trees)
        self.active = True
        self.inactive_reason = None
        if peers is not None:
            self.peers = peers
        if peers is None or agreed:
            if startup is not None:
                self._install(startup, SOURCE_STARTUP)
        else:
            self._pending_startup = startup
            self._peers_pending = True
        self.flush()

    def deactivate(self, reason: str, peers: PeerCheck | None = None) -> None:
        """Stop steering; `peers` is the TP check that refused where the refusal came before
        `activate` (a shape server's), reported as `settle_peers` leaves a refusing rank."""
        if peers is not None:
            self.peers = peers
        self.active = False
        self.inactive_reason = reason
        self.selector = None
        self.source = SOURCE_NONE
        self._skippable = ()
        self.launch_skips_extend = False

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

    def use_off_path(self, path: str, features: Iterable[OffPathFeature]) -> None:
        """Run depth 0 on `path` with these pieces (the adapter's, or none on SGLang's own
        path): set where steering starts, before any table is installed."""
        self.off_path = path
        self.features = frozenset(features)
        self.skips_extend = OffPathFeature.SKIP_EXTEND in self.features
        self.skips_draft_prefill = OffPathFeature.SKIP_DRAFT_PREFILL in self.features
        self.host_trims = OffPathFeature.HOST_TRIMS in self.features
        self.plain_decode_path = OffPathFeature.PLAIN_DECODE in self.features
        self._skippable = skippable_tiers(self.table) if self.skips_extend else ()

    # ------------------------------------------------------------------ admin RPC

    def apply_request(self, server_args: Mapping[str, Any]) -> PolicyTable | None:
        """Validate the specctl keys of a set_internal_state request. Raises PolicyError.

        Returns the table to install (`commit` applies it; None = release control).
        """
        if not has_policy_keys(server_args):
            raise PolicyError("server_args", "carries no specctl_* keys")
        self.settle_peers()
        if not self.active:
            raise PolicyError("specctl", f"the plugin is inactive on this server: "
                              f"{self.inactive_reason}")
        return validate_change(server_args, self.captured_depths, self.captured_trees)

    def reject(self, err: PolicyError) -> None:
        self.last_rejection = f"{err.field}: {err.message}"
        logger.warning("specctl: table push refused: %s", self.last_rejection)

    def commit(self, table: PolicyTable | None) -> None:
        """Install a validated table (None: release control to SGLang's own choice)."""
        if table is None:
            self.selector = None
            self.source = SOURCE_NONE
            self.applied_iteration = self.iteration
            self._skippable = ()
            logger.info("specctl: control released to %s", "the start-up shape"
                        if self.captured_trees else "SGLang's adaptive choice")
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
        self._skippable = skippable_tiers(table) if self.skips_extend else ()
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
            captured_trees=self.captured_trees,
        )
        # Extra fields (the contract's readers ignore unknown keys).
        state["active"] = self.active
        state["inactive_reason"] = self.inactive_reason
        state["iteration"] = self.iteration
        state["unattributed_results"] = self.unattributed_results
        # What depth 0 runs here (null path and no feature until steering starts), then what
        # each piece did.
        state[OFF_PATH_KEY] = off_path_state(self.off_path, self.features)
        state["skipped_draft_extends"] = self.skipped_extends
        state["skipped_draft_prefills"] = self.skipped_prefills
        state["replay_fences"] = self.replay_fences
        state["host_trim_runs"] = dict(self.prepare_trims)
        state["plain_decode"] = plain_decode.state_report()
        state["depth_switches"] = self.depth_switches
        state["unemitted_rows"] = self.unemitted_rows
        if self.captured_trees:
            state["tree_results"] = self.tree_results
        state["empty_results"] = self.empty_results
        state["tp_ranks_checked"] = None if self.peers is None else self.peers.world_size
        return state

    # ------------------------------------------------------------------ hot path

    def choose(self, batch_size: int) -> int | None:
        """Depth for this launch, or None to let SGLang's own choice stand."""
        selector = self._launch(batch_size)
        if selector is None:
            return None
        depth, self.launch_explore = selector.select(batch_size)
        skippable = self._skippable
        self.launch_skips_extend = depth == 0 and bool(skippable) and skippable[selector.tier or 0]
        return depth

    def choose_shape(self, batch_size: int) -> tuple[bool, Shape]:
        """`choose` on a shape server: (whether a table chose, the shape for this launch; None
        is off). An off launch skips its extend as `choose` decides for depth 0."""
        selector = self._launch(batch_size)
        if selector is None:
            return False, None
        shape, self.launch_explore = selector.select_shape(batch_size)
        skippable = self._skippable
        self.launch_skips_extend = (shape is None and bool(skippable)
                                    and skippable[selector.tier or 0])
        return True, shape

    def _launch(self, batch_size: int) -> TierSelector | None:
        """A decode launch's bookkeeping; the selector when a table rules."""
        self.iteration += 1
        self.launched = True
        self.last_batch_size = batch_size
        self.launch_explore = self.launch_skips_extend = False
        if self._peers_pending:
            self.settle_peers()
        return self.selector

    def prefill_skips_draft(self, admitted: int) -> bool:
        """Whether a prefill batch of `admitted` requests skips the draft's extend: the off path
        has the skip and the tier those requests decode in next is one whose depth-0 launches
        skip theirs. That tier is the table's lookup at the last decode launch's batch size plus
        the admitted requests, from the tier the selector is in, without moving it."""
        if not (self.active and self.skips_draft_prefill and self._skippable):
            return False
        selector = self.selector
        if selector is None:
            return False
        tier = lookup(selector.table, self.last_batch_size + admitted, selector.tier)
        return self._skippable[tier]

    def record_result(
        self, depth: int | str, batch_size: int, tokens: int, launch: Any,
        now: float | None = None,
    ) -> None:
        """Count one processed decode result. `launch` is what the launch hook attached;
        `depth` is a tree's label for a tree's result (kept apart, `tree_counters`)."""
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
                self._counters_for(depth).record(depth, batch_size, tokens, seconds, explore)
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
                self._counters_for(depth).record(depth, batch_size, tokens, seconds, explore)

    def _counters_for(self, depth: int | str) -> DepthCounters:
        return self.tree_counters if isinstance(depth, str) else self.counters

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


def validate_change(server_args: Mapping[str, Any], captured_depths: Iterable[int] | None,
                    captured_trees: Iterable[DraftShape] = ()) -> PolicyTable | None:
    """The table a request's specctl keys carry (None: release control). Raises PolicyError
    naming the wire key."""
    return decode_table(server_args, captured_depths=captured_depths,
                        captured_trees=captured_trees)
