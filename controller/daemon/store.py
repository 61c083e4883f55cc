"""Store: samples, counter snapshots, pushes, rollbacks and learner snapshots in SQLite.

Durability: WAL journal, `synchronous=NORMAL` (a committed transaction survives the process
being killed; only a power loss can drop the last ones). A scrape's samples and the counter
snapshot they were computed against are written in ONE transaction, so a daemon killed at any
instant either stored both or neither: after a restart the next scrape's delta starts from the
last stored snapshot and no interval is counted twice or lost (beyond the one in flight).

The schema is versioned: `schema_migrations` records each applied migration; `MIGRATIONS` only
ever grows.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from models.samples import Sample

MIGRATIONS: tuple[tuple[int, str, str], ...] = (
    (
        1,
        "initial schema",
        """
        CREATE TABLE samples (
            id INTEGER PRIMARY KEY,
            grp TEXT NOT NULL,
            target TEXT NOT NULL,
            t_end REAL NOT NULL,
            interval_s REAL NOT NULL,
            depth INTEGER NOT NULL,
            bs_bucket INTEGER NOT NULL,
            iterations REAL NOT NULL,
            request_steps REAL NOT NULL,
            tokens REAL NOT NULL,
            gpu_seconds REAL NOT NULL,
            explore_iterations REAL NOT NULL DEFAULT 0
        );
        CREATE INDEX samples_group_t ON samples (grp, t_end);
        CREATE INDEX samples_target_t ON samples (target, t_end);
        CREATE TABLE counter_snapshots (
            target TEXT PRIMARY KEY,
            t REAL NOT NULL,
            values_json TEXT NOT NULL
        );
        CREATE TABLE pushes (
            id INTEGER PRIMARY KEY,
            t REAL NOT NULL,
            target TEXT NOT NULL,
            kind TEXT NOT NULL,
            table_json TEXT,
            reason TEXT NOT NULL,
            predicted_json TEXT,
            outcome TEXT NOT NULL,
            detail TEXT
        );
        CREATE INDEX pushes_target_t ON pushes (target, t);
        CREATE TABLE rollbacks (
            id INTEGER PRIMARY KEY,
            t REAL NOT NULL,
            target TEXT NOT NULL,
            push_id INTEGER,
            from_table_json TEXT,
            to_table_json TEXT,
            reason TEXT NOT NULL,
            before_tok_per_s REAL,
            after_tok_per_s REAL
        );
        CREATE TABLE learner_snapshots (
            id INTEGER PRIMARY KEY,
            t REAL NOT NULL,
            grp TEXT NOT NULL,
            learner_version TEXT NOT NULL,
            state_json TEXT NOT NULL
        );
        CREATE INDEX learner_snapshots_group ON learner_snapshots (grp, t);
        """,
    ),
    (
        2,
        "a shape server's tree samples",
        "ALTER TABLE samples ADD COLUMN tree TEXT NOT NULL DEFAULT '';",
    ),
)

SCHEMA_VERSION = MIGRATIONS[-1][0]

_SAMPLE_COLUMNS = (
    "grp, target, t_end, interval_s, depth, bs_bucket, iterations, request_steps, tokens, "
    "gpu_seconds, explore_iterations, tree"
)
_INSERT_SAMPLE = (
    f"INSERT INTO samples ({_SAMPLE_COLUMNS}) "
    f"VALUES ({','.join('?' * len(_SAMPLE_COLUMNS.split(',')))})"
)


@dataclass(frozen=True)
class PushRecord:
    id: int
    t: float
    target: str
    kind: str  # "learned" | "rollback" | "frozen" | "handback" (at exit)
    table: dict[str, Any] | None
    reason: str
    predicted: dict[str, Any] | None
    outcome: str
    detail: str | None


class StoreError(RuntimeError):
    pass


class Store:
    """One SQLite file; safe to share between the scheduler's threads (one lock)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = sqlite3.connect(
                self.path, check_same_thread=False, isolation_level=None, timeout=10.0
            )
        except sqlite3.Error as err:
            raise StoreError(f"cannot open store {self.path}: {err}") from err
        self._lock = threading.Lock()
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._migrate()

    # ------------------------------------------------------------------ schema

    def _migrate(self) -> None:
        with self._lock:
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations ("
                "version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
            )
            done = {r[0] for r in self._db.execute("SELECT version FROM schema_migrations")}
            if done and max(done) > SCHEMA_VERSION:
                raise StoreError(
                    f"{self.path} has schema version {max(done)}, newer than this specctl "
                    f"({SCHEMA_VERSION}); upgrade specctl or point store.path elsewhere"
                )
            for version, name, sql in MIGRATIONS:
                if version in done:
                    continue
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    for stmt in sql.split(";"):
                        if stmt.strip():
                            self._db.execute(stmt)
                    self._db.execute(
                        "INSERT INTO schema_migrations VALUES (?, ?, ?)",
                        (version, name, time.time()),
                    )
                    self._db.execute("COMMIT")
                except BaseException:
                    self._db.execute("ROLLBACK")
                    raise

    def schema_version(self) -> int:
        with self._lock:
            row = self._db.execute("SELECT MAX(version) FROM schema_migrations").fetchone()
        return int(row[0] or 0)

    # ------------------------------------------------------------------ samples + snapshots

    def record_scrape(
        self,
        target: str,
        t: float,
        samples: Sequence[Sample],
        snapshot: dict[str, float],
    ) -> None:
        """Store a scrape's samples and the snapshot they were taken against, atomically."""
        self._insert(samples, (target, t, json.dumps(snapshot, sort_keys=True)))

    def add_samples(self, samples: Sequence[Sample]) -> None:
        """Samples that came from no scrape (a bench's levels), in one transaction; the
        counter snapshot the next scrape's deltas start from is left as it is."""
        self._insert(samples, None)

    def _insert(self, samples: Sequence[Sample], snapshot: tuple[str, float, str] | None) -> None:
        rows = [_sample_row(s) for s in samples]
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany(_INSERT_SAMPLE, rows)
                if snapshot is not None:
                    self._db.execute(
                        "INSERT INTO counter_snapshots VALUES (?, ?, ?) ON CONFLICT(target) "
                        "DO UPDATE SET t = excluded.t, values_json = excluded.values_json",
                        snapshot,
                    )
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def load_snapshot(self, target: str) -> tuple[float, dict[str, float]] | None:
        with self._lock:
            row = self._db.execute(
                "SELECT t, values_json FROM counter_snapshots WHERE target = ?", (target,)
            ).fetchone()
        if row is None:
            return None
        return float(row[0]), {k: float(v) for k, v in json.loads(row[1]).items()}

    def samples(
        self,
        *,
        group: str | None = None,
        target: str | None = None,
        since: float | None = None,
        after_id: int = 0,
    ) -> list[tuple[int, Sample]]:
        """Stored samples (with their row id), oldest first."""
        where, args = ["id > ?"], [after_id]
        if group is not None:
            where.append("grp = ?")
            args.append(group)  # type: ignore[arg-type]
        if target is not None:
            where.append("target = ?")
            args.append(target)  # type: ignore[arg-type]
        if since is not None:
            where.append("t_end > ?")
            args.append(since)  # type: ignore[arg-type]
        sql = f"SELECT id, {_SAMPLE_COLUMNS} FROM samples WHERE {' AND '.join(where)} ORDER BY id"
        with self._lock:
            rows = self._db.execute(sql, args).fetchall()
        return [(int(r[0]), Sample(*r[1:])) for r in rows]

    def last_sample_time(
        self, *, group: str | None = None, target: str | None = None
    ) -> float | None:
        col, value = ("grp", group) if group is not None else ("target", target)
        with self._lock:
            row = self._db.execute(
                f"SELECT MAX(t_end) FROM samples WHERE {col} = ?", (value,)
            ).fetchone()
        return None if row[0] is None else float(row[0])

    def count_samples(self, target: str | None = None) -> int:
        with self._lock:
            if target is None:
                row = self._db.execute("SELECT COUNT(*) FROM samples").fetchone()
            else:
                row = self._db.execute(
                    "SELECT COUNT(*) FROM samples WHERE target = ?", (target,)
                ).fetchone()
        return int(row[0])

    def totals(self, target: str) -> dict[str, float]:
        """Sums of every counter delta ever stored for a target (for loss checks)."""
        with self._lock:
            row = self._db.execute(
                "SELECT COALESCE(SUM(iterations),0), COALESCE(SUM(request_steps),0), "
                "COALESCE(SUM(tokens),0), COALESCE(SUM(gpu_seconds),0) FROM samples "
                "WHERE target = ?",
                (target,),
            ).fetchone()
        return dict(zip(("iterations", "request_steps", "tokens", "gpu_seconds"), row, strict=True))

    # ------------------------------------------------------------------ pushes (audit trail)

    def add_push(
        self,
        *,
        t: float,
        target: str,
        kind: str,
        table: dict[str, Any] | None,
        reason: str,
        predicted: dict[str, Any] | None,
        outcome: str,
        detail: str | None = None,
    ) -> int:
        with self._lock:
            cur = self._db.execute(
                "INSERT INTO pushes (t, target, kind, table_json, reason, predicted_json, "
                "outcome, detail) VALUES (?,?,?,?,?,?,?,?)",
                (
                    t,
                    target,
                    kind,
                    None if table is None else json.dumps(table, sort_keys=True),
                    reason,
                    None if predicted is None else json.dumps(predicted, sort_keys=True),
                    outcome,
                    detail,
                ),
            )
            return int(cur.lastrowid or 0)

    def set_push_outcome(self, push_id: int, outcome: str, detail: str | None = None) -> None:
        with self._lock:
            self._db.execute(
                "UPDATE pushes SET outcome = ?, detail = COALESCE(?, detail) WHERE id = ?",
                (outcome, detail, push_id),
            )

    def pushes(self, target: str | None = None) -> list[PushRecord]:
        sql = "SELECT * FROM pushes"
        args: tuple[Any, ...] = ()
        if target is not None:
            sql += " WHERE target = ?"
            args = (target,)
        with self._lock:
            rows = self._db.execute(sql + " ORDER BY id", args).fetchall()
        return [
            PushRecord(
                id=r[0],
                t=r[1],
                target=r[2],
                kind=r[3],
                table=None if r[4] is None else json.loads(r[4]),
                reason=r[5],
                predicted=None if r[6] is None else json.loads(r[6]),
                outcome=r[7],
                detail=r[8],
            )
            for r in rows
        ]

    def last_good_table(self, target: str) -> dict[str, Any] | None:
        """The most recent pushed table whose after-push check passed."""
        with self._lock:
            row = self._db.execute(
                "SELECT table_json FROM pushes WHERE target = ? AND outcome = 'good' "
                "ORDER BY id DESC LIMIT 1",
                (target,),
            ).fetchone()
        return None if row is None or row[0] is None else json.loads(row[0])

    def add_rollback(
        self,
        *,
        t: float,
        target: str,
        push_id: int | None,
        from_table: dict[str, Any] | None,
        to_table: dict[str, Any] | None,
        reason: str,
        before_tok_per_s: float | None,
        after_tok_per_s: float | None,
    ) -> None:
        with self._lock:
            self._db.execute(
                "INSERT INTO rollbacks (t, target, push_id, from_table_json, to_table_json, "
                "reason, before_tok_per_s, after_tok_per_s) VALUES (?,?,?,?,?,?,?,?)",
                (
                    t,
                    target,
                    push_id,
                    None if from_table is None else json.dumps(from_table),
                    None if to_table is None else json.dumps(to_table),
                    reason,
                    before_tok_per_s,
                    after_tok_per_s,
                ),
            )

    def count_rollbacks(self, target: str | None = None) -> int:
        with self._lock:
            if target is None:
                row = self._db.execute("SELECT COUNT(*) FROM rollbacks").fetchone()
            else:
                row = self._db.execute(
                    "SELECT COUNT(*) FROM rollbacks WHERE target = ?", (target,)
                ).fetchone()
        return int(row[0])

    # ------------------------------------------------------------------ learner snapshots

    def add_learner_snapshot(self, t: float, group: str, version: str, state: Any) -> None:
        with self._lock:
            self._db.execute(
                "INSERT INTO learner_snapshots (t, grp, learner_version, state_json) "
                "VALUES (?,?,?,?)",
                (t, group, version, json.dumps(state)),
            )
            # Keep the newest few: a snapshot is a resume point, not a history.
            self._db.execute(
                "DELETE FROM learner_snapshots WHERE grp = ? AND id NOT IN ("
                "SELECT id FROM learner_snapshots WHERE grp = ? ORDER BY id DESC LIMIT 5)",
                (group, group),
            )

    def latest_learner_snapshot(self, group: str) -> tuple[float, str, Any] | None:
        with self._lock:
            row = self._db.execute(
                "SELECT t, learner_version, state_json FROM learner_snapshots WHERE grp = ? "
                "ORDER BY id DESC LIMIT 1",
                (group,),
            ).fetchone()
        return None if row is None else (float(row[0]), str(row[1]), json.loads(row[2]))

    def close(self) -> None:
        with self._lock:
            self._db.close()


def _sample_row(s: Sample) -> tuple[Any, ...]:
    """A sample as the columns of `_SAMPLE_COLUMNS`, in order."""
    return (s.group, s.target, s.t_end, s.interval_s, s.depth, s.bs_bucket, s.iterations,
            s.request_steps, s.tokens, s.gpu_seconds, s.explore_iterations, s.tree)


def samples_only(rows: Iterable[tuple[int, Sample]]) -> list[Sample]:
    return [s for _, s in rows]
