"""The machine a run measured on: its GPUs as nvidia-smi names them, its CPUs and which of
them share a physical core.

Timings from two cards do not compare, and an idle SGLang scheduler spins one CPU unless
started with --sleep-on-idle, slowing the core its sibling thread shares: so every run folder
records both rather than leaving them to its name. `facts` returns the short form for
state.json; the whole `lscpu` output and each CPU's thread siblings go to a text file.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from pathlib import Path
from typing import Any

from benchmarks.gpu import gpu_info

TOPOLOGY_FILE = "cpu_topology.txt"


def cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def thread_siblings() -> dict[int, str]:
    """Each CPU's thread_siblings_list (the CPUs on its physical core), where the kernel says."""
    out: dict[int, str] = {}
    for path in sorted(Path("/sys/devices/system/cpu").glob("cpu[0-9]*/topology/"
                                                            "thread_siblings_list")):
        try:
            out[int(path.parts[-3][3:])] = path.read_text().strip()
        except (OSError, ValueError):
            continue
    return dict(sorted(out.items()))


def lscpu() -> str:
    exe = shutil.which("lscpu")
    if exe is None:
        return "(no lscpu on this machine)"
    try:
        return subprocess.run([exe], capture_output=True, text=True, timeout=15).stdout
    except (OSError, subprocess.SubprocessError) as err:
        return f"(lscpu failed: {err})"


def facts(run_dir: Path) -> dict[str, Any]:
    """The machine's GPUs and CPUs; `lscpu` and the thread siblings to TOPOLOGY_FILE."""
    siblings = thread_siblings()
    text = lscpu() + "\n" + "".join(f"cpu{cpu}: {s}\n" for cpu, s in siblings.items())
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / TOPOLOGY_FILE).write_text(text)
    shared = sorted({s for s in siblings.values() if "," in s or "-" in s})
    return {
        "gpus": gpu_info.read(),
        "cpu_model": cpu_model(),
        "cpus": os.cpu_count(),
        "cpus_allowed": len(os.sched_getaffinity(0)),
        "cores_shared_by_threads": shared,
        "host": platform.node(),
        "cpu_topology": TOPOLOGY_FILE,
    }


def describe(machine: dict[str, Any] | None) -> list[str]:
    """Lines for the summary."""
    if not machine:
        return ["Machine: not recorded (run the `setup` step)"]
    shared = machine.get("cores_shared_by_threads") or []
    return [f"GPU: {gpu_info.describe(machine.get('gpus'))}",
            f"CPU: {machine.get('cpu_model') or 'unknown'}, {machine.get('cpus')} CPUs "
            f"({machine.get('cpus_allowed')} allowed here); "
            + (f"{len(shared)} physical cores run two threads or more, e.g. CPUs {shared[0]}"
               if shared else "no CPU shares its core with another")
            + f" ({machine.get('cpu_topology')})"]
