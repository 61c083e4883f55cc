"""SGLang 0.5.17: `Scheduler.set_internal_state` checks a hard-coded whitelist itself.

The plugin wraps that method: the specctl keys are taken out before the whitelist sees them
(it would refuse them), the table is validated as a whole, the other keys go to SGLang
unchanged, and the table is installed only if SGLang accepted the rest. With no other keys
SGLang's method is not called at all, because on success it also resets the acceptance-rate
statistics, which a policy push should not do.
"""

from __future__ import annotations

from typing import Any

from sglang_hooks.adapters.base import AFTER, AROUND, Adapter, HookSpec, SymbolSpec
from sglang_hooks.adapters.common import COMMON_HOOKS, COMMON_READS

_SCHED = "sglang.srt.managers.scheduler"
_ALLOC = "sglang.srt.mem_cache.allocation"
_OVERLAP = "sglang.srt.managers.overlap_utils"


def _tokens(result: Any, batch_size: int) -> int:
    # 0.5.17 sets num_correct_drafts = sum(accept_lens) - batch size: one bonus per request
    return int(result.num_correct_drafts) + batch_size


ADAPTER = Adapter(
    name="sglang-0.5.17",
    min_version=(0, 5, 17),
    max_version=(0, 5, 22),
    hooks=(
        *COMMON_HOOKS,
        HookSpec(f"{_SCHED}.Scheduler.set_internal_state", AROUND, "set_internal_state",
                 SymbolSpec(_SCHED, "Scheduler", "set_internal_state", ("recv_req",))),
        HookSpec(f"{_SCHED}.Scheduler.get_internal_state", AFTER, "get_internal_state",
                 SymbolSpec(_SCHED, "Scheduler", "get_internal_state", ("recv_req",))),
        # depth-0 relay trims (lean_relay.py): 0.5.23 leaves a payload's empty draft fields
        # out of the stash itself
        HookSpec(f"{_OVERLAP}.FutureMap.stash", AROUND, "lean_stash",
                 SymbolSpec(_OVERLAP, "FutureMap", "stash", ("future_indices", "payload"))),
        # host-work trims (lean_host.py): 0.5.23 reads the KV lengths as a list itself
        HookSpec(f"{_ALLOC}.alloc_for_spec_decode", AROUND, "lean_kv_lens",
                 SymbolSpec(_ALLOC, "", "alloc_for_spec_decode",
                            ("tree_cache", "nxt_kv_lens_cpu"))),
    ),
    reads=(
        *COMMON_READS,
        # depth-0 relay trims: the runner the WAR barrier reads, and the FutureMap state the
        # bonus-only stash reads and writes
        SymbolSpec("sglang.srt.speculative.eagle_worker_v2", "EAGLEWorkerV2",
                   "war_fastpath_runner"),
        SymbolSpec(_OVERLAP, "FutureMap", "_forward_buf_initialized", instance=True),
        SymbolSpec(_OVERLAP, "FutureMap", "output_tokens_buf", instance=True),
    ),
    scheduler_of=lambda scheduler: scheduler,
    tokens_of=_tokens,
)
