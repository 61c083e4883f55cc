"""Which GPUs a run measured on, as nvidia-smi names them, for the run's summary.

Runs of the harness have gone to an H200 and to an H100 of the same lending pool, and the two
cards' timings do not compare (memory bandwidth 4.8 against 3.35 TB/s by the datasheets), so
every run folder says which card it had rather than leaving it to the folder's name.
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


def parse(text: str) -> list[GpuInfo]:
    """nvidia-smi's `--query-gpu=name,memory.total,driver_version --format=csv,noheader,nounits`
    output, one GPU a line; a line of another shape is skipped."""
    out = []
    for row in csv.reader(line for line in text.splitlines() if line.strip()):
        if len(row) != 3:
            continue
        name, memory, driver = (cell.strip() for cell in row)
        out.append(GpuInfo(name, int(memory) if memory.isdigit() else None, driver))
    return out


def read(timeout_s: float = 10.0) -> list[dict[str, Any]] | None:
    """This machine's GPUs, or None where nvidia-smi is absent or fails (a CPU machine)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        done = subprocess.run([smi, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=timeout_s, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return [asdict(gpu) for gpu in parse(done.stdout)]


def describe(gpus: list[dict[str, Any]] | None) -> str:
    """One line for the summary: each GPU, or why none is named."""
    if gpus is None:
        return "not read (no nvidia-smi on the machine that ran the harness)"
    if not gpus:
        return "none listed by nvidia-smi"
    return "; ".join(GpuInfo(**gpu).describe() for gpu in gpus)
