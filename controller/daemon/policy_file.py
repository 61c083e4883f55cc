"""The policy file: a learned table frozen to YAML with where it came from.

Written by `specctl freeze`, checked by `specctl freeze --check`, read by the daemon's frozen
mode and by the SGLang plugin at start-up (both read only `table`). Format:

    format: specctl-policy/1           # optional; other values are refused
    table:                              # the contract's table form (sglang_hooks.contract)
      version: 7
      tiers:
        - {min_batch: 1, depth: 3}
        - {min_batch: 9, depth: 1, hysteresis: 1}
        - {min_batch: 40, depth: 0, hysteresis: 5}
    provenance:                         # optional; informational, never used to decide
      created_at: 2025-06-01T12:00:00+00:00
      created_by: specctl freeze
      store: /var/lib/specctl/specctl.sqlite
      group: kimi-k25-8x
      targets: [gpu1, gpu2]
      window: {start: ..., end: ...}    # time span of the samples the model was fitted on
      samples: 5400
      iterations: 1.2e6
      model_version: specctl-models/1 (...)
      captured_depths: [0, 1, 3]
      batch_histogram: {1: 0.1, 8: 0.5, 32: 0.4}   # share of decode iterations per bucket
      predicted_tok_per_s: {table: 812.0, full_depth: 640.1, off: 700.2, best_single_depth: 760.3}
      predicted_gain: {full_depth: 0.268, off: 0.160, best_single_depth: 0.068}

Errors name the field the way a person finds it in the file: `table.tiers[1].depth: ...`,
`provenance.samples: ...`, or the YAML line and column.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sglang_hooks.contract import PolicyError, PolicyTable, parse_table
from sglang_hooks.draft_shape import DraftShape

FORMAT = "specctl-policy/1"
TOP_LEVEL_KEYS = ("format", "table", "provenance")


class PolicyFileError(ValueError):
    """A policy file is missing or invalid; `field` names where (as written in the file)."""

    def __init__(self, path: Path, field: str, message: str) -> None:
        self.path, self.field, self.message = path, field, message
        # field "" = the file as a whole (missing, unreadable): "<path>: <message>".
        super().__init__(f"{path}: {field}: {message}" if field else f"{path}: {message}")


class TimeWindow(BaseModel):
    model_config = ConfigDict(extra="forbid")

    start: dt.datetime
    end: dt.datetime


class Provenance(BaseModel):
    """Where a frozen table came from. Extra keys are kept (other writers may add their own)."""

    model_config = ConfigDict(extra="allow")

    created_at: dt.datetime | None = None
    created_by: str | None = None
    store: str | None = None
    group: str | None = None
    targets: list[str] = Field(default_factory=list)
    window: TimeWindow | None = None
    samples: Annotated[int, Field(ge=0)] | None = None
    iterations: Annotated[float, Field(ge=0)] | None = None
    model_version: str | None = None
    captured_depths: list[Annotated[int, Field(ge=0, le=15)]] | None = None
    batch_histogram: dict[int, Annotated[float, Field(ge=0)]] | None = None
    predicted_tok_per_s: dict[str, Annotated[float, Field(ge=0)]] | None = None
    fingerprint: str | None = None  # `PolicyTable.fingerprint` of the table when written
    predicted_gain: dict[str, float] | None = None


class PolicyFile(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)

    table: PolicyTable
    provenance: Provenance = Field(default_factory=Provenance)


def load(
    path: str | Path,
    captured_depths: Iterable[int] | None = None,
    captured_trees: Iterable[DraftShape] = (),
) -> PolicyFile:
    """Read and validate a policy file; raise PolicyFileError naming the field."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PolicyFileError(p, "", "no such file") from None
    except OSError as err:
        raise PolicyFileError(p, "", f"cannot read: {err.strerror or err}") from None
    return loads(text, p, captured_depths, captured_trees)


def loads(
    text: str,
    path: Path,
    captured_depths: Iterable[int] | None = None,
    captured_trees: Iterable[DraftShape] = (),
) -> PolicyFile:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "(YAML)"
        problem = getattr(err, "problem", None) or str(err)
        raise PolicyFileError(path, where, f"not valid YAML: {problem}") from None
    if not isinstance(data, dict):
        raise PolicyFileError(
            path, "(top level)", "expected a mapping with 'table' (and optional 'provenance')"
        )
    unknown = sorted(set(map(str, data)) - set(TOP_LEVEL_KEYS))
    if unknown:
        raise PolicyFileError(
            path, unknown[0], f"unknown key; expected {', '.join(TOP_LEVEL_KEYS)}"
        )
    fmt = data.get("format", FORMAT)
    if fmt != FORMAT:
        raise PolicyFileError(path, "format", f"expected {FORMAT!r}, got {fmt!r}")
    if "table" not in data:
        raise PolicyFileError(path, "table", "missing: a policy file needs a 'table'")
    try:
        table = parse_table(data["table"], captured_depths, captured_trees)
    except PolicyError as err:
        field = "table" if err.field == "table" else f"table.{err.field}"
        raise PolicyFileError(path, field, err.message) from None
    raw_prov = data.get("provenance") or {}
    try:
        provenance = Provenance.model_validate(raw_prov)
    except ValidationError as err:
        first = err.errors()[0]
        loc = ".".join(str(x) for x in first["loc"])
        field = f"provenance.{loc}" if loc else "provenance"
        raise PolicyFileError(path, field, first["msg"]) from None
    return PolicyFile(table=table, provenance=provenance)


def dumps(policy: PolicyFile) -> str:
    """YAML text with a header a person reads first; `loads(dumps(x))` gives x back."""
    prov = policy.provenance.model_dump(mode="json", exclude_none=True)
    if not prov.get("targets"):
        prov.pop("targets", None)
    doc: dict[str, Any] = {"format": FORMAT, "table": compact_table(policy.table)}
    if prov:
        doc["provenance"] = prov
    header = (
        "# specctl policy file: the plugin loads `table` at start-up (SPECCTL_POLICY_FILE),\n"
        "# the daemon pushes it as-is in frozen mode. Check edits: specctl freeze --check FILE\n"
        f"# table: {policy.table.describe()} ({policy.table.label()})\n"
    )
    return header + yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=100)


def compact_table(table: PolicyTable) -> dict[str, Any]:
    """The table's JSON form without default-valued tier fields: one short line per tier."""
    tiers = []
    for tier in table.tiers:
        full = tier.to_json()
        tiers.append({k: v for k, v in full.items() if k in ("min_batch", "depth") or v})
    return {"version": table.version, "tiers": tiers}


def dump(policy: PolicyFile, path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(dumps(policy), encoding="utf-8")
    return p
