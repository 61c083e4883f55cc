"""benchmarks/gpu/staging: the wheels and FA3 repacked into one xz stream of parts, then carried
one part per call and unpacked into a site tree, run for real (bash, tar, xz, python3) on tiny
stand-in wheels: the real ones are 1.4 GB unpacked and need the GPU machine's Python 3.12."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACK = ROOT / "benchmarks" / "gpu" / "staging" / "pack.sh"

pytestmark = pytest.mark.skipif(shutil.which("xz") is None, reason="needs the xz command")


def _wheel(folder: Path, name: str, version: str, files: dict[str, bytes]) -> None:
    dist = f"{name}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    entries = {**files, f"{dist}/METADATA": metadata.encode()}
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as z:
        for path, data in entries.items():
            z.writestr(path, data)


def _fetched(src: Path, fa3: bytes) -> None:
    """What ../shared/gpu/fetch_wheels.sh leaves: a tar of wheels in parts p1.., FA3 xz in f1.."""
    wheels = src / "wheels"
    wheels.mkdir(parents=True)
    _wheel(wheels, "sglang", "0.5.17", {"sglang/__init__.py": b"__version__ = '0.5.17'\n"})
    _wheel(wheels, "sgl_kernel", "0.4.5", {"sgl_kernel/__init__.py": b""})
    _wheel(
        wheels, "xgrammar", "0.2.1",
        {"xgrammar/__init__.py": b"", "xgrammar/lib/libxgrammar.a": b"!<arch>\n" + b"x" * 1000},
    )  # fmt: skip
    _wheel(
        wheels, "dill", "0.4.1",
        {"dill/__init__.py": b"", "dill-0.4.1.data/purelib/dill_extra.py": b"X = 1\n",
         "dill-0.4.1.data/scripts/get_objgraph": b"#!/bin/sh\n"},
    )  # fmt: skip
    with tarfile.open(src / "wheels.tar", "w") as tar:
        for whl in sorted(wheels.iterdir()):
            tar.add(whl, arcname=whl.name)
    data = (src / "wheels.tar").read_bytes()
    half = len(data) // 2
    for i, chunk in enumerate((data[:half], data[half:]), start=1):
        (src / f"p{i}").mkdir()
        (src / f"p{i}" / f"part{i - 1:02d}").write_bytes(chunk)
    packed = subprocess.run(["xz", "-2", "-c"], input=fa3, capture_output=True, check=True).stdout
    (src / "f1").mkdir()
    (src / "f1" / "fa00").write_bytes(packed)
    shutil.rmtree(wheels)
    (src / "wheels.tar").unlink()


def test_pack_then_stage_part_by_part_gives_the_site_tree(tmp_path: Path) -> None:
    fa3 = os.urandom(300_000)  # incompressible: several parts of 100 KB
    src, dest, root = tmp_path / "fetched", tmp_path / "packed", tmp_path / "machine"
    _fetched(src, fa3)
    packed = subprocess.run(
        ["bash", str(PACK), str(src), str(dest), "100K"], capture_output=True, text=True
    )
    assert packed.returncode == 0, packed.stdout + packed.stderr
    parts = sorted(p.name for p in dest.iterdir() if p.is_dir())
    assert parts == [f"s{i}" for i in range(1, len(parts) + 1)] and len(parts) >= 3
    assert f"in {len(parts)} parts" in packed.stdout

    env = {**os.environ, "STAGE_ROOT": str(root)}
    # One call per part: each carries only its own part and stage.sh.
    for part in parts[:-1]:
        call = tmp_path / f"call-{part}" / ".gpu"
        shutil.copytree(dest / part, call / part)
        shutil.copy(dest / "stage.sh", call / "stage.sh")
        kept = subprocess.run(
            ["bash", str(call / "stage.sh"), str(call), "keep"], env=env, capture_output=True
        )
        assert kept.returncode == 0, kept.stderr
    # Without the last part the stream is cut short: a clear message, nothing marked done.
    early = subprocess.run(
        ["bash", "-c", f"source {dest / 'stage.sh'} {tmp_path / 'none'} env"],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert early.returncode != 0 and "parts missing or broken" in early.stdout
    assert not (root / "site" / ".done").exists()
    shutil.rmtree(root / "site")

    last = tmp_path / "call-last" / ".gpu"
    shutil.copytree(dest / parts[-1], last / parts[-1])
    shutil.copy(dest / "stage.sh", last / "stage.sh")
    staged = subprocess.run(
        ["bash", "-c", f"source {last / 'stage.sh'} {last} env && echo PATH=$PATH"],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert staged.returncode == 0, staged.stdout + staged.stderr
    assert "sglang 0.5.17 | plugins:" in staged.stdout and "'specctl'" in staged.stdout
    site = root / "site"
    assert (site / "sgl_kernel" / "flash_ops.abi3.so").read_bytes() == fa3
    assert (site / "dill_extra.py").is_file()  # a .data purelib file, moved up as pip does
    assert not list(site.glob("*.data"))
    assert not (site / "xgrammar" / "lib" / "libxgrammar.a").exists()
    assert (site / "xgrammar" / "__init__.py").is_file()
    assert os.access(root / "bin" / "specctl", os.X_OK)
    assert f"PATH={root / 'bin'}:" in staged.stdout


def test_recut_gives_the_same_stream_in_parts_of_another_size(tmp_path: Path) -> None:
    """Twelve parts of 30 KB from one of 100 KB pieces: the joined stream is byte for byte
    pack.sh's, and stage.sh's order (the numbered suffix) holds past s9."""
    src, dest = tmp_path / "fetched", tmp_path / "packed"
    _fetched(src, os.urandom(300_000))
    subprocess.run(["bash", str(PACK), str(src), str(dest), "100K"], check=True,
                   capture_output=True)  # fmt: skip

    def stream() -> bytes:
        parts = sorted(dest.glob("s*/site.tar.xz.*"), key=lambda p: int(p.suffix[1:]))
        return b"".join(p.read_bytes() for p in parts)

    before = stream()
    recut = subprocess.run(["bash", str(PACK.with_name("recut.sh")), str(dest), "30K"],
                           capture_output=True, text=True)  # fmt: skip
    assert recut.returncode == 0, recut.stdout + recut.stderr
    folders = sorted((p for p in dest.iterdir() if p.name.startswith("s") and p.is_dir()),
                     key=lambda p: int(p.name[1:]))  # fmt: skip
    assert len(folders) >= 10 and [p.name for p in folders] == [
        f"s{i}" for i in range(1, len(folders) + 1)]
    assert all(len(list(f.iterdir())) == 1 for f in folders)
    assert max(p.stat().st_size for p in dest.glob("s*/site.tar.xz.*")) == 30 * 1024
    assert stream() == before
    assert f"in {len(folders)} parts of 30K" in recut.stdout
    empty = subprocess.run(["bash", str(PACK.with_name("recut.sh")), str(tmp_path / "none"),
                            "30K"], capture_output=True, text=True)  # fmt: skip
    assert empty.returncode == 1 and "run pack.sh first" in empty.stdout
