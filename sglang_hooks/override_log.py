"""Keep SGLang's runtime-context override log bounded on a server that switches depth often.

`EAGLEWorkerV2.apply_runtime_state` records every depth switch with
`get_context().override("adaptive_spec.restore", speculative_num_steps=...,
speculative_num_draft_tokens=...)`, which appends `(source, fields)` to
`RuntimeContext._overrides_log`. Nothing ever drops entries, and the log is walked in full by
`resolved_server_args_dict()` on every `/server_info` read and every admin request, so a
long-running server that explores depths slows those down without bound.

The log is read by overlaying each entry's fields in order onto the start-up arguments.
An earlier entry whose fields are all overwritten by a later entry therefore contributes
nothing to that overlay, and removing it leaves every resolved value as it was. After each
switch the plugin removes the previous depth-switch entry that the new one supersedes, so at
most one such entry stays in the log (plus whatever SGLang records for other reasons).
"""

from __future__ import annotations

from typing import Any

RESTORE_SOURCE = "adaptive_spec.restore"
LOOKBACK = 64  # entries searched back for the superseded one; keeps each call O(1)


def drop_superseded(log: list[Any], source: str = RESTORE_SOURCE, lookback: int = LOOKBACK
                    ) -> bool:
    """If the last entry of `log` came from `source`, remove the closest earlier entry from
    the same source whose fields it overwrites. True if an entry was removed."""
    if not log:
        return False
    last_source, last_fields = log[-1]
    if last_source != source:
        return False
    keys = set(last_fields)
    stop = max(-1, len(log) - 2 - lookback)
    for i in range(len(log) - 2, stop, -1):
        entry_source, fields = log[i]
        if entry_source == source and set(fields) <= keys:
            del log[i]
            return True
    return False
