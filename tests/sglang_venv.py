"""The plugin tests' venv (.venv-sglang: SGLang 0.5.23 on CPU torch), for the few main-suite
tests that run a program in it. scripts/test.sh builds it beside the main suite and runs the
tests marked `sglang_venv` once it is ready; run alone, they skip without it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYTHON = ROOT / ".venv-sglang" / "bin" / "python"
T = TypeVar("T", bound=Callable[..., None])


def has(package: str) -> bool:
    """Whether the venv holds `package` (a half-built venv holds its interpreter only)."""
    return any((ROOT / ".venv-sglang" / "lib").glob(f"python*/site-packages/{package}/__init__.py"))


def needs(*packages: str) -> Callable[[T], T]:
    """Slow, marked `sglang_venv`, skipped where the venv lacks one of `packages`."""
    ready = all(has(p) for p in packages)

    def mark(test: T) -> T:
        for m in (pytest.mark.slow, pytest.mark.sglang_venv,
                  pytest.mark.skipif(not ready, reason=f"needs .venv-sglang with {packages}")):
            test = m(test)
        return test

    return mark
