"""When each level of a `specctl bench` folder was measured, in wall-clock time.

`bench.json` records every level's window (`window_start_unix`, `window_end_unix`), so that
logs kept beside a bench (the GPU's clocks, the machine's CPUs) can be cut by level.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from benchmarks.gpu import bench_file


class WindowError(ValueError):
    """A bench folder has no level windows; the message names it and the fix."""


@dataclass(frozen=True)
class LevelWindow:
    bench: str  # the bench folder's name
    series: str  # "d0", "no-spec"
    concurrency: int
    start: float  # Unix seconds
    end: float

    def holds(self, unix: float) -> bool:
        return self.start <= unix <= self.end


def level_windows(bench_dir: Path) -> list[LevelWindow]:
    path = bench_file.file_of(bench_dir)
    rows = bench_file.level_rows(bench_dir, error=WindowError)
    out = []
    for row in rows:
        start, end = row.get("window_start_unix"), row.get("window_end_unix")
        if start is None or end is None:
            raise WindowError(
                f"{path}: its levels carry no window times (benched before specctl recorded "
                "them); bench again to line it up with a log"
            )
        out.append(LevelWindow(bench_dir.name, row["series"], row["concurrency"], start, end))
    return out
