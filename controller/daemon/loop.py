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

from controller.daemon.config import ControllerConfig, TargetConfig
from controller.daemon.frozen import load_frozen_policy
from controller.daemon.guardrails import (
    bound_change,
    bucket_rates,
    changed_buckets,
    compare_after_push,
    restrict_to_captured,
)
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
from controller.daemon.scrape import ScrapeError, build_samples, counter_deltas
from controller.daemon.sources import CounterSource, MetricsPageSource, PrometheusSource
from controller.daemon.store import Store
from controller.daemon.transport import ServerTransport
from models.samples import Sample
from sglang_hooks.contract import PolicyError, PolicyTable, parse_table

log = logging.getLogger("specctl.daemon")

RECENT_LOAD_S = 600.0  # window of the batch histogram handed to the learner


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
            if tc.group not in self.groups:
                self.groups[tc.group] = GroupModel(
                    tc.group, dict(config.learner), config.seed, learner_factory
                )
        # Resume learning: reload the recent samples of every group and target.
        for group in self.groups.values():
            last = store.last_sample_time(group=group.group)
            if last is not None:
                since = last - config.schedule.history_s
                group.add([s for _, s in store.samples(group=group.group, since=since)])
        for st in self.targets.values():
            last = store.last_sample_time(target=st.name)
            if last is not None:
                rows = store.samples(target=st.name, since=last - self._recent_horizon_s())
                st.recent = [s for _, s in rows]

    def _restore_push_state(self, state: TargetState) -> None:
        records = self.store.pushes(state.name)
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
            captured = self._captured_for_group(group)
            if captured is None:
                return False
            snap = self.store.latest_learner_snapshot(group)
            gm.ensure_learner(captured, None if snap is None else snap[2])
        try:
            fitted = gm.fit(now, self.config.schedule.history_s)
        except Exception as err:  # a learner bug must not stop scraping or other groups
            self.metrics.fit_errors.labels(group).inc()
            log.exception("%s: learner fit failed: %s", group, err)
            return False
        if fitted:
            self.metrics.fits.labels(group).inc()
            assert gm.learner is not None
            try:
                self.store.add_learner_snapshot(
                    now, group, gm.learner.version, gm.learner.to_json()
                )
            except (sqlite3.Error, TypeError, ValueError) as err:
                log.warning("%s: learner snapshot not stored: %s", group, err)
        return fitted

    def _captured_for_group(self, group: str) -> tuple[int, ...] | None:
        for st in self.targets.values():
            if st.cfg.group != group:
                continue
            live = self._read_live(st)
            if live is not None and live.captured_depths:
                return live.captured_depths
        return None

    def _read_live(self, st: TargetState) -> LiveState | None:
        try:
            st.live = read_live(st.transport)
        except ServerStateError as err:
            log.warning("%s: %s", st.name, err)
            return None
        return st.live

    # ------------------------------------------------------------------ table -> push

    def decide(self, name: str, now: float) -> PushEvent | None:
        """Check the last push, then maybe push a new table. Never raises for server trouble."""
        st = self.targets[name]
        with st.lock:
            if self.frozen is not None:
                return self._keep_frozen(st, now)
            if st.pending is not None:
                event = self._check_pending(st, now)
                if event is not None or st.pending is not None:
                    return event
            return self._maybe_push(st, now)

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
        return self._push(st, now, table, kind="frozen", reason=reason, predicted=None)

    def _maybe_push(self, st: TargetState, now: float) -> PushEvent | None:
        g = self.config.guardrails
        if now < st.refused_until:
            return None
        if st.last_push_t is not None and now - st.last_push_t < g.min_dwell_s:
            return None
        gm = self.groups[st.cfg.group]
        if gm.learner is None or gm.fitted_at is None:
            return None
        live = self._read_live(st)
        if live is None:
            return None
        hist = self.batch_histogram(st, now)
        try:
            with gm.lock:
                proposal = gm.learner.propose(now, live.table, hist or None)
        except Exception as err:
            log.exception("%s: learner could not propose a table: %s", st.name, err)
            return None
        self._note_prediction(st, proposal.predicted_tok_per_s, proposal.exploration_share, hist)
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
            table = restrict_to_captured(proposal.table, live.captured_depths)
            table, clamped = bound_change(live.table, table, g.max_boundary_move)
        except (PolicyError, ValueError) as err:
            log.warning("%s: proposal dropped by guardrails: %s", st.name, err)
            return None
        if same_tiers(table, live.table):
            return None
        key = _tiers_key(table)
        if st.quarantine.get(key, float("-inf")) > now:
            return None
        version = max(st.pushed_version, live.table.version if live.table else 0) + 1
        table = PolicyTable.build(table.tiers, version=version)
        reason = proposal.reason + (" (boundary move clamped)" if clamped else "")
        predicted = {str(k): round(v, 3) for k, v in proposal.predicted_tok_per_s.items()}
        return self._push(st, now, table, kind="learned", reason=reason, predicted=predicted)

    def _push(
        self,
        st: TargetState,
        now: float,
        table: PolicyTable | None,
        *,
        kind: str,
        reason: str,
        predicted: dict[str, Any] | None,
    ) -> PushEvent:
        old = st.live.table if st.live is not None else None
        result = send_table(st.transport, table, st.push_key)
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
            if table is not None:
                st.pushed_version = max(st.pushed_version, table.version)
                self.metrics.policy_version.labels(st.name).set(table.version)
            st.live = None
            if outcome == "pending" and table is not None:
                st.pending = PendingCheck(push_id, now, old, table)
        else:
            self._note_refusal(st, now, detail)
        desc = "release (SGLang's own choice)" if table is None else table.describe()
        # A learned reason already opens with the table's summary: say it once.
        why = reason[len(desc) :].lstrip("; ") if reason.startswith(desc) else reason
        version = "" if table is None else f" v{table.version}"
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

    def _check_pending(self, st: TargetState, now: float) -> PushEvent | None:
        g = self.config.guardrails
        p = st.pending
        assert p is not None
        if now < p.t + g.rollback_window_s:
            return None
        st.pending = None
        before = [s for s in st.recent if p.t - g.rollback_window_s < s.t_end <= p.t]
        # The first interval after a push mixes both tables; skip it.
        after = [
            s for s in st.recent if p.t + self.config.schedule.scrape_interval_s < s.t_end <= now
        ]
        cmp = compare_after_push(
            before, after, changed_buckets(p.old, p.new), g.rollback_min_iterations
        )
        drop = cmp.drop
        if drop is None or drop <= g.rollback_drop:
            note = (
                "no matched buckets to compare"
                if drop is None
                else f"measured change {-drop:+.1%} at buckets {list(cmp.matched_buckets)}"
            )
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
        return self._push(st, now, back, kind="rollback", reason=reason, predicted=None)

    def _takeover_ok(
        self, st: TargetState, now: float, predicted: dict[int, float], hist: dict[int, float]
    ) -> bool:
        """Replace the server's own choice only for a predicted, measurable gain (or after
        takeover_max_wait_s, so that depths it never runs can be probed)."""
        g = self.config.guardrails
        if st.first_fit_seen is None:
            st.first_fit_seen = now
        if now - st.first_fit_seen >= g.takeover_max_wait_s:
            return True
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

    def batch_histogram(self, st: TargetState, now: float) -> dict[int, float]:
        """Share of decode time per batch bucket over the recent window (the load seen)."""
        acc: dict[int, float] = {}
        for s in st.recent:
            if s.t_end > now - RECENT_LOAD_S:
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
        """One tick of the simulated clock: scrape every target, then fit and decide if due."""
        for name in self.targets:
            self.scrape(name, now)
        if fit_due:
            for group in self.groups:
                self.fit(group, now)
        events = []
        if decide_due:
            for name in self.targets:
                event = self.decide(name, now)
                if event is not None:
                    events.append(event)
        return events

    def close(self) -> None:
        for st in self.targets.values():
            st.transport.close()
            close = getattr(st.source, "close", None)
            if close is not None:
                close()


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
