"""SGLang 0.5.23: admin updates go through `SchedulerInternalStateController`.

Its `_update_handlers()` validates and applies one key at a time, but a specctl table is only
valid as a whole (tier order, hysteresis bands), so the plugin wraps the controller's
`set_internal_state`: it takes the specctl keys out, validates the table, hands the other keys
to SGLang unchanged and installs the table only if SGLang accepted the rest.
"""

from __future__ import annotations

from typing import Any

from sglang_hooks.adapters.base import (
    AFTER,
    AROUND,
    Adapter,
    HookSpec,
    OffPathFeature,
    SymbolSpec,
)
from sglang_hooks.adapters.common import COMMON_HOOKS, COMMON_READS

_STATE = "sglang.srt.managers.scheduler_components.internal_state"
_CTRL = "SchedulerInternalStateController"


def _tokens(result: Any, batch_size: int) -> int:
    # accepted drafts + the tokens every request emits without drafting (the bonus token)
    return int(result.num_correct_drafts) + batch_size * int(result.num_non_draft_tokens_per_req)


ADAPTER = Adapter(
    name="sglang-0.5.23",
    min_version=(0, 5, 18),
    max_version=(0, 5, 23),
    # The draft's work skipped while off. Depth 0 as a plain decode and the host-work trims
    # are 0.5.17's (they reproduce that release's bodies and were measured there only).
    off_path=frozenset({OffPathFeature.SKIP_EXTEND, OffPathFeature.SKIP_DRAFT_PREFILL}),
    hooks=(
        *COMMON_HOOKS,
        HookSpec(f"{_STATE}.{_CTRL}.set_internal_state", AROUND, "set_internal_state",
                 SymbolSpec(_STATE, _CTRL, "set_internal_state", ("recv_req",))),
        HookSpec(f"{_STATE}.{_CTRL}.get_internal_state", AFTER, "get_internal_state",
                 SymbolSpec(_STATE, _CTRL, "get_internal_state", ("recv_req",))),
    ),
    reads=(
        *COMMON_READS,
        SymbolSpec(_STATE, _CTRL, "__init__", ("scheduler", "record_step_time")),
        SymbolSpec("sglang.srt.managers.utils", "GenerationBatchResult",
                   "num_non_draft_tokens_per_req", attribute=True),
    ),
    scheduler_of=lambda controller: controller.scheduler,
    tokens_of=_tokens,
)
