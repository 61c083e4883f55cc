"""Pieces of SGLang 0.5.17 compiled from its unpacked source, for the tests and benchmarks
that hold the plugin's host-work trims against the bodies they reproduce (the installed
SGLang of the CPU test environment is 0.5.23, whose bodies differ)."""

from __future__ import annotations

import ast
import contextlib
import dataclasses
from pathlib import Path
from typing import Any


def compiled(root: Path, rel: str, name: str, cls: str | None,
             namespace: dict[str, Any]) -> Any:
    """One function (or one method of `cls`) of the file `rel` under `root`, compiled alone
    into `namespace`, which gives it the names it calls."""
    path = root / rel
    body = ast.parse(path.read_text()).body
    if cls is not None:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == cls).body
    fn = next(n for n in body if isinstance(n, ast.FunctionDef) and n.name == name)
    module = ast.Module(body=[ast.ImportFrom("__future__", [ast.alias("annotations")], 0),
                              fn], type_ignores=[])
    exec(compile(ast.fix_missing_locations(module), str(path), "exec"), namespace)
    return namespace[name]


def forward_isolation(root: Path) -> tuple[Any, Any]:
    """The overlap scheduler's `Scheduler._forward_isolation` (a context manager) and the
    `record_batch_in_overlap` it calls, each compiled alone; both take the scheduler first."""
    rel = "srt/managers/scheduler.py"
    names: dict[str, Any] = {"dataclasses": dataclasses,
                             "contextmanager": contextlib.contextmanager}
    return (compiled(root, rel, "_forward_isolation", "Scheduler", names),
            compiled(root, rel, "record_batch_in_overlap", "Scheduler", names))


def allocator(root: Path, size: int, need_sort: bool) -> Any:
    """The page-size-1 `TokenToKVPoolAllocator` with its base class, loaded under their own
    module names, on the CPU."""
    import torch

    base_ns: dict[str, Any] = {"__name__": "sglang.srt.mem_cache.allocator.base"}
    base_path = root / "srt/mem_cache/allocator/base.py"
    exec(compile(base_path.read_text(), str(base_path), "exec"), base_ns)
    token_path = root / "srt/mem_cache/allocator/token.py"
    source = token_path.read_text().replace(
        "from sglang.srt.mem_cache.allocator.base import BaseTokenToKVPoolAllocator", "")
    token_ns: dict[str, Any] = {"__name__": "sglang.srt.mem_cache.allocator.token",
                                "BaseTokenToKVPoolAllocator": base_ns[
                                    "BaseTokenToKVPoolAllocator"]}
    exec(compile(source, str(token_path), "exec"), token_ns)
    return token_ns["TokenToKVPoolAllocator"](size, torch.bfloat16, "cpu", None, need_sort)


def dataclass_fields(root: Path, rel: str, cls: str) -> list[str]:
    """The field names of the dataclass `cls` in the file `rel` under `root`, in order: its
    annotated class-level names, `ClassVar`s left out (its bases' fields are not included)."""
    path = root / rel
    node = next(n for n in ast.parse(path.read_text()).body
                if isinstance(n, ast.ClassDef) and n.name == cls)
    return [n.target.id for n in node.body
            if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
            and "ClassVar" not in ast.unparse(n.annotation)]
