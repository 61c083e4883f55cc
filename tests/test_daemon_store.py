"""Store: a real SQLite file (WAL), versioned schema, atomic scrape records, audit trail."""

from __future__ import annotations

import sqlite3

import pytest

from controller.daemon.store import SCHEMA_VERSION, Store, StoreError
from models.samples import Sample


def _sample(t: float, depth: int = 3, bucket: int = 8) -> Sample:
    return Sample("g", "t", t, 5.0, depth, bucket, 100.0, 900.0, 2200.0, 2.0, 3.0)


def test_scrape_record_round_trips_samples_and_snapshot(tmp_path):
    path = tmp_path / "s.sqlite"
    store = Store(path)
    store.record_scrape("t", 5.0, [_sample(5.0), _sample(5.0, 0, 32)], {"a|1|1|": 3.0})
    store.close()
    reopened = Store(path)  # a new process would see the same
    assert reopened.schema_version() == SCHEMA_VERSION
    assert [s for _, s in reopened.samples(group="g")] == [_sample(5.0), _sample(5.0, 0, 32)]
    assert reopened.load_snapshot("t") == (5.0, {"a|1|1|": 3.0})
    assert reopened.samples(group="g", since=5.0) == []
    assert reopened.last_sample_time(target="t") == 5.0
    mode = sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def test_failed_scrape_record_stores_neither_samples_nor_snapshot(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    store.record_scrape("t", 5.0, [_sample(5.0)], {"k": 1.0})
    bad = Sample("g", "t", 10.0, 5.0, 3, 8, None, 1, 1, 1)  # type: ignore[arg-type]
    with pytest.raises(sqlite3.IntegrityError):
        store.record_scrape("t", 10.0, [_sample(10.0), bad], {"k": 2.0})
    assert store.count_samples() == 1
    assert store.load_snapshot("t") == (5.0, {"k": 1.0})


def test_schema_from_a_newer_specctl_is_refused(tmp_path):
    path = tmp_path / "s.sqlite"
    Store(path).close()
    db = sqlite3.connect(path)
    db.execute("INSERT INTO schema_migrations VALUES (999, 'future', 0)")
    db.commit()
    db.close()
    with pytest.raises(StoreError, match="newer than this specctl"):
        Store(path)


def test_push_audit_trail_and_last_good_table(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    t1 = {"version": 1, "tiers": [{"min_batch": 1, "depth": 3}]}
    t2 = {"version": 2, "tiers": [{"min_batch": 1, "depth": 1}]}
    a = store.add_push(
        t=1,
        target="t",
        kind="learned",
        table=t1,
        reason="r1",
        predicted={"1": 90.0},
        outcome="pending",
    )
    store.set_push_outcome(a, "good", "checked")
    store.add_push(
        t=2,
        target="t",
        kind="learned",
        table=t2,
        reason="r2",
        predicted=None,
        outcome="refused",
        detail="tiers[0].depth: not captured",
    )
    assert store.last_good_table("t") == t1
    recs = store.pushes("t")
    assert [r.outcome for r in recs] == ["good", "refused"]
    assert recs[0].predicted == {"1": 90.0} and recs[1].detail.startswith("tiers[0]")


def test_learner_snapshots_keep_the_newest(tmp_path):
    store = Store(tmp_path / "s.sqlite")
    for i in range(8):
        store.add_learner_snapshot(float(i), "g", "v1", {"i": i})
    assert store.latest_learner_snapshot("g") == (7.0, "v1", {"i": 7})
