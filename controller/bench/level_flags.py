"""A bench level's flags (why it decides nothing) from the level as a file holds it.

`benchmarks.gpu.shape_bench` writes each level's flags beside it; a file written before it did
is judged by the bench's own rules (`LevelResult.flags`) on the level's fields, so the shapes
report and `specctl sim fit --shapes` leave out the same levels.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from controller.bench.sweep import LevelResult


def level_flags(level: Mapping[str, Any]) -> list[str]:
    """The level's flags as written, else the bench's rules on its fields (empty: none)."""
    if level.get("flags") is not None:
        return list(level["flags"])
    names = {f.name for f in fields(LevelResult)}
    return LevelResult(**{k: v for k, v in level.items() if k in names}).flags
