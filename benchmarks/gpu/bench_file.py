"""The level rows of a `specctl bench` result (its bench.json), as the GPU tools read them.

Each tool names its own error type (`error=`), which its command line turns into an exit
status of 2 and a message naming the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class BenchFileError(ValueError):
    """A path that holds no readable bench result; the message names the file."""


def file_of(path: Path) -> Path:
    """A bench folder's bench.json, or the file given."""
    return path / "bench.json" if path.is_dir() else path


def read(path: Path, error: type[Exception] = BenchFileError) -> Any:
    file = file_of(path)
    try:
        return json.loads(file.read_text())
    except (OSError, ValueError) as err:
        raise error(f"{file}: not a bench result ({err})") from None


def level_rows(path: Path, data: Any = None, error: type[Exception] = BenchFileError
               ) -> list[dict[str, Any]]:
    """Every level of `path`'s bench.json (`data`, when it is already read), as dicts."""
    data = read(path, error) if data is None else data
    rows = data.get("results") if isinstance(data, dict) else None
    if not isinstance(rows, list):
        raise error(f"{file_of(path)}: not a bench result (no 'results' list; give a "
                    "`specctl bench` bench.json)")
    return [r for r in rows if isinstance(r, dict)]
