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

from sglang_hooks import contract

# The wire side (mode names, the admin key, its check) lives in the contract beside the
# table's keys, where the simulator can read it too.
SGLANG, SKIP_EXTEND, SKIP_EXTEND_ALL = contract.OFF_MODES
MODES = contract.OFF_MODES  # the wire code of a mode is its index
OFF_MODE_KEY = contract.OFF_MODE_KEY
SETTING_KEYS = contract.SETTING_KEYS
decode_mode = contract.decode_off_mode
split_settings = contract.split_settings

# Believed best until measured on a GPU: at depth 0 SGLang's draft extend cost 7-10% of a
# plain server's throughput on an H200, and skipping it recovered most of that.
DEFAULT_MODE = SKIP_EXTEND
OFF_MODE_ENV = "SPECCTL_OFF_MODE"


def mode_from_env() -> tuple[str, str | None]:
    """(mode, error): the start-up mode, and why the variable was ignored if it was."""
    raw = os.environ.get(OFF_MODE_ENV, "").strip()
    if not raw:
        return DEFAULT_MODE, None
    if raw in MODES:
        return raw, None
    return DEFAULT_MODE, (f"{OFF_MODE_ENV}={raw!r} is not one of {', '.join(MODES)}; "
                          f"using {DEFAULT_MODE}")


