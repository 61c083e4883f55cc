"""The results folder as one .tar.gz: logs over `MAX_LOG_BYTES` go in trimmed (head, tail and
counts of the repeated lines), store side files, oversized files and the prompt sets the
session draws from a seed stay out (listed in MANIFEST.txt inside the archive).
"""

from __future__ import annotations

import io
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.gpu.server_log import trim_log

MAX_LOG_BYTES = 1 << 20
MAX_FILE_BYTES = 8 << 20
SKIP_SUFFIXES = (".sqlite-wal", ".sqlite-shm", ".tmp")
# The prompt sets drawn beside the models (20,000 fresh prompts a bench, about 4 MB each): a
# session of a dozen benches took the archive past what comes back from the machine, and each
# is remade from its seed by the command that drew it (benchmarks.gpu.seeded.datasets).
DRAWN_DATASET_BYTES = 1 << 20


def pack(run_dir: Path, tar_path: Path) -> dict[str, Any]:
    tar_path.parent.mkdir(parents=True, exist_ok=True)
    left_out: list[str] = []
    trimmed: list[str] = []
    added = 0
    root = run_dir.name
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(tar_path, "w:gz") as tar:
        for path in sorted(p for p in run_dir.rglob("*") if p.is_file()):
            rel = path.relative_to(run_dir)
            if path.resolve() == tar_path.resolve() or path.name.endswith(SKIP_SUFFIXES):
                continue
            size = path.stat().st_size
            if path.suffix in (".log", ".txt") and size > MAX_LOG_BYTES:
                short = Path(tmp) / (path.name + ".trimmed")
                info = trim_log(path, short)
                tar.add(short, arcname=f"{root}/{rel}.trimmed")
                trimmed.append(f"{rel}: {info['lines']} lines, {info['left_out']} left out")
                added += 1
                continue
            if size > MAX_FILE_BYTES:
                left_out.append(f"{rel} ({size} bytes)")
                continue
            if _drawn_dataset(rel) and size > DRAWN_DATASET_BYTES:
                left_out.append(f"{rel} ({size} bytes; drawn from a seed, remade by its command)")
                continue
            tar.add(path, arcname=f"{root}/{rel}")
            added += 1
        manifest = "\n".join(
            [f"{added} files", "trimmed logs:", *trimmed, "left out:", *left_out]) + "\n"
        data = manifest.encode()
        entry = tarfile.TarInfo(f"{root}/MANIFEST.txt")
        entry.size = len(data)
        tar.addfile(entry, io.BytesIO(data))
    return {"path": str(tar_path), "bytes": tar_path.stat().st_size, "files": added,
            "trimmed": trimmed, "left_out": left_out}


def _drawn_dataset(rel: Path) -> bool:
    """A prompt set written beside the models (`models/<family>/*.jsonl`)."""
    return rel.parts[:1] == ("models",) and rel.suffix == ".jsonl"
