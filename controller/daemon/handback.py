"""Hand-back: what the daemon leaves on a server when it stops (`on_exit` in the config).

A table with probes keeps exploring after the daemon exits, with nobody learning from it; a
learned table keeps deciding with nobody checking it. So on exit (SIGINT, SIGTERM,
`schedule.duration_s`, a fatal error) the daemon leaves, on every server it pushed to (and on
any server whose live table probes), one of:

- `restore` (the default): what it found there at start-up, without probes; SGLang's own choice
  (a release) if it found no table. A table found on the server is what its operator last
  chose (by hand, by a policy file at the server's start, or an earlier daemon's keep-table);
  releasing it instead would hand the server to SGLang's adaptive choice, which on the measured
  runs did not beat the best static depth (docs/daemon.md, "On a real server"); keeping the
  daemon's own table would leave a table that nobody checks any more where nobody chose one.
- `keep-table`: the table found at start-up without probes, or, where none was found, the
  daemon's own live table without probes (the best it learned, frozen in place).
- `release`: SGLang's own choice (the contract's tier count 0).

Never probes: `without_probes` strips them and merges the neighbouring tiers that then decide
alike (the same function freezes a learned table, `specctl freeze`).
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.daemon.config import OnExit
from sglang_hooks.contract import PolicyTable, Tier


def has_probes(table: PolicyTable | None) -> bool:
    return table is not None and any(t.explore_share > 0 for t in table.tiers)


def without_probes(table: PolicyTable, version: int) -> PolicyTable:
    """`table` without exploration; neighbouring tiers that then run the same depth or draft
    tree merge. A tree tier stays that tree."""
    tiers: list[Tier] = []
    for t in table.tiers:
        if tiers and tiers[-1].shape == t.shape:
            continue
        tiers.append(Tier(min_batch=t.min_batch, depth=t.depth, hysteresis=t.hysteresis,
                          topk=t.topk, draft_tokens=t.draft_tokens))  # fmt: skip
    return PolicyTable.build(tiers, version=version)


@dataclass(frozen=True)
class Found:
    """What a server ran when the daemon first read it, before its first push of this run."""

    table: PolicyTable | None  # None: SGLang's own choice (released)
    source: str  # the plugin's "none" | "startup" | "push"


def exit_table(
    mode: OnExit, found: Found | None, live: PolicyTable | None, next_version: int
) -> PolicyTable | None:
    """The table to leave on the server (None: release).

    `found`: None when the daemon never read the server before its first push (it could not
    reach it); `restore` then falls back to the live table without probes, which is what the
    daemon can vouch for. A table that comes back with the tiers it was found with keeps its
    version; any other table gets `next_version` (higher than any the daemon pushed)."""
    if mode == "release":
        return None
    base = found.table if found is not None else live
    if base is None and mode == "keep-table":
        base = live
    if base is None:
        return None
    stripped = without_probes(base, next_version)
    if found is not None and found.table is not None and stripped.tiers == found.table.tiers:
        return found.table
    return stripped


def describe(table: PolicyTable | None) -> str:
    if table is None:
        return "released (SGLang's own choice)"
    return f"{table.label()} {table.describe()}"
