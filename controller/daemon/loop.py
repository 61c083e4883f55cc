"""The daemon's reconcile loop: scrape -> store -> model -> table -> push, per target.

`Controller` holds no clock of its own: every entry point takes `now`. Two drivers call it:
- `run_wall` (controller/daemon/runner.py): apscheduler jobs on real time, one scrape job and one
  decide job per target and one fit job per group, each job isolated, so a stuck or failing
  target never blocks the others (every call to a server also has a timeout).
- `step` here: the simulated-clock driver (evaluation, demo) calls it once per tick.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.daemon.bench_seed import read_bench, samples_from_bench
from controller.daemon.config import ControllerConfig, TargetConfig
from controller.daemon.frozen import load_frozen_policy
from controller.daemon.guardrails import (
    bound_change,
    bucket_rates,
    changed_buckets,
    compare_after_push,
    restrict_to_captured,
)
from controller.daemon.handback import Found, describe, exit_table, has_probes
from controller.daemon.model import GroupModel, LearnerFactory, default_learner_factory
from controller.daemon.own_metrics import DaemonMetrics
from controller.daemon.push import (
    LiveState,
    ServerStateError,
    read_live,
    same_tiers,
    send_table,
    verify_table,
)
from controller.daemon.push_gate import decide_push
from controller.daemon.reaction import acceptance_surprise, decode_time_histogram, novel_share
from controller.daemon.scrape import ScrapeError, build_samples, counter_deltas
from controller.daemon.sources import CounterSource, MetricsPageSource, PrometheusSource
from controller.daemon.store import Store
from controller.daemon.takeover import measured_choice
from controller.daemon.transport import ServerTransport
from models.samples import Sample
from sglang_hooks.contract import PolicyError, PolicyTable, parse_table
from sglang_hooks.draft_shape import DraftShape, chain, label, parse_shape

log = logging.getLogger("specctl.daemon")

RECENT_LOAD_S = 600.0  # window of the batch histogram handed to the learner
CURRENT_LOAD_S = 60.0  # "the load of the moment": weighs a push after the load moved


@dataclass
class PendingCheck:
    """A push waiting for its after-push measurement window."""

    push_id: int
    t: float
    old: PolicyTable | None
    new: PolicyTable


@dataclass
class TargetState:
    cfg: TargetConfig
    transport: ServerTransport
    source: CounterSource
    push_key: str | None
    snapshot: dict[str, float] | None = None
    snapshot_t: float | None = None
    failures: int = 0
    next_scrape_at: float = float("-inf")
    live: LiveState | None = None
    last_push_t: float | None = None
    pushed_version: int = 0
    pending: PendingCheck | None = None
    refused_until: float = float("-inf")
    quarantine: dict[tuple[Any, ...], float] = field(default_factory=dict)
    recent: list[Sample] = field(default_factory=list)  # this target's samples, for checks
    predicted: dict[int, float] = field(default_factory=dict)
    first_fit_seen: float | None = None  # first decision with a fitted model (takeover clock)
    decided_hist: dict[int, float] = field(default_factory=dict)  # load the last decision saw
    react_until: float = float("-inf")  # re-decide after every scrape until then
    react_since: float = float("-inf")  # when the current reaction started
    react_kind: str = ""  # "first" (first evidence), "load" or "acceptance"
    react_reason: str = ""
    # What the server ran when first read, before this run's first push (None: not read yet).
    found: Found | None = None
    pushed_this_run: bool = False
    # Tiers of every table the daemon learned and pushed to this target (this run and stored):
    # a live table not among them is someone else's choice, replaced only on a predicted gain.
    own_tables: set[tuple[Any, ...]] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def name(self) -> str:
        return self.cfg.name


@dataclass(frozen=True)
class PushEvent:
    """One push as the CLI prints it."""

    t: float
    target: str
    kind: str
    outcome: str
    table: PolicyTable | None
    reason: str


class Controller:
    def __init__(
        self,
        config: ControllerConfig,
        store: Store,
        transports: dict[str, ServerTransport],
        *,
        metrics: DaemonMetrics | None = None,
        learner_factory: LearnerFactory = default_learner_factory,
    ) -> None:
        self.config = config
        self.store = store
        self.metrics = metrics or DaemonMetrics()
        self.events: list[PushEvent] = []
        self.frozen: PolicyTable | None = None
        self.frozen_provenance: dict[str, Any] = {}
        if config.frozen_policy is not None:
            self.frozen, self.frozen_provenance = load_frozen_policy(config.frozen_policy)
        self.targets: dict[str, TargetState] = {}
        self.groups: dict[str, GroupModel] = {}
        for tc in config.targets:
            transport = transports[tc.name]
            source: CounterSource
            if tc.source == "prometheus":
                assert tc.prometheus_url is not None
                source = PrometheusSource(tc.prometheus_url, tc.prometheus_selector, tc.timeout_s)
            else:
                source = MetricsPageSource(transport)
            state = TargetState(tc, transport, source, tc.resolved_admin_key())
            stored = store.load_snapshot(tc.name)
            if stored is not None:
                state.snapshot_t, state.snapshot = stored
            self._restore_push_state(state)
            self.targets[tc.name] = state
            self.metrics.store_samples.labels(tc.name).set(store.count_samples(tc.name))
            if tc.group not in self.groups:
                self.groups[tc.group] = GroupModel(
                    tc.group, dict(config.learner), config.seed, learner_factory
                )
        # Resume learning: reload the recent samples of every group and target.
        for group in self.groups.values():
            last = store.last_sample_time(group=group.group)
            if last is not None:
                since = last - config.schedule.history_s
                rows = store.samples(group=group.group, since=since)
                group.add([s for _, s in rows])
        for st in self.targets.values():
            last = store.last_sample_time(target=st.name)
            if last is not None:
                rows = store.samples(target=st.name, since=last - self._recent_horizon_s())
                st.recent = [s for _, s in rows]

    def _restore_push_state(self, state: TargetState) -> None:
        records = self.store.pushes(state.name)
        for r in records:
            table = None if r.table is None else _table(r.table)
            if r.kind == "learned" and table is not None:
                state.own_tables.add(_tiers_key(table))
            if r.kind == "handback" and r.outcome in ("applied", "unverified"):
                left = "release" if table is None else "table"
                self.metrics.handback.labels(state.name, left).set(r.t)
        if not records:
            return
        state.last_push_t = max(r.t for r in records)
        state.pushed_version = max(
            (int(r.table.get("version", 0)) for r in records if r.table), default=0
        )
        last = records[-1]
        if last.outcome == "pending" and last.table is not None:
            good = [r for r in records[:-1] if r.outcome == "good" and r.table is not None]
            old = None if not good or good[-1].table is None else _table(good[-1].table)
            new = _table(last.table)
            if new is not None:
                state.pending = PendingCheck(last.id, last.t, old, new)

    # ------------------------------------------------------------------ scrape -> store

    def scrape(self, name: str, now: float) -> list[Sample]:
        """Scrape one target if due; store its samples. Never raises for server trouble."""
        st = self.targets[name]
        if now < st.next_scrape_at:
            return []
        with st.lock:
            return self._scrape_locked(st, now)

    def _scrape_locked(self, st: TargetState, now: float) -> list[Sample]:
        m = self.metrics
        try:
            snap = st.source.read_counters()
        except ScrapeError as err:
            self._scrape_failed(st, now, err.kind, str(err))
            return []
        if snap.dropped_series:
            m.dropped_series.labels(st.name).inc(snap.dropped_series)
        result = counter_deltas(st.snapshot, snap.values)
        if result.restarted:
            m.counter_resets.labels(st.name).inc()
            log.warning("%s: counters went down: server restarted; counting from zero", st.name)
            st.live = None  # the restarted server lost any pushed table: re-read it
        interval = 0.0 if st.snapshot_t is None else max(now - st.snapshot_t, 0.0)
        built = build_samples(
            result.deltas, group=st.cfg.group, target=st.name, t_end=now, interval_s=interval
        )
        if built.inconsistent:
            m.dropped_series.labels(st.name).inc(built.inconsistent)
        try:
            self.store.record_scrape(st.name, now, built.samples, result.merged)
        except sqlite3.Error as err:
            # Snapshot not advanced: the next scrape's delta covers this interval too.
            self._scrape_failed(st, now, "store", f"store write failed: {err}")
            return []
        st.snapshot, st.snapshot_t = result.merged, now
        if st.failures:
            log.info("%s: scrapes succeed again after %d failure(s)", st.name, st.failures)
        st.failures = 0
        st.next_scrape_at = float("-inf")
        m.scrapes.labels(st.name).inc()
        m.target_up.labels(st.name).set(1)
        m.samples_stored.labels(st.name).inc(len(built.samples))
        m.store_samples.labels(st.name).inc(len(built.samples))
        iterations = sum(s.iterations for s in built.samples)
        if iterations > 0:
            probes = sum(s.explore_iterations for s in built.samples)
            m.probe_share.labels(st.name).set(probes / iterations)
        # A shape server's tree samples go with the rest: the chain learner drops them
        # (models/evidence.py), a shape server's learner reads every shape.
        self.groups[st.cfg.group].add(built.samples)
        st.recent.extend(built.samples)
        horizon = now - self._recent_horizon_s()
        if st.recent and st.recent[0].t_end <= horizon:
            st.recent = [s for s in st.recent if s.t_end > horizon]
        return built.samples

    def _recent_horizon_s(self) -> float:
        return max(RECENT_LOAD_S, 3 * self.config.guardrails.rollback_window_s)

    def _scrape_failed(self, st: TargetState, now: float, kind: str, message: str) -> None:
        st.failures += 1
        sched = self.config.schedule
        backoff = min(sched.scrape_interval_s * 2 ** (st.failures - 1), sched.backoff_max_s)
        st.next_scrape_at = now + backoff
        self.metrics.scrape_errors.labels(st.name, kind).inc()
        self.metrics.target_up.labels(st.name).set(0)
        # Log the first failure and then rarely: a dead target must not flood the log.
        if st.failures == 1 or st.failures % 20 == 0:
            log.warning(
                "%s: scrape failed (%s, %d in a row; next try in %.0f s): %s",
                st.name,
                kind,
                st.failures,
                backoff,
                message,
            )

    # ------------------------------------------------------------------ model

    def fit(self, group: str, now: float) -> bool:
        gm = self.groups[group]
        if gm.learner is None:
            live = self._live_for_group(group)
            if live is None:
                return False
            snap = self.store.latest_learner_snapshot(group)
            state = None if snap is None else snap[2]
            if live.captured_trees:
                gm.ensure_shape_learner(served_shapes(live), state)
            else:
                gm.ensure_learner(live.captured_depths, state)
        try:
            fitted = gm.fit(now, self.config.schedule.history_s)
        except Exception as err:  # a learner bug must not stop scraping or other groups
            self.metrics.fit_errors.labels(group).inc()
            log.exception("%s: learner fit failed: %s", group, err)
            return False
        if fitted:
            self.metrics.fits.labels(group).inc()
            self.metrics.last_fit.labels(group).set(now)
            assert gm.learner is not None
            try:
                self.store.add_learner_snapshot(
                    now, group, gm.learner.version, gm.learner.to_json()
                )
            except (sqlite3.Error, TypeError, ValueError) as err:
                log.warning("%s: learner snapshot not stored: %s", group, err)
        return fitted

    def _live_for_group(self, group: str) -> LiveState | None:
        """What the group's first readable server captured (its members are alike)."""
        for st in self.targets.values():
            if st.cfg.group != group:
                continue
            live = self._read_live(st)
            if live is not None and (live.captured_depths or live.captured_trees):
                return live
        return None

    def _read_live(self, st: TargetState) -> LiveState | None:
        try:
            live = read_live(st.transport)
        except ServerStateError as err:
            log.warning("%s: %s", st.name, err)
            return None
        st.live = live
        self._note_live(st, live)
        return live

    def _note_live(self, st: TargetState, live: LiveState) -> None:
        """Record what the server runs: the live gauges, and the first time, what was found."""
        table = live.table
        kept = self._live_gauges(st, table)
        if st.found is not None or st.pushed_this_run:
            return
        st.found = Found(table, live.source)
        if live.captured_trees and self.frozen is None:
            log.info(
                "%s: the server switches draft shapes (%s); the daemon learns each shape's "
                "tok/s per batch bucket from what it measures and probes (no model carries a "
                "shape to loads it has not run at)",
                st.name, ", ".join(served_shapes(live)),
            )  # fmt: skip
        if self.frozen is not None:
            frozen = "frozen mode keeps the policy file's table there"
            log.info("%s: found %s; %s", st.name, describe(table), frozen)
        elif table is None and live.captured_trees:
            log.info("%s: found its start-up shape running (no specctl table); taking over",
                     st.name)
        elif table is None:
            log.info("%s: found SGLang's own choice (no specctl table); taking over", st.name)
        elif kept:
            log.info(
                "%s: found %s (source %s), not pushed by this daemon: kept until the model "
                "predicts push_min_gain %.1f%% over it",
                st.name,
                describe(table),
                live.source,
                100 * self.config.guardrails.push_min_gain,
            )
        else:
            log.info("%s: found %s (source %s)", st.name, describe(table), live.source)

    def _live_gauges(self, st: TargetState, table: PolicyTable | None) -> bool:
        """Set the live-table gauges; returns whether `table` is a found table kept."""
        m = self.metrics
        m.live_version.labels(st.name).set(0 if table is None else table.version)
        m.live_tiers.labels(st.name).set(0 if table is None else len(table.tiers))
        probing = 0 if table is None else sum(t.explore_share > 0 for t in table.tiers)
        m.live_probe_tiers.labels(st.name).set(probing)
        kept = self._foreign(st, table) and self.frozen is None
        m.kept_found_table.labels(st.name).set(1 if kept else 0)
        return kept

    def _foreign(self, st: TargetState, table: PolicyTable | None) -> bool:
        """A live table the daemon did not learn and push (someone else's choice)."""
        return table is not None and _tiers_key(table) not in st.own_tables

    def seed_from_benches(self, now: float) -> dict[str, int]:
        """Store each target's `seed_bench` as its first samples, ending at `now`, where the
        store holds none of that target yet; the learner takes them at once. Returns the
        samples stored per target. BenchSeedError names a file that is not a bench."""
        stored: dict[str, int] = {}
        for st in self.targets.values():
            if st.cfg.seed_bench is None or self.store.count_samples(st.name) > 0:
                continue
            doc = read_bench(st.cfg.seed_bench)
            samples = samples_from_bench(doc, st.cfg.group, st.name, now)
            if samples:
                self.store.add_samples(samples)
                self.groups[st.cfg.group].add(samples)
                self.metrics.store_samples.labels(st.name).set(self.store.count_samples(st.name))
            stored[st.name] = len(samples)
            depths = sorted({s.depth for s in samples})
            log.info("%s: %d samples from the bench %s (depths %s)%s", st.name, len(samples),
                     st.cfg.seed_bench, depths,
                     "" if samples else ": none of its levels measured a depth with the "
                     "plugin's counters, so the daemon starts from nothing")
        return stored

    def start(self, now: float) -> None:
        """Read every server once before the first push: what was found there is what the
        hand-back at exit restores, and a found table is kept until the model beats it."""
        for st in self.targets.values():
            with st.lock:
                if st.found is None:
                    self._read_live(st)

    # ------------------------------------------------------------------ table -> push

    def decide(self, name: str, now: float, *, urgent: bool = False) -> PushEvent | None:
        """Check the last push, then maybe push a new table. Never raises for server trouble.

        `urgent` (a reaction to a change of load or acceptance): the after-push check of a push
        still in its window is settled on the evidence so far and the dwell time is waived."""
        st = self.targets[name]
        with st.lock:
            if self.frozen is not None:
                return self._keep_frozen(st, now)
            if st.pending is not None:
                event = self._check_pending(st, now, early=urgent)
                if event is not None or st.pending is not None:
                    return event
            return self._maybe_push(st, now, urgent=urgent)

    def _keep_frozen(self, st: TargetState, now: float) -> PushEvent | None:
        assert self.frozen is not None
        if now < st.refused_until:
            return None
        live = self._read_live(st)
        if live is None:
            return None
        if same_tiers(live.table, self.frozen):
            return None
        try:
            table = PolicyTable.build(
                self.frozen.tiers, self.frozen.version, captured_depths=live.captured_depths
            )
        except PolicyError as err:
            reason = f"frozen table does not fit this server: {err}"
            self._note_refusal(st, now, reason)
            return None
        reason = (
            "frozen policy re-pushed (server restarted or table changed)"
            if st.last_push_t is not None
            else "frozen policy"
        )
        clash = self._version_clash(st, table)
        if clash:
            reason += f"; {clash}"
            log.warning("%s: %s", st.name, clash)
        return self._push(
            st, now, table, kind="frozen", reason=reason, predicted=None, rule="frozen"
        )

    def _version_clash(self, st: TargetState, table: PolicyTable) -> str:
        """A sentence if this store already pushed another table under the same version."""
        for record in self.store.pushes(st.name):
            old = None if record.table is None else _table(record.table)
            if old is not None and old.version == table.version and not same_tiers(old, table):
                return (
                    f"version {table.version} also named {old.label()} pushed at "
                    f"t={record.t:.0f}; tell them apart by fingerprint (#{table.fingerprint})"
                )
        return ""

    def _maybe_push(self, st: TargetState, now: float, *, urgent: bool = False) -> PushEvent | None:
        g = self.config.guardrails
        if now < st.refused_until:
            return None
        if not urgent and st.last_push_t is not None and now - st.last_push_t < g.min_dwell_s:
            return None
        gm = self.groups[st.cfg.group]
        if gm.learner is None or gm.fitted_at is None:
            return None
        live = self._read_live(st)
        if live is None:
            return None
        hist = self.batch_histogram(st, now)
        current = self.batch_histogram(st, now, window_s=CURRENT_LOAD_S)
        # The server's own choice, as measured: the first table keeps it unless the model
        # predicts takeover_min_gain more (controller/daemon/takeover.py). A shape server's
        # own choice is its start-up shape, which its learner knows.
        chains_only = not live.captured_trees
        incumbent = measured_choice(st.recent) if live.table is None and chains_only else None
        # A table someone else chose (found on the server, set by hand, loaded from a policy
        # file) is replaced only for a predicted gain: the model's wish for probes is no
        # evidence against it. Until then it runs with its own probes, if any, and the
        # daemon learns from what it runs.
        keep_found = self._foreign(st, live.table)
        try:
            with gm.lock:
                proposal = gm.learner.propose(
                    now,
                    live.table,
                    hist or None,
                    max_batch=live.max_running,
                    incumbent=incumbent,
                    incumbent_margin=g.takeover_min_gain,
                    focus=current if urgent else None,
                )
        except Exception as err:
            log.exception("%s: learner could not propose a table: %s", st.name, err)
            return None
        self._note_prediction(st, proposal.predicted_tok_per_s, proposal.exploration_share, hist)
        st.decided_hist = {b: max(hist.get(b, 0.0), current.get(b, 0.0)) for b in hist | current}
        if not proposal.predicted_tok_per_s:
            # The model cannot predict yet (no depth has enough evidence): a table now would be
            # a guess. Keep what runs; its per-depth counters are the evidence that warms it up.
            log.debug("%s: no prediction yet (%s); not pushing", st.name, proposal.reason)
            return None
        if live.table is None and not self._takeover_ok(
            st, now, proposal.predicted_tok_per_s, hist
        ):
            return None
        try:
            table = (restrict_to_captured(proposal.table, live.captured_depths) if chains_only
                     else PolicyTable.build(proposal.table.tiers, proposal.table.version,
                                            live.captured_depths,
                                            captured_trees(live)))
            # A reaction follows the load to where the live table had no evidence: the
            # boundary clamp (there against one bad fit) would only hold the old thresholds.
            table, clamped = (
                (table, False) if urgent else bound_change(live.table, table, g.max_boundary_move)
            )
        except (PolicyError, ValueError) as err:
            log.warning("%s: proposal dropped by guardrails: %s", st.name, err)
            return None
        if same_tiers(table, live.table):
            return None
        key = _tiers_key(table)
        if st.quarantine.get(key, float("-inf")) > now:
            return None
        learner = gm.learner
        try:
            with gm.lock:
                gate = decide_push(
                    table,
                    live.table,
                    {"recent": hist, "current": current},
                    lambda a, b, h, probes: learner.predicted_gain(a, b, dict(h), probes=probes),
                    g.push_min_gain,
                    float(getattr(getattr(learner, "config", None), "exploration_cap", 0.03)),
                    gain_only=keep_found,
                )
        except Exception as err:  # a learner bug must not stop the loop
            log.exception("%s: learner could not weigh the table: %s", st.name, err)
            return None
        if not gate.push:
            log.debug("%s: not pushing: %s", st.name, gate.why)
            return None
        version = max(st.pushed_version, live.table.version if live.table else 0) + 1
        table = PolicyTable.build(table.tiers, version=version)
        reason = proposal.reason + (" (boundary move clamped)" if clamped else "")
        if live.table is not None:
            reason += f"; push: {gate.why}"
        if urgent and st.react_reason:
            reason += f"; reacting: {st.react_reason}"
        predicted = {str(k): round(v, 3) for k, v in proposal.predicted_tok_per_s.items()}
        return self._push(
            st, now, table, kind="learned", reason=reason, predicted=predicted, rule=gate.rule
        )

    def _push(
        self,
        st: TargetState,
        now: float,
        table: PolicyTable | None,
        *,
        kind: str,
        reason: str,
        predicted: dict[str, Any] | None,
        rule: str = "",
    ) -> PushEvent:
        if st.found is None and not st.pushed_this_run:
            self._read_live(st)  # what the server ran before this run's first push
        old = st.live.table if st.live is not None else None
        result = send_table(st.transport, table, st.push_key)
        self.metrics.push_reasons.labels(st.name, rule or kind).inc()
        outcome, detail = result.outcome, result.detail
        if result.applied and self.config.guardrails.verify:
            ok, why = verify_table(st.transport, table)
            if not ok:
                outcome, detail = "unverified", why
        if result.applied and outcome == "applied" and kind == "learned":
            outcome = "pending"  # until the after-push check passes
        push_id = self.store.add_push(
            t=now,
            target=st.name,
            kind=kind,
            table=None if table is None else table.to_json(),
            reason=reason,
            predicted=predicted,
            outcome=outcome,
            detail=detail,
        )
        self.metrics.pushes.labels(st.name, outcome).inc()
        if result.applied:
            st.last_push_t = now
            st.pushed_this_run = True
            if table is not None:
                st.pushed_version = max(st.pushed_version, table.version)
                self.metrics.policy_version.labels(st.name).set(table.version)
                if kind == "learned":
                    st.own_tables.add(_tiers_key(table))
            if outcome != "unverified":  # read back: it is what the server runs now
                self._live_gauges(st, table)
            st.live = None
            if outcome == "pending" and table is not None:
                st.pending = PendingCheck(push_id, now, old, table)
        else:
            self._note_refusal(st, now, detail)
        desc = "release (SGLang's own choice)" if table is None else table.describe()
        # A learned reason already opens with the table's summary: say it once.
        why = reason[len(desc) :].lstrip("; ") if reason.startswith(desc) else reason
        version = "" if table is None else f" {table.label()}"
        log.info(
            "push %s [%s]%s %s -> %s; %s | %s", st.name, kind, version, desc, outcome, why, detail
        )
        event = PushEvent(now, st.name, kind, outcome, table, reason)
        self.events.append(event)
        return event

    def _note_refusal(self, st: TargetState, now: float, detail: str) -> None:
        # Never retry in a tight loop: wait refused_backoff_s before the next attempt.
        st.refused_until = now + self.config.guardrails.refused_backoff_s
        log.warning(
            "%s: push refused (%s); next attempt in %.0f s",
            st.name,
            detail,
            self.config.guardrails.refused_backoff_s,
        )

    def _check_pending(self, st: TargetState, now: float, early: bool = False) -> PushEvent | None:
        """Settle the after-push check once its window is over. `early` (a reaction): settle
        it now if the evidence so far already decides it (matched buckets with
        `rollback_min_iterations` on both sides), or if the push predates the change of load or
        acceptance being reacted to (its before/after comparison is then moot); otherwise it
        stays pending and nothing new is pushed."""
        g = self.config.guardrails
        p = st.pending
        assert p is not None
        changed = changed_buckets(p.old, p.new)
        if not changed:
            # Only probes changed: no decision to judge, nothing to roll back (their cost is
            # bounded by the cap), so the next table need not wait for the window.
            st.pending = None
            self.store.set_push_outcome(p.push_id, "good", "probes only: no decision changed")
            return None
        in_window = now < p.t + g.rollback_window_s
        if in_window and not early:
            return None
        before = [s for s in st.recent if p.t - g.rollback_window_s < s.t_end <= p.t]
        # The first interval after a push mixes both tables; skip it.
        after = [
            s for s in st.recent if p.t + self.config.schedule.scrape_interval_s < s.t_end <= now
        ]
        cmp = compare_after_push(before, after, changed, g.rollback_min_iterations)
        drop = cmp.drop
        moot = st.react_kind in ("load", "acceptance") and p.t < st.react_since
        if in_window and drop is None and not moot:
            return None  # too early to call and not superseded: keep waiting
        st.pending = None
        if drop is None or drop <= g.rollback_drop:
            if drop is None:
                note = "no matched buckets to compare"
            else:
                note = f"measured change {-drop:+.1%} at buckets {list(cmp.matched_buckets)}"
            if in_window:
                note += f" (settled early: {st.react_reason})"
            self.store.set_push_outcome(p.push_id, "good", note)
            return None
        reason = (
            f"rollback: measured tok/s at matched buckets {list(cmp.matched_buckets)} fell "
            f"{drop:.1%} after push v{p.new.version} "
            f"({cmp.before_tok_per_s:.1f} -> {cmp.after_tok_per_s:.1f})"
        )
        self.store.set_push_outcome(p.push_id, "rolled_back", reason)
        self.metrics.rollbacks.labels(st.name).inc()
        st.quarantine[_tiers_key(p.new)] = now + 5 * max(g.min_dwell_s, g.rollback_window_s)
        back = p.old
        if back is not None:
            back = PolicyTable.build(back.tiers, version=st.pushed_version + 1)
        self.store.add_rollback(
            t=now,
            target=st.name,
            push_id=p.push_id,
            from_table=p.new.to_json(),
            to_table=None if back is None else back.to_json(),
            reason=reason,
            before_tok_per_s=cmp.before_tok_per_s,
            after_tok_per_s=cmp.after_tok_per_s,
        )
        return self._push(
            st, now, back, kind="rollback", reason=reason, predicted=None, rule="rollback"
        )

    def _takeover_ok(
        self, st: TargetState, now: float, predicted: dict[int, float], hist: dict[int, float]
    ) -> bool:
        """Replace the server's own choice only for a predicted, measurable gain (or after
        takeover_max_wait_s, so that depths it never runs can be probed)."""
        g = self.config.guardrails
        if st.first_fit_seen is None:
            st.first_fit_seen = now
        if now - st.first_fit_seen >= g.takeover_max_wait_s:
            return True  # at once by default: the learner's probes need a table to run in
        window = [s for s in st.recent if s.t_end > now - 2 * g.rollback_window_s]
        measured = bucket_rates(window)
        common = [b for b in hist if b in predicted and b in measured]
        if not common:
            return False
        pred = sum(hist[b] * predicted[b] for b in common)
        meas = sum(hist[b] * measured[b].tok_per_s for b in common)
        gain = pred / meas - 1.0 if meas > 0 else 0.0
        if gain < g.takeover_min_gain:
            log.debug(
                "%s: predicted gain %+.1f%% over the server's own choice; waiting",
                st.name,
                100 * gain,
            )
            return False
        return True

    # ------------------------------------------------------------------ load and gauges

    def batch_histogram(
        self, st: TargetState, now: float, window_s: float = RECENT_LOAD_S
    ) -> dict[int, float]:
        """Share of decode time per batch bucket over the recent window (the load seen)."""
        acc: dict[int, float] = {}
        for s in st.recent:
            if s.t_end > now - window_s:
                acc[s.bs_bucket] = acc.get(s.bs_bucket, 0.0) + s.gpu_seconds
        total = sum(acc.values())
        return {b: v / total for b, v in sorted(acc.items())} if total > 0 else {}

    def _note_prediction(
        self,
        st: TargetState,
        predicted: dict[int, float],
        exploration_share: float,
        hist: dict[int, float],
    ) -> None:
        st.predicted = dict(predicted)
        m = self.metrics
        m.exploration_share.labels(st.name).set(exploration_share)
        shares = {b: w for b, w in hist.items() if b in predicted}
        if shares:
            total = sum(shares.values())
            m.predicted.labels(st.name).set(
                sum(w * predicted[b] for b, w in shares.items()) / total
            )
        recent = [s for s in st.recent if s.t_end > (st.snapshot_t or 0) - 60.0]
        gpu = sum(s.gpu_seconds for s in recent)
        if gpu > 0:
            m.measured.labels(st.name).set(sum(s.tokens for s in recent) / gpu)

    # ------------------------------------------------------------------ simulated-clock driver

    def step(self, now: float, *, fit_due: bool, decide_due: bool) -> list[PushEvent]:
        """One tick of the simulated clock: scrape every target, then fit and decide if due
        (at once, for a target whose load or acceptance just moved: `react`)."""
        reacting = [
            name for name in self.targets if self.needs_reaction(name, now, self.scrape(name, now))
        ]
        groups = {self.targets[name].cfg.group for name in reacting}
        for group in self.groups:
            if fit_due or group in groups:
                self.fit(group, now)
        events = []
        for name in self.targets:
            if decide_due or name in reacting:
                event = self.decide(name, now, urgent=name in reacting)
                if event is not None:
                    events.append(event)
        return events

    def react(self, name: str, now: float, samples: Sequence[Sample]) -> PushEvent | None:
        """After a scrape on real time: refit and decide at once if the load or acceptance
        moved (see controller/daemon/reaction.py)."""
        if not self.needs_reaction(name, now, samples):
            return None
        self.fit(self.targets[name].cfg.group, now)
        return self.decide(name, now, urgent=True)

    def needs_reaction(self, name: str, now: float, samples: Sequence[Sample]) -> bool:
        """Whether this scrape starts (or falls inside) a reaction window."""
        st = self.targets[name]
        g = self.config.guardrails
        if self.frozen is not None or g.react_window_s <= 0:
            return False
        if not samples:
            return now < st.react_until
        gm = self.groups[st.cfg.group]
        if gm.learner is None and st.decided_hist:
            return False
        kind, why = "", ""
        current = decode_time_histogram(samples)
        if not st.decided_hist:
            kind, why = "first", "first evidence"
        elif novel_share(current, st.decided_hist) >= g.novel_load_share:
            kind, why = "load", "load moved to batch buckets the live table was not decided on"
        else:
            why = self._acceptance_moved(gm, samples)
            kind = "acceptance" if why else ""
        if why:
            if now >= st.react_until:
                log.info(
                    "%s: %s; re-deciding after every scrape for %.0f s",
                    st.name,
                    why,
                    g.react_window_s,
                )
            if now >= st.react_until or kind != st.react_kind:
                st.react_since = now
            st.react_until = now + g.react_window_s
            st.react_kind, st.react_reason = kind, why
        return now < st.react_until

    def _acceptance_moved(self, gm: GroupModel, samples: Sequence[Sample]) -> str:
        acceptance = getattr(gm.learner, "acceptance", None)
        config = getattr(gm.learner, "config", None)
        if acceptance is None or config is None:
            return ""
        z = acceptance_surprise(
            samples,
            acceptance.mean_length,
            acceptance.std_length,
            config.acceptance_dispersion,
            config.drift_min_shift,
        )
        if z < self.config.guardrails.react_acceptance_z:
            return ""
        return f"acceptance moved ({z:.1f} standard errors from the model)"

    # ------------------------------------------------------------------ exit

    def hand_back(self, now: float) -> list[str]:
        """On exit: leave every server the daemon pushed to in this run (and any whose live
        table probes) as `on_exit` says, never with probes (controller/daemon/handback.py).
        One log line per target, returned too; never raises, whatever the server does."""
        lines = []
        for st in self.targets.values():
            with st.lock:
                try:
                    line, done = self._hand_back_one(st, now)
                except Exception as err:  # the exit must finish for the other targets too
                    line, done = f"hand-back {st.name}: failed ({type(err).__name__}: {err})", False
            (log.info if done else log.warning)(line)
            lines.append(line)
        return lines

    def _hand_back_one(self, st: TargetState, now: float) -> tuple[str, bool]:
        mode = self.config.on_exit
        name = f"hand-back {st.name}"
        try:
            live = read_live(st.transport)
        except ServerStateError as err:
            return f"{name}: not reached ({err}); on_exit {mode} not applied", False
        st.live = live
        if not st.pushed_this_run and not has_probes(live.table):
            return f"{name}: left {describe(live.table)} as found (no push in this run)", True
        found_version = 0 if st.found is None or st.found.table is None else st.found.table.version
        live_version = 0 if live.table is None else live.table.version
        version = max(st.pushed_version, live_version, found_version) + 1
        table = exit_table(mode, st.found, live.table, version)
        what = _exit_choice(mode, st.found, table)
        if same_tiers(table, live.table):
            return f"{name}: left {describe(live.table)}{what} (on_exit {mode}; already live)", True
        result = send_table(st.transport, table, st.push_key)
        outcome, detail = result.outcome, result.detail
        if result.applied and self.config.guardrails.verify:
            ok, why = verify_table(st.transport, table)
            if not ok:
                outcome, detail = "unverified", why
        reason = f"on_exit {mode}{what}; was {describe(live.table)}"
        self.metrics.push_reasons.labels(st.name, "handback").inc()
        self.metrics.pushes.labels(st.name, outcome).inc()
        try:
            self.store.add_push(
                t=now,
                target=st.name,
                kind="handback",
                table=None if table is None else table.to_json(),
                reason=reason,
                predicted=None,
                outcome=outcome,
                detail=detail,
            )
            if result.applied and st.pending is not None:
                self.store.set_push_outcome(
                    st.pending.push_id, "unchecked", "the daemon stopped before its check"
                )
        except sqlite3.Error as err:
            log.warning("%s: hand-back not recorded in the store: %s", st.name, err)
        if not result.applied:
            return f"{name}: could not leave {describe(table)} ({outcome}: {detail})", False
        st.pending = None
        self._live_gauges(st, table)
        self.metrics.handback.labels(st.name, "release" if table is None else "table").set(now)
        left = f"{describe(table)}{what} (on_exit {mode}); was {describe(live.table)}"
        return f"{name}: left {left} | {detail}", True

    def close(self) -> None:
        for st in self.targets.values():
            st.transport.close()
            close = getattr(st.source, "close", None)
            if close is not None:
                close()


def _exit_choice(mode: str, found: Found | None, table: PolicyTable | None) -> str:
    """Why the hand-back leaves `table`, as words that follow it (`left X, as found ...`)."""
    if mode == "release":
        return ""
    if found is None:
        return ", the live table without probes (the server was not read at start-up)"
    if found.table is None:
        if table is None:
            return ", as found at start-up"
        return ", the daemon's own table without probes (no table was found at start-up)"
    return ", as found at start-up" + ("" if table == found.table else " but without probes")


def _tiers_key(table: PolicyTable) -> tuple[Any, ...]:
    return tuple(table.tiers)


def _table(data: dict[str, Any]) -> PolicyTable | None:
    try:
        return parse_table(data)
    except PolicyError:
        return None


def group_members(config: ControllerConfig) -> dict[str, Sequence[str]]:
    out: dict[str, list[str]] = {}
    for t in config.targets:
        out.setdefault(t.group, []).append(t.name)
    return {k: tuple(v) for k, v in out.items()}


def served_shapes(live: LiveState) -> list[str]:
    """Every shape a shape server runs: its captured chains and off, then its trees."""
    chains = [label(chain(d)) for d in sorted(live.captured_depths)]
    return chains + [t for t in live.captured_trees if t not in chains]


def captured_trees(live: LiveState) -> list[DraftShape]:
    return [t for t in map(parse_shape, live.captured_trees) if isinstance(t, DraftShape)]
