"""The GPU's clocks, power and temperature over each bench level, from an nvidia-smi log.

    nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,utilization.gpu \
        --format=csv,noheader,nounits -lms 250 > clocks.csv      # beside the benches
    python -m benchmarks.gpu.gpu_clocks clocks.csv DIR/series_1 DIR/series_2 [--json OUT]

Each level of a bench.json (`window_start_unix`, `window_end_unix`) gets the mean SM clock,
the mean power and the highest temperature of the samples inside its measured window, and for
paired benches depth 0's level is set beside the plain server's at the same load. Why: which
server of a pair goes first moved the tok/s ratio by 1.5% at 1-4 streams and 10% at 64-128
on the H200, and a GPU that boosts from idle, or heats under load, is one way that can happen.

nvidia-smi writes times as the machine's local time (`2026/12/03 22:40:41.123`), read here as
local time too: run this where the log was written, or on a machine set to the same zone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from benchmarks.gpu.level_windows import WindowError, level_windows

TIME_FORMAT = "%Y/%m/%d %H:%M:%S.%f"


class ClockLogError(ValueError):
    """The log cannot be read; the message names the file and the fix."""


@dataclass(frozen=True)
class Sample:
    unix: float
    sm_mhz: float
    power_w: float | None
    temperature_c: float | None


@dataclass(frozen=True)
class LevelClocks:
    bench: str
    series: str  # "d0", "no-spec"
    concurrency: int
    samples: int
    sm_mhz: float | None
    power_w: float | None
    max_temperature_c: float | None


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None


def read_log(path: Path) -> list[Sample]:
    """The samples of an nvidia-smi CSV log (timestamp, SM clock, power, temperature, ...).
    Lines that are not samples (a header, an error nvidia-smi printed) are skipped."""
    try:
        lines = path.read_text().splitlines()
    except OSError as err:
        raise ClockLogError(f"{path}: cannot read the clock log ({err})") from None
    samples = []
    for line in lines:
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 2:
            continue
        try:
            unix = datetime.strptime(cells[0], TIME_FORMAT).timestamp()
        except ValueError:
            continue
        sm = _number(cells[1])
        if sm is None:
            continue
        power = _number(cells[2]) if len(cells) > 2 else None
        temperature = _number(cells[3]) if len(cells) > 3 else None
        samples.append(Sample(unix, sm, power, temperature))
    if not samples:
        raise ClockLogError(
            f"{path}: no samples in it; write it with nvidia-smi --query-gpu=timestamp,"
            "clocks.sm,power.draw,temperature.gpu --format=csv,noheader,nounits -lms 250"
        )
    return samples


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.fmean(known), 1) if known else None


def levels(samples: list[Sample], bench_dir: Path) -> list[LevelClocks]:
    out = []
    for w in level_windows(bench_dir):
        inside = [s for s in samples if w.holds(s.unix)]
        temps = [s.temperature_c for s in inside if s.temperature_c is not None]
        out.append(LevelClocks(
            bench=w.bench, series=w.series, concurrency=w.concurrency, samples=len(inside),
            sm_mhz=_mean([s.sm_mhz for s in inside]), power_w=_mean([s.power_w for s in inside]),
            max_temperature_c=max(temps) if temps else None,
        ))  # fmt: skip
    return out


def _cell(value: float | None, unit: str = "") -> str:
    return "-" if value is None else f"{value:g}{unit}"


def render(rows: list[LevelClocks]) -> str:
    lines = ["| bench | series | streams | samples | SM MHz | power W | max temp C |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for r in rows:
        cells = [r.bench, r.series, r.concurrency, r.samples, _cell(r.sm_mhz),
                 _cell(r.power_w), _cell(r.max_temperature_c)]  # fmt: skip
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    pairs = _paired(rows)
    if pairs:
        lines += ["", "| bench | streams | SM MHz d0 / plain | power W d0 / plain |",
                  "| --- | ---: | --- | --- |"]  # fmt: skip
        for (bench, c), (d0, plain) in pairs.items():
            lines.append(f"| {bench} | {c} | {_cell(d0.sm_mhz)} / {_cell(plain.sm_mhz)} | "
                         f"{_cell(d0.power_w)} / {_cell(plain.power_w)} |")  # fmt: skip
    return "\n".join(lines)


def _paired(rows: list[LevelClocks]) -> dict[tuple[str, int], tuple[LevelClocks, LevelClocks]]:
    by_key = {(r.bench, r.concurrency, r.series): r for r in rows}
    return {
        (bench, c): (r, by_key[(bench, c, "no-spec")])
        for (bench, c, series), r in by_key.items()
        if series == "d0" and (bench, c, "no-spec") in by_key
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", type=Path, help="nvidia-smi's CSV log")
    parser.add_argument("benches", type=Path, nargs="+", help="bench folders (with bench.json)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows as JSON")
    args = parser.parse_args(argv)
    try:
        samples = read_log(args.log)
        rows = [row for bench in args.benches for row in levels(samples, bench)]
    except (ClockLogError, WindowError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(render(rows))
    if args.json:
        payload: list[dict[str, Any]] = [asdict(r) for r in rows]
        args.json.write_text(json.dumps(payload, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
