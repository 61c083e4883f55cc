"""Which GPUs a run measured on, as nvidia-smi names them, for the run's summary.

Runs of the harness have gone to different cards of one kind of machine, and two cards'
timings do not compare (memory bandwidth differs by almost half between two of them), so
every run folder says which card it had rather than leaving it to the folder's name.
`query` is the harness's one call of nvidia-smi's queries (memory.py samples through it too).
"""

from __future__ import annotations

import csv
import shutil
import subprocess
from dataclasses import asdict, dataclass
from typing import Any

QUERY = "name,memory.total,driver_version"


@dataclass(frozen=True)
class GpuInfo:
    name: str
    memory_mib: int | None
    driver: str

    def describe(self) -> str:
        memory = f"{self.memory_mib:,} MiB" if self.memory_mib is not None else "memory unknown"
        return f"{self.name} ({memory}, driver {self.driver})"


def query(fields: str, what: str = "gpu", timeout_s: float = 15.0) -> list[list[str]] | None:
    """nvidia-smi's `--query-WHAT=FIELDS` rows (CSV, no header, no units), each row's cells
    stripped; None where nvidia-smi is absent or fails (a CPU machine, no driver loaded). It
    runs as a separate process: the harness holds no CUDA context."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, f"--query-{what}={fields}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=timeout_s,
                             check=True).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    return [[cell.strip() for cell in row]
            for row in csv.reader(line for line in out.splitlines() if line.strip())]


def parse(rows: list[list[str]]) -> list[GpuInfo]:
    """Rows of `query(QUERY)`, one GPU a row; a row of another shape is skipped."""
    return [GpuInfo(name, int(memory) if memory.isdigit() else None, driver)
            for name, memory, driver in (row for row in rows if len(row) == 3)]


def read() -> list[dict[str, Any]] | None:
    """This machine's GPUs, or None where nvidia-smi is absent or fails."""
    rows = query(QUERY)
    return None if rows is None else [asdict(gpu) for gpu in parse(rows)]


def describe(gpus: list[dict[str, Any]] | None) -> str:
    """One line for the summary: each GPU, or why none is named."""
    if gpus is None:
        return "not read (no nvidia-smi on the machine that ran the harness)"
    if not gpus:
        return "none listed by nvidia-smi"
    return "; ".join(GpuInfo(**gpu).describe() for gpu in gpus)
