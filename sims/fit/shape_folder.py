"""Read a bench of draft shapes, as the GPU harness's `shapes` step writes it.

SHAPES_DIR holds one folder per shape (`3x4x16/`, `plain/`), each with the server's
`server_info.json` and one `<family>.json` per prompt family: {"series", "levels": [...]}, each
level as `specctl bench` reports one (`benchmarks/gpu/shape_bench.py`). A level the bench
flagged (too short, too few requests, other traffic, client-bound) decides nothing: it is read
with its flags, and the fit leaves it out. The flags' rules belong to the bench, above the
simulator, so the caller passes them (`controller.bench.level_flags.level_flags`).

Every problem is a `BenchFileError` naming the file and the field.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sglang_hooks.draft_shape import PLAIN, ShapeError, label, parse_shape
from sims.fit.bench_file import NO_SPEC, BenchFileError, Level, ServerFacts, read_facts, read_level

SERVER_INFO = "server_info.json"
Flags = Callable[[Mapping[str, Any]], list[str]]
# SGLang's /server_info keys of a speculative server's shape, in STEPSxTOPKxDRAFT order.
SHAPE_KEYS = ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")


@dataclass(frozen=True)
class ShapeLevel:
    shape: str  # STEPSxTOPKxDRAFT or plain
    family: str  # the prompt family: an acceptance phase
    level: Level  # depth: the shape's steps (None: plain); series: the shape
    flags: tuple[str, ...]  # the bench's reasons to leave it out (empty: none)

    @property
    def label(self) -> str:
        return f"{self.shape} {self.family} c={self.level.concurrency}"


@dataclass(frozen=True)
class ShapeBench:
    folder: str
    levels: tuple[ShapeLevel, ...]
    facts: dict[str, ServerFacts]  # per shape: its server's limits

    @property
    def shapes(self) -> list[str]:
        return list(self.facts)

    @property
    def families(self) -> list[str]:
        return sorted({lv.family for lv in self.levels})


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise BenchFileError(f"{path}: not JSON (line {err.lineno}: {err.msg})") from None
    except OSError as err:
        raise BenchFileError(f"{path}: cannot read it ({err.strerror or err})") from None


def _server(folder: Path, shape: str) -> ServerFacts:
    path = folder / SERVER_INFO
    if not path.is_file():
        raise BenchFileError(f"{path}: no such file (the shapes step keeps each server's "
                             "/server_info there; rerun it, or copy the server's answer)")
    raw = _json(path)
    facts = read_facts(path, "(top level)", raw)
    ran = tuple(raw.get(k) for k in SHAPE_KEYS)
    drafted = parse_shape(shape)
    expected = (None,) * 3 if drafted is None else \
        (drafted.steps, drafted.topk, drafted.draft_tokens)
    if ran != expected and shape not in _switched(raw):
        said = "no speculation" if ran == (None,) * 3 else "x".join(str(x) for x in ran)
        raise BenchFileError(f"{path}: the server ran {said}, but its folder names {shape}; "
                             "rename the folder after the shape the server ran")
    return facts


def _switched(raw: Mapping[str, Any]) -> set[str]:
    """The shapes a server that switches shapes captured (the plugin's `shapes` report in its
    /server_info): a held bench of one ran that shape, whatever shape the server started at."""
    states = raw.get("internal_states")
    first = states[0] if isinstance(states, list) and states else None
    report = first.get("specctl") if isinstance(first, dict) else None
    shapes = report.get("shapes") if isinstance(report, dict) else None
    captured = shapes.get("captured") if isinstance(shapes, dict) else None
    return {str(k) for k in captured} if isinstance(captured, dict) else set()


def _levels(path: Path, shape: str, facts: ServerFacts, flags: Flags) -> list[ShapeLevel]:
    doc = _json(path)
    raw_levels = doc.get("levels") if isinstance(doc, dict) else None
    if not isinstance(raw_levels, list) or not raw_levels:
        raise BenchFileError(f"{path}: levels: must be a non-empty list (what shape_bench "
                             "writes per prompt family)")
    parsed = parse_shape(shape)
    depth = None if parsed is None else parsed.steps
    out = []
    for i, raw in enumerate(raw_levels):
        if not isinstance(raw, dict):
            raise BenchFileError(f"{path}: levels[{i}]: must be an object, got {raw!r}")
        # As a bench.json level: a depth and its series, so the bench file's reader checks it.
        as_bench = {**raw, "depth": depth, "series": NO_SPEC if depth is None else f"d{depth}"}
        level = read_level(path, i, as_bench, facts, facts, list_name="levels")
        out.append(ShapeLevel(shape, path.stem, replace(level, series=shape),
                              tuple(flags(raw))))
    return out


def load_shapes(folder: Path, flags: Flags) -> ShapeBench:
    """Every shape's levels and server under `folder` (see the module docstring)."""
    if not folder.is_dir():
        raise BenchFileError(f"{folder}: no such folder (give the shapes folder the harness's "
                             "shapes step wrote, holding one folder per shape)")
    facts: dict[str, ServerFacts] = {}
    levels: list[ShapeLevel] = []
    for sub in sorted(p for p in folder.iterdir() if p.is_dir()):
        try:
            shape = parse_shape(sub.name)
        except ShapeError:
            continue  # not a shape's folder (the prompts, say)
        name = label(shape)
        families = sorted(p for p in sub.glob("*.json") if p.name != SERVER_INFO)
        if not families:
            continue
        facts[name] = _server(sub, name)
        for path in families:
            levels += _levels(path, name, facts[name], flags)
    if not any(lv.shape != PLAIN for lv in levels):
        raise BenchFileError(f"{folder}: no shape's bench in it (expected folders like 3x4x16/ "
                             "holding a.json, b.json and server_info.json)")
    return ShapeBench(str(folder), tuple(levels), facts)
