"""A `specctl bench` of a server as the daemon's first evidence about it.

A user who benched the server before starting the daemon should not make it learn from
nothing. Each level of the bench at a drafting depth (or depth 0) measured, with the plugin's
counters, the mean batch, the accept length and the step time over its window; that is the
whole content of a stored sample (models/samples.py), so a level becomes one sample of its
depth and batch bucket, as if the daemon had scraped the server through that window. Levels
that cannot stand for the server are left out: those the bench flagged (too short, too few
requests, other traffic, client-bound), those without the plugin's counters, and the plain server's.

The seed is written only into a store that holds no sample of the target yet (a restarted
daemon keeps what it learned), and it ages out like any sample (`schedule.history_s`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from models.samples import Sample
from sglang_hooks.contract import bs_bucket

BENCH_FILE = "bench.json"
# A level's own verdicts on itself (bench.json keys): any of them true leaves it out.
LEVEL_FLAGS = ("too_short", "foreign_traffic", "client_bound", "drain_timed_out")


class BenchSeedError(ValueError):
    """A seed_bench that cannot be read as a bench; the message names the file and the fix."""


def bench_path(given: Path) -> Path:
    """The bench.json of `given` (the file, or the folder `specctl bench --out` wrote)."""
    return given / BENCH_FILE if given.is_dir() else given


def read_bench(given: Path) -> dict[str, Any]:
    path = bench_path(given)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise BenchSeedError(f"seed_bench {given}: no {BENCH_FILE} there; give the folder "
                             "`specctl bench --out` wrote, or its bench.json") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise BenchSeedError(f"seed_bench {path}: not a bench.json ({err}); give the file "
                             "`specctl bench` wrote") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        raise BenchSeedError(f"seed_bench {path}: no 'results' list, so not a bench.json of "
                             "`specctl bench`")
    return doc


def _positive(level: Mapping[str, Any], key: str) -> float | None:
    value = level.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def level_sample(level: Mapping[str, Any], group: str, target: str, t_end: float
                 ) -> Sample | None:  # fmt: skip
    """One bench level as the sample a scrape over its window would have stored, or None."""
    depth = level.get("depth")
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
        return None  # the plain server's levels, or a level without a forced depth
    if any(level.get(flag) for flag in LEVEL_FLAGS) or not level.get("requests"):
        return None
    seconds, batch = _positive(level, "elapsed_s"), _positive(level, "mean_batch")
    accept, step_ms = _positive(level, "accept_length"), _positive(level, "step_ms")
    if seconds is None or batch is None or accept is None or step_ms is None:
        return None  # no plugin counters behind it
    iterations = seconds * 1000.0 / step_ms  # a closed-loop level keeps the server busy
    request_steps = iterations * batch
    return Sample(group=group, target=target, t_end=t_end, interval_s=seconds, depth=depth,
                  bs_bucket=bs_bucket(max(1, round(batch))), iterations=iterations,
                  request_steps=request_steps, tokens=request_steps * accept,
                  gpu_seconds=iterations * step_ms / 1000.0)  # fmt: skip


def samples_from_bench(doc: Mapping[str, Any], group: str, target: str, t_end: float
                       ) -> list[Sample]:  # fmt: skip
    """Every level of a bench that can stand for the server, as samples ending at `t_end`."""
    # The bench's own list of levels it left out of its recommendation (too few requests too).
    flagged = {(f.get("series"), f.get("level")) for f in doc.get("flagged_levels") or []
               if isinstance(f, Mapping)}
    out = []
    for level in doc.get("results", []):
        if isinstance(level, Mapping) and not any(
                (level.get("series"), level.get(key)) in flagged
                for key in ("concurrency", "request_rate")):
            sample = level_sample(level, group, target, t_end)
            if sample is not None:
                out.append(sample)
    return out
