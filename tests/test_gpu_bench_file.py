"""bench.json as the GPU tools read it: one reader, each tool's own error type."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from benchmarks.gpu import bench_file, parity


def _bench(folder: Path, body: object) -> Path:
    folder.mkdir()
    (folder / "bench.json").write_text(json.dumps(body))
    return folder


def test_a_folder_or_its_file_reads_the_same_levels(tmp_path: Path) -> None:
    folder = _bench(tmp_path / "b", {"results": [{"series": "d0"}, "junk", {"series": "no-spec"}]})
    rows = [{"series": "d0"}, {"series": "no-spec"}]
    assert bench_file.level_rows(folder) == rows
    assert bench_file.level_rows(folder / "bench.json") == rows
    data = bench_file.read(folder)
    assert bench_file.level_rows(folder, data) == rows


@pytest.mark.parametrize("error", [parity.ParityError, bench_file.BenchFileError])
def test_each_tool_gets_its_own_error_naming_the_file(tmp_path: Path,
                                                      error: type[Exception]) -> None:
    missing = tmp_path / "missing"
    with pytest.raises(error, match=r"missing.*not a bench result"):
        bench_file.level_rows(missing, error=error)
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    with pytest.raises(error, match=r"garbage\.json: not a bench result"):
        bench_file.read(garbage, error)
    listless = _bench(tmp_path / "listless", {"results": {"d0": 1}})
    fix = "no 'results' list; give a `specctl bench` bench.json"
    with pytest.raises(error, match=re.escape(fix)):
        bench_file.level_rows(listless, error=error)
