"""When each level of a `specctl bench` folder was measured, in wall-clock time.

`bench.json` records every level's window (`window_start_unix`, `window_end_unix`), so that
logs kept beside a bench (the GPU's clocks, the machine's CPUs) can be cut by level.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


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
    path = bench_dir / "bench.json"
    try:
        rows = json.loads(path.read_text())["results"]
    except (OSError, json.JSONDecodeError, KeyError) as err:
        raise WindowError(f"{path}: not a bench result ({err})") from None
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
