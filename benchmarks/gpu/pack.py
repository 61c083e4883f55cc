"""The run folder as one .tar.gz (`--out-tar`), small enough to come back from a GPU machine
as one file: logs over `MAX_LOG_BYTES` go in trimmed (head, tail and counts of the repeated
lines); model weights, prompt sets, store side files and oversized files stay out (listed in
MANIFEST.txt inside the archive).
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
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
# Prompt sets: the seeded families beside the models (remade by the build from its seed) and
# the parity and shapes steps' draws under prompts/ and shapes/prompts/ (20,000 fresh prompts
# a series, about 4 MB each: a dozen series took an archive past what comes back from the
# machine), each remade from the seed its step recorded.
PROMPT_FOLDERS = ("models", "prompts")


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
            why = _left_out(rel, size)
            if why is not None:
                left_out.append(f"{rel} ({size} bytes; {why})")
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


def _left_out(rel: Path, size: int) -> str | None:
    """Why a file stays out of the archive, or None."""
    if rel.suffix in WEIGHT_SUFFIXES:
        return "model weights"
    if rel.suffix == ".jsonl" and any(part in PROMPT_FOLDERS for part in rel.parts[:-1]):
        return "a prompt set, remade from its seed"
    if size > MAX_FILE_BYTES:
        return "too large"
    return None
