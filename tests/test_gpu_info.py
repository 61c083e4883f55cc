"""The GPU a harness run measured on, read from nvidia-smi into the run's summary."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from benchmarks.gpu import gpu_info, summary

# As nvidia-smi printed it on the H100 of the twenty-seventh run (name and memory; the driver
# from the same machine's listing).
H100_LINE = "NVIDIA H100 80GB HBM3, 81559, 580.159.04\n"


def test_parse_reads_name_memory_and_driver_and_skips_other_lines():
    gpus = gpu_info.parse([[c.strip() for c in line.split(",")] for line in
                           (H100_LINE.strip(), "not, a gpu", "NVIDIA H200, [N/A], 580.159.03")])
    assert gpus == [gpu_info.GpuInfo("NVIDIA H100 80GB HBM3", 81559, "580.159.04"),
                    gpu_info.GpuInfo("NVIDIA H200", None, "580.159.03")]
    assert gpus[0].describe() == "NVIDIA H100 80GB HBM3 (81,559 MiB, driver 580.159.04)"
    assert "memory unknown" in gpus[1].describe()


def test_read_is_none_without_nvidia_smi(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no nvidia-smi anywhere
    assert gpu_info.read() is None
    assert "no nvidia-smi" in gpu_info.describe(None)


def _stand_in_smi(folder: Path, body: str) -> None:
    smi = folder / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\n{body}\n")
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)


def test_read_runs_nvidia_smi_with_the_query(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """A stand-in nvidia-smi (this machine has no GPU): a shell script on PATH that prints the
    H100's line only when asked for the harness's query, and fails otherwise."""
    _stand_in_smi(tmp_path, f'[ "$1" = "--query-gpu={gpu_info.QUERY}" ] || exit 9\n'
                            f'printf "{H100_LINE.strip()}\\n"')
    monkeypatch.setenv("PATH", str(tmp_path) + os.pathsep + os.environ.get("PATH", ""))
    gpus = gpu_info.read()
    assert gpus == [{"name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559,
                     "driver": "580.159.04"}]
    assert gpu_info.describe(gpus).startswith("NVIDIA H100 80GB HBM3 (81,559 MiB")


def test_read_is_none_when_nvidia_smi_fails(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """A stand-in nvidia-smi that exits non-zero, as it does with no driver loaded."""
    _stand_in_smi(tmp_path, "echo 'NVIDIA-SMI has failed' >&2; exit 9")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gpu_info.read() is None


def test_summary_names_the_machine_the_run_measured_on():
    """The GPU as nvidia-smi named it in `setup`, and a run on a machine without nvidia-smi
    says so rather than naming none."""
    base = {"run_dir": "/tmp/run", "steps": {}, "models": {"kind": "seeded"}}
    gpus = [{"name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "driver": "580.159.04"}]
    cpus = {"cpu_model": "AMD EPYC 9654", "cpus": 16, "cpus_allowed": 16,
            "cores_shared_by_threads": ["0,8", "1,9"], "cpu_topology": "cpu_topology.txt"}
    text = summary.markdown(base | {"backend": "sglang", "machine": {"gpus": gpus, **cpus}})
    assert "GPU: NVIDIA H100 80GB HBM3 (81,559 MiB, driver 580.159.04)" in text
    assert "CPU: AMD EPYC 9654, 16 CPUs (16 allowed here); 2 physical cores run two " \
        "threads or more, e.g. CPUs 0,8 (cpu_topology.txt)" in text
    bare = summary.markdown(base | {"backend": "sim", "machine": {"gpus": None, **cpus}})
    assert "GPU: not read (no nvidia-smi on the machine that ran the harness)" in bare
    assert "Machine: not recorded (run the `setup` step)" in summary.markdown(base)
