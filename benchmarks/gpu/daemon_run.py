"""A short `specctl daemon` closed loop against the speculative server, under stepped load.

The daemon runs as its own process with a config written here: wall clock, short scrape,
fit and decide intervals and guardrail windows scaled to a run of a minute or two, its store
in the run folder. Meanwhile this process keeps load on the server (the bench's load
generator, levels cycled every `segment_s`), so the daemon sees more than one batch size.
"""

from __future__ import annotations

import asyncio
import sqlite3
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from benchmarks.gpu.subproc import Finished, run_logged
from controller.bench.loadgen import ClosedLoop, StopRule, make_client, run_level
from controller.bench.prompts import Prompt

SCRAPE_INTERVAL_S = 1.0  # the trace daemon's scrapes of /metrics (the default is 5 s)


def daemon_config(url: str, admin_key: str, store: Path, duration_s: float,
                  seed_bench: Path | None = None) -> dict[str, Any]:
    """Intervals a short run can show: a scrape every second, a fit and a decision every 3 s,
    a table held at least 6 s (the daemon's defaults, 5 / 30 / 30 s, scaled to traces whose
    phases last 4-20 s); `seed_bench` starts the store from a bench of the server."""
    target: dict[str, Any] = {"name": "spec", "url": url, "admin_key": admin_key,
                              "timeout_s": 5.0, "group": "gpu-harness"}
    if seed_bench is not None:
        target["seed_bench"] = str(seed_bench)
    return {
        "targets": [target],
        "schedule": {"clock": "wall", "duration_s": duration_s,
                     "scrape_interval_s": SCRAPE_INTERVAL_S, "fit_interval_s": 3.0,
                     "decide_interval_s": 3.0, "backoff_max_s": 10.0},
        "guardrails": {"min_dwell_s": 6.0, "rollback_window_s": 5.0,
                       # takeover_max_wait_s stays at its default: the first fit takes over
                       "rollback_min_iterations": 50, "refused_backoff_s": 10.0},
        "metrics": {"enabled": False},
        "store": {"path": str(store)},
    }


class SteppedLoad:
    """A thread running the bench's closed-loop load, one level per segment, until stopped."""

    def __init__(self, url: str, prompts: Sequence[Prompt], levels: Sequence[int],
                 segment_s: float, model: str) -> None:
        self.url = url
        self.prompts = prompts
        self.levels = list(levels)
        self.segment_s = segment_s
        self.model = model
        self.segments: list[dict[str, Any]] = []
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="daemon-load", daemon=True)

    async def _segments(self) -> None:
        offset = 0
        i = 0
        async with make_client(self.url, max(self.levels)) as http:
            while not self._stop.is_set():
                level = self.levels[i % len(self.levels)]
                i += 1
                t0 = time.time()
                load = await run_level(http, self.prompts, ClosedLoop(level),
                                       StopRule(duration_s=self.segment_s, warmup_s=0.0),
                                       model=self.model,
                                       prompt_offset=offset)
                offset += len(load.requests)
                self.segments.append({
                    "start": round(t0, 2), "concurrency": level,
                    "seconds": round(load.elapsed_s, 2), "completed": len(load.completed),
                    "errors": len(load.errors), "tok_per_s": round(load.output_tok_per_s, 1),
                })

    def _run(self) -> None:
        try:
            asyncio.run(self._segments())
        except Exception as err:  # reported in the step result, never lost
            self.error = f"{type(err).__name__}: {err}"

    def start(self) -> SteppedLoad:
        self._thread.start()
        return self

    def stop(self, timeout_s: float) -> bool:
        """Stop after the running segment; False if it is still running at the timeout."""
        self._stop.set()
        self._thread.join(timeout=timeout_s)
        return not self._thread.is_alive()


def run_daemon(config_path: Path, log: Path, timeout_s: float) -> Finished:
    argv = [sys.executable, "-m", "controller.cli", "daemon", "--config", str(config_path)]
    return run_logged(argv, log, timeout_s)


def write_config(path: Path, config: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))


def read_pushes(store: Path) -> list[dict[str, Any]]:
    """The daemon's audit trail (store table `pushes`), oldest first."""
    if not store.is_file():
        return []
    with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as db:
        db.row_factory = sqlite3.Row
        rows = db.execute("SELECT t, target, kind, table_json, reason, outcome, detail "
                          "FROM pushes ORDER BY id").fetchall()
    return [dict(r) for r in rows]


def count_samples(store: Path) -> int:
    if not store.is_file():
        return 0
    with sqlite3.connect(f"file:{store}?mode=ro", uri=True) as db:
        return int(db.execute("SELECT COUNT(*) FROM samples").fetchone()[0])
