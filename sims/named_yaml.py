"""Load a validated YAML file given a built-in name or a path (profiles and scenarios)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


def builtin_names(folder: Path) -> list[str]:
    return sorted(p.stem for p in folder.glob("*.yaml"))


def load_named_yaml(
    name_or_path: str | Path,
    *,
    folder: Path,
    model: type[M],
    error: type[ValueError],
    kind: str,
    explain: Callable[[ValidationError], str],
) -> M:
    """`name_or_path` is a built-in name (a file in `folder`) or a YAML file's path.

    Every failure raises `error` with a message naming the file and, for invalid content,
    each offending field (`explain`).
    """
    path = Path(name_or_path)
    if not path.suffix and not path.exists():
        path = folder / f"{name_or_path}.yaml"
        if not path.exists():
            raise error(
                f"unknown {kind} '{name_or_path}': built-in {kind}s are "
                f"{', '.join(builtin_names(folder)) or '(none)'}; or pass a path to a YAML file"
            )
    if not path.exists():
        raise error(f"{kind} file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        # One line with the place in the file (PyYAML's message spans several lines and
        # names "<unicode string>" instead of the file).
        mark = getattr(err, "problem_mark", None)
        where = "" if mark is None else f"line {mark.line + 1}, column {mark.column + 1}: "
        problem = getattr(err, "problem", None) or " ".join(str(err).split())
        raise error(f"{path}: {where}not valid YAML: {problem}") from None
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise error(f"{path}: {explain(err)}") from None
