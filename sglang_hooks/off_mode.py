"""How a speculative server runs while a table says depth 0 ("off").

SGLang's depth 0 skips drafting but still runs the draft model's extend over each new token
after verify, so that the draft's KV cache and hidden state stay current for when drafting
resumes. That extend is most of what depth 0 costs over a server without speculation.

- `sglang`: SGLang's own depth 0, unchanged (draft extend runs every iteration).
- `skip-extend`: while a table holds control and its live tier runs depth 0, the draft
  extend is replaced by SGLang's own stub for a skipped extend (`_stub_skipped_draft_extend`,
  the path its `SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND` switch takes): zeroed draft inputs
  of the right shape, no draft forward. The target still verifies and samples every token,
  so outputs do not change; what changes is the draft's state when drafting resumes (see
  docs/sglang.md, "Off"). A depth-0 tier that probes positive depths keeps the extend, so
  those probes measure what a warm draft accepts.
- `skip-extend-all`: the same, also in depth-0 tiers that probe positive depths (those
  probes then draft from a stale state and measure a lower acceptance than a warm draft's).

Chosen at start-up with `SPECCTL_OFF_MODE` and at run time with the admin key
`specctl_off_mode` (0 = sglang, 1 = skip-extend, 2 = skip-extend-all) in
`POST /set_internal_state`; TP rank 0 broadcasts admin requests, so every rank switches at
the same iteration.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from sglang_hooks.contract import PolicyError

SGLANG, SKIP_EXTEND, SKIP_EXTEND_ALL = "sglang", "skip-extend", "skip-extend-all"
MODES = (SGLANG, SKIP_EXTEND, SKIP_EXTEND_ALL)  # the wire code of a mode is its index
# Believed best until measured on a GPU: at depth 0 SGLang's draft extend cost 7-10% of a
# plain server's throughput on an H200, and skipping it recovered most of that.
DEFAULT_MODE = SKIP_EXTEND
OFF_MODE_ENV = "SPECCTL_OFF_MODE"
OFF_MODE_KEY = "specctl_off_mode"
SETTING_KEYS = frozenset({OFF_MODE_KEY})


def mode_from_env() -> tuple[str, str | None]:
    """(mode, error): the start-up mode, and why the variable was ignored if it was."""
    raw = os.environ.get(OFF_MODE_ENV, "").strip()
    if not raw:
        return DEFAULT_MODE, None
    if raw in MODES:
        return raw, None
    return DEFAULT_MODE, (f"{OFF_MODE_ENV}={raw!r} is not one of {', '.join(MODES)}; "
                          f"using {DEFAULT_MODE}")


def decode_mode(value: Any) -> str:
    """The mode a `specctl_off_mode` value names. Raises PolicyError naming the key."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value) \
            or not 0 <= int(value) < len(MODES):
        codes = ", ".join(f"{i} = {m}" for i, m in enumerate(MODES))
        raise PolicyError(OFF_MODE_KEY, f"must be one of {codes}; got {value!r}")
    return MODES[int(value)]


def split_settings(server_args: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(plugin settings such as the off mode, every other key)."""
    settings = {k: v for k, v in server_args.items() if k in SETTING_KEYS}
    rest = {k: v for k, v in server_args.items() if k not in SETTING_KEYS}
    return settings, rest
