"""Frozen mode's input: a policy file (format and checks in controller/daemon/policy_file.py).

The daemon pushes the file's `table` as-is and keeps it there: it re-pushes whenever the
server reports another table (for instance after a restart that lost the push). `provenance`
is informational only.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from controller.daemon.policy_file import PolicyFileError, load
from sglang_hooks.contract import PolicyTable


class FrozenPolicyError(ValueError):
    pass


def load_frozen_policy(
    path: str | Path, captured_depths: Iterable[int] | None = None
) -> tuple[PolicyTable, dict[str, Any]]:
    """(table, provenance) from a policy file; errors name the file and the field."""
    try:
        policy = load(Path(path).expanduser(), captured_depths)
    except PolicyFileError as err:
        raise FrozenPolicyError(f"frozen_policy: {err}") from None
    return policy.table, policy.provenance.model_dump(mode="json", exclude_none=True)
