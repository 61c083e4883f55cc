"""Frozen policy files: a learned table written down to be pushed as-is, never re-learned.

Format (YAML): `table:` in the contract's form (`{version, tiers: [...]}`, the same the plugin
reads at start-up) plus free provenance fields that say where the table came from:

    table:
      version: 12
      tiers:
        - {min_batch: 1, depth: 3}
        - {min_batch: 24, depth: 1, hysteresis: 2}
        - {min_batch: 56, depth: 0, hysteresis: 4}
    provenance:
      created_at: "2025-01-01T00:00:00+00:00"
      group: kimi-k25-8x
      learner: bayes-v1
      predicted_tok_per_s: {1: 96.0, 64: 310.0}
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from sglang_hooks.contract import PolicyError, PolicyTable, parse_table


class FrozenPolicyError(ValueError):
    pass


def load_frozen_policy(
    path: str | Path, captured_depths: Iterable[int] | None = None
) -> tuple[PolicyTable, dict[str, Any]]:
    """(table, provenance) from a frozen policy file; errors name the file and the field."""
    p = Path(path).expanduser()
    if not p.exists():
        raise FrozenPolicyError(f"frozen_policy: file not found: {p}")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as err:
        raise FrozenPolicyError(f"{p}: not valid YAML: {err}") from None
    if not isinstance(data, dict) or "table" not in data:
        raise FrozenPolicyError(f"{p}: needs a top-level 'table:' with version and tiers")
    try:
        table = parse_table(data["table"], captured_depths)
    except PolicyError as err:
        raise FrozenPolicyError(f"{p}: table.{err.field}: {err.message}") from None
    provenance = {k: v for k, v in data.items() if k != "table"}
    return table, provenance


def frozen_policy_text(table: PolicyTable, provenance: dict[str, Any]) -> str:
    prov = {"created_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), **provenance}
    header = (
        "# specctl frozen policy: push with `frozen_policy: <this file>` in controller.yaml,\n"
        "# or load at server start-up (the plugin reads `table`).\n"
        f"# {table.describe()}\n"
    )
    body = yaml.safe_dump(
        {"table": table.to_json(), "provenance": prov}, sort_keys=False, default_flow_style=None
    )
    return header + body


def write_frozen_policy(path: str | Path, table: PolicyTable, provenance: dict[str, Any]) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(frozen_policy_text(table, provenance))
    return p
