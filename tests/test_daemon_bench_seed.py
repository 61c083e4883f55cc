"""A `specctl bench` as the daemon's first evidence (`targets[].seed_bench`).

The bench is a real one: `specctl bench` against SGLang 0.5.17 with the plugin on an H200,
the seeded 8B pair (depths 0, 1, 3 and the plain server at 1-128 streams), checked in under
benchmarks/results/gpu/. The daemon runs through its real CLI on the simulator profile fitted
to that same server, with its real SQLite store."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from controller.cli import COMMAND_MODULES, app
from controller.daemon.bench_seed import BenchSeedError, read_bench, samples_from_bench
from controller.daemon.store import Store
from sglang_hooks.contract import bs_bucket

for _module in COMMAND_MODULES:
    importlib.import_module(_module)

BENCH = (Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "gpu"
         / "h200-sglang-0.5.17-seeded-8b-run8" / "bench_family")  # fmt: skip


def test_every_depth_level_becomes_the_sample_its_window_would_have_stored() -> None:
    doc = read_bench(BENCH)
    samples = samples_from_bench(doc, "g", "t", t_end=1000.0)
    spec_levels = [r for r in doc["results"] if r["depth"] is not None]
    assert len(samples) == len(spec_levels) == 15  # d0, d1, d3 at 5 loads; no-spec left out
    for level, s in zip(spec_levels, samples, strict=True):
        assert (s.depth, s.group, s.target, s.t_end) == (level["depth"], "g", "t", 1000.0)
        assert s.mean_batch == pytest.approx(level["mean_batch"])
        assert s.accept_length == pytest.approx(level["accept_length"])
        assert s.step_s * 1000 == pytest.approx(level["step_ms"])
        assert s.interval_s == level["elapsed_s"] == pytest.approx(s.gpu_seconds)
        assert s.bs_bucket == bs_bucket(round(level["mean_batch"]))


def _level(**changes: Any) -> dict[str, Any]:
    level = {"series": "d3", "depth": 3, "concurrency": 16, "requests": 40, "elapsed_s": 8.0,
             "mean_batch": 15.3, "accept_length": 3.0, "step_ms": 6.5, "too_short": False,
             "foreign_traffic": False, "client_bound": False}  # fmt: skip
    return {**level, **changes}


@pytest.mark.parametrize("changes", [
    {"too_short": True}, {"foreign_traffic": True}, {"client_bound": True},
    {"drain_timed_out": True}, {"requests": 0}, {"depth": None}, {"depth": True},
    {"step_ms": None}, {"accept_length": 0.0}, {"mean_batch": float("nan")},
    {"elapsed_s": "8"},
])  # fmt: skip
def test_levels_that_cannot_stand_for_the_server_are_left_out(changes: dict[str, Any]) -> None:
    doc = {"results": [_level(), _level(**changes), "not a level"]}
    assert len(samples_from_bench(doc, "g", "t", 0.0)) == 1


def test_levels_the_bench_listed_as_flagged_are_left_out() -> None:
    doc = {"results": [_level(), _level(series="d1", depth=1), _level(concurrency=64)],
           "flagged_levels": [{"series": "d1", "level": 16, "flags": ["too few requests"]},
                              {"series": "d3", "level": 4, "flags": ["too short"]}]}
    kept = samples_from_bench(doc, "g", "t", 0.0)
    assert [s.depth for s in kept] == [3, 3]


def test_a_seed_bench_that_is_no_bench_says_so_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(BenchSeedError, match=r"no bench\.json there; give the folder"):
        read_bench(tmp_path)
    (tmp_path / "bench.json").write_text("{not json")
    with pytest.raises(BenchSeedError, match=r"not a bench\.json"):
        read_bench(tmp_path)
    (tmp_path / "bench.json").write_text(json.dumps({"levels": []}))
    with pytest.raises(BenchSeedError, match="no 'results' list"):
        read_bench(tmp_path / "bench.json")


def _config(tmp_path: Path, name: str, seed: Path | None) -> tuple[Path, Path]:
    db = tmp_path / f"{name}.sqlite"
    extra = "" if seed is None else f", seed_bench: '{seed}'"
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text(
        "targets: [{name: sim, simulated: {profile: h200-sglang-llama8b-seeded, scenario: ramp}"
        f"{extra}}}]\nschedule: {{clock: simulated, speedup: 1000000, duration_s: 60}}\n"
        f"store: {{path: '{db}'}}\nmetrics: {{enabled: false}}\n"
    )
    return cfg, db


def _first_push_probes_at_batch_1(db: Path) -> list[int]:
    table = Store(db).pushes("sim")[0].table
    assert table is not None
    return list(table["tiers"][0]["explore_depths"])


def test_a_seeded_daemon_starts_from_the_bench_and_seeds_a_store_once(tmp_path: Path) -> None:
    cfg, db = _config(tmp_path, "seeded", BENCH)
    first = CliRunner().invoke(app, ["daemon", "--config", str(cfg)])
    assert first.exit_code == 0, first.output
    assert "sim: 15 samples from the bench" in first.output and "(depths [0, 1, 3])" in first.output
    seeded = [s for _, s in Store(db).samples(target="sim") if s.t_end == 0.0]
    assert len(seeded) == 15
    # The bench measured depths 0, 1 and 3 at one stream: the first table probes nothing there.
    assert _first_push_probes_at_batch_1(db) == []
    again = CliRunner().invoke(app, ["daemon", "--config", str(cfg)])
    assert again.exit_code == 0, again.output
    assert "samples from the bench" not in again.output  # the store holds the target already
    assert len([s for _, s in Store(db).samples(target="sim") if s.t_end == 0.0]) == 15


def test_without_a_seed_the_first_table_probes_where_the_bench_had_measured(
    tmp_path: Path,
) -> None:
    cfg, db = _config(tmp_path, "cold", None)
    result = CliRunner().invoke(app, ["daemon", "--config", str(cfg)])
    assert result.exit_code == 0, result.output
    assert "samples from the bench" not in result.output
    assert _first_push_probes_at_batch_1(db) != []


def test_a_bad_seed_bench_is_one_line_before_the_store_is_made(tmp_path: Path) -> None:
    cfg, db = _config(tmp_path, "bad", tmp_path / "no-such-bench")
    result = CliRunner().invoke(app, ["daemon", "--config", str(cfg)])
    assert result.exit_code == 2
    [line] = [ln for ln in result.output.splitlines() if ln.strip()]
    assert line.startswith("error: targets: seed_bench ") and "no bench.json there" in line
    assert not db.exists()
