"""`python -m benchmarks.gpu.store_phases RUN/trace`: a daemon run's store (real SQLite through
the daemon's Store) read phase by phase of its trace."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.gpu import store_phases
from controller.daemon.store import Store
from models.samples import Sample

T0 = 1_000.0


def _sample(t_end: float, depth: int, iterations: float, tokens: float, gpu_s: float) -> Sample:
    return Sample("g", "spec", t_end, 1.0, depth, 64, iterations, iterations * 64, tokens, gpu_s)


def _run(folder: Path) -> None:
    (folder / "daemon-r1.json").write_text(json.dumps({
        "trace_started_unix": T0,
        "phases": [{"name": "p1-64-a", "seconds": 4}, {"name": "p2-256-b", "seconds": 4}],
    }))  # fmt: skip
    store = Store(folder / "daemon-r1.sqlite")
    store.add_samples([
        _sample(T0 - 1, 3, 50, 9_000, 0.9),  # before the trace: left out
        _sample(T0 + 1, 3, 50, 9_000, 0.9),  # inside the first skipped second: left out
        _sample(T0 + 2, 3, 50, 9_000, 0.6),
        _sample(T0 + 3, 3, 50, 9_000, 0.6),
        _sample(T0 + 4, 1, 40, 4_000, 0.5),
        _sample(T0 + 6, 0, 100, 25_600, 0.5),
        _sample(T0 + 7, 0, 100, 25_600, 0.5),
        _sample(T0 + 8, 1, 40, 6_000, 0.3),
    ])  # fmt: skip
    store.close()


def test_each_phase_counts_the_samples_that_ended_inside_it(tmp_path):
    _run(tmp_path)
    first, second = store_phases.phase_rows(tmp_path / "daemon-r1.json",
                                            tmp_path / "daemon-r1.sqlite", skip_s=1.0)  # fmt: skip
    assert first.wall_s == 3.0 and second.wall_s == 3.0
    assert sorted(first.by_depth) == [1, 3] and first.by_depth[3].iterations == 100
    assert first.tok_per_s == (18_000 + 4_000) / 3.0
    assert first.decode_share == (0.6 + 0.6 + 0.5) / 3.0
    assert second.by_depth[0].tokens == 51_200 and second.by_depth[1].gpu_seconds == 0.3
    text = store_phases.report(tmp_path)
    assert "## daemon-r1" in text
    row = next(line for line in text.splitlines() if line.startswith("| p2-256-b |"))
    assert "off 200 it, 1.0 s, 51,200" in row and "d1 40 it, 0.3 s, 20,000" in row


def test_a_folder_without_a_daemon_run_is_one_line_and_status_2(tmp_path, capsys):
    (tmp_path / "static-3.json").write_text("{}")
    assert store_phases.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no daemon run" in err and "RUN/trace" in err
