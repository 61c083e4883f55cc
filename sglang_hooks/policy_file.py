"""The frozen start-up table: `SPECCTL_POLICY_FILE` names a YAML or JSON file with a `table:`.

The file may carry provenance next to the table (when and from what it was learned); only
`table` is read, in contract form `{"version": n, "tiers": [...]}`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from pathlib import Path

from sglang_hooks import settings
from sglang_hooks.contract import PolicyError, PolicyTable, parse_table
from sglang_hooks.draft_shape import DraftShape

POLICY_FILE_ENV = settings.POLICY_FILE.name


def load_policy_file(
    path: str | Path, captured_depths: Iterable[int] | None = None,
    captured_trees: Iterable[DraftShape] = (),
) -> PolicyTable:
    """Read and validate the table in `path`. Raises PolicyError naming the file and field."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as err:
        raise PolicyError(POLICY_FILE_ENV, f"cannot read {p}: {err.strerror or err}") from None
    try:
        if p.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            import yaml  # JSON is valid YAML too, so any other suffix goes through YAML

            data = yaml.safe_load(text)
    except ValueError as err:  # json.JSONDecodeError
        raise PolicyError(POLICY_FILE_ENV, f"{p} is not valid JSON: {err}") from None
    except Exception as err:  # yaml.YAMLError is not a ValueError
        # One line with the place in the file: PyYAML's message spans several lines.
        mark = getattr(err, "problem_mark", None)
        where = "" if mark is None else f" (line {mark.line + 1}, column {mark.column + 1})"
        problem = getattr(err, "problem", None) or " ".join(str(err).split())
        raise PolicyError(POLICY_FILE_ENV, f"{p} is not valid YAML{where}: {problem}") from None
    if not isinstance(data, Mapping) or "table" not in data:
        raise PolicyError(
            f"{p}: table",
            "missing: the policy file needs a top-level 'table' with 'version' and 'tiers'",
        )
    try:
        return parse_table(data["table"], captured_depths=captured_depths,
                           captured_trees=captured_trees)
    except PolicyError as err:
        raise PolicyError(f"{p}: table.{err.field}", err.message) from None


def policy_file_from_env() -> str | None:
    return settings.POLICY_FILE.get()


def table_fingerprint(table: PolicyTable | None) -> str:
    """A short digest of a table (version and tiers) for log lines: with multi-node tensor
    parallelism every node reads its own policy file, and every rank must run the same one."""
    if table is None:
        return "none"
    text = json.dumps(table.to_json(), sort_keys=True)
    return f"v{table.version}/{hashlib.sha256(text.encode()).hexdigest()[:12]}"
