"""SGLang 0.5.23: admin updates go through `SchedulerInternalStateController`.

Its `_update_handlers()` validates and applies one key at a time, but a specctl table is only
valid as a whole (tier order, hysteresis bands), so the plugin wraps the controller's
`set_internal_state`: it takes the specctl keys out, validates the table, hands the other keys
to SGLang unchanged and installs the table only if SGLang accepted the rest.

Draft shapes (shapes.py) are built here as 0.5.23 builds an adaptive state: its backends and
graph runners read top-k, steps and draft tokens from the spec bag (`get_spec()`), changed
through `get_context().override`; the start-up record is sealed once resolved (an assignment
raises) and nothing a shape builds reads it.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

from sglang_hooks.adapters.base import (
    AFTER,
    AROUND,
    SHAPE_CAPTURE_SOURCE,
    TOPK_FIELD,
    Adapter,
    HookSpec,
    OffPathFeature,
    ShapeBuild,
    SymbolSpec,
)
from sglang_hooks.adapters.common import COMMON_HOOKS, COMMON_READS, SHAPE_HOOKS

_STATE = "sglang.srt.managers.scheduler_components.internal_state"
_CTRL = "SchedulerInternalStateController"
_WORKER = "sglang.srt.speculative.eagle_worker_v2"
_SPEC_UTILS = "sglang.srt.speculative.spec_utils"
_RUNNER = "sglang.srt.model_executor.runner.decode_cuda_graph_runner"
_MODEL_RUNNER = "sglang.srt.model_executor.model_runner"
_SIZING = "sglang.srt.mem_cache.allocation_sizing"
_BAG_TOPK = "get_spec().speculative_eagle_topk"
_RESERVE = "get_alloc_reserve_per_decode()"
_EXTEND_TOPK = "fast_topk(probs, self.topk, dim=-1)"


def _tokens(result: Any, batch_size: int) -> int:
    # accepted drafts + the tokens every request emits without drafting (the bonus token)
    return int(result.num_correct_drafts) + batch_size * int(result.num_non_draft_tokens_per_req)


# ----------------------------------------------------------------------------- draft shapes


@contextlib.contextmanager
def _capture_topk(worker: Any, topk: int) -> Iterator[None]:
    """Top-k in the spec bag, where FlashAttention 3, the draft graph runners and the verify
    graphs' spec info read it, put back to what it held. The bag is also what sizes the KV
    reserve per decode batch, which is why only a capture writes it, never a switch."""
    from sglang.srt.runtime_context import get_context, get_spec

    context, before = get_context(), get_spec().speculative_eagle_topk
    try:
        context.override(SHAPE_CAPTURE_SOURCE, **{TOPK_FIELD: topk})
        yield
    finally:
        context.override(SHAPE_CAPTURE_SOURCE, **{TOPK_FIELD: before})


@contextlib.contextmanager
def _capture_contexts(worker: Any) -> Iterator[None]:
    """As `EAGLEWorkerV2.init_cuda_graphs` builds its adaptive states: the draft's resolved
    parallel layout (`draft_tp_context(parallel_layout)`), then the speculative MoE contexts."""
    module = sys.modules[type(worker).__module__]
    with (module.draft_tp_context(worker._draft_worker.parallel_layout),
          module.speculative_moe_backend_context(),
          module.speculative_moe_a2a_backend_context()):
        yield


def _target_graph_runner(worker: Any) -> Any:
    """The class `build_adaptive_runtime_state` captures the target verify with: SGLang's own
    (NPU or CUDA), an out-of-tree platform's, or None where that platform captures none."""
    module = sys.modules[type(worker).__module__]
    return module._select_spec_graph_runner_cls(
        builtin_runner_cls=lambda: (
            module.NPUGraphRunner if module._is_npu else module.DecodeCudaGraphRunner),
        oot_runner_cls=module.current_platform.get_graph_runner_cls,
    )


SHAPE_BUILD = ShapeBuild(topk=_capture_topk, contexts=_capture_contexts,
                         target_graph_runner=_target_graph_runner)


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
        *SHAPE_HOOKS,
    ),
    reads=(
        *COMMON_READS,
        SymbolSpec(_STATE, _CTRL, "__init__", ("scheduler", "record_step_time")),
        SymbolSpec("sglang.srt.managers.utils", "GenerationBatchResult",
                   "num_non_draft_tokens_per_req", attribute=True),
    ),
    shape_reads=(
        # a shape's capture: what SGLang's adaptive state builder calls and enters
        SymbolSpec(_WORKER, "EAGLEWorkerV2", "_override_worker_state",
                   ("speculative_num_steps", "speculative_num_draft_tokens")),
        SymbolSpec(_WORKER, "EagleDraftWorker", "init_attention_backend"),
        SymbolSpec(_WORKER, "EagleDraftWorker", "_capture_cuda_graphs"),
        SymbolSpec("sglang.srt.speculative.base_spec_worker", "EagleDraftWorkerBase",
                   "_rebuild_topk1_chain_buffers"),
        SymbolSpec(_WORKER, "", "_select_spec_graph_runner_cls",
                   ("builtin_runner_cls", "oot_runner_cls")),
        SymbolSpec(_SPEC_UTILS, "", "draft_tp_context", ("layout",)),
        SymbolSpec(_RUNNER, "DecodeCudaGraphRunner", "__init__", ("model_runner",)),
        SymbolSpec(_MODEL_RUNNER, "ModelRunner", "_get_attention_backend",
                   ("init_new_workspace",)),
        SymbolSpec(_MODEL_RUNNER, "ModelRunner", "init_new_workspace", instance=True),
        # the fields a capture and a switch read and assign
        *(SymbolSpec(_WORKER, "EagleDraftWorker", name, instance=True)
          for name in ("topk", "speculative_num_steps", "speculative_num_draft_tokens",
                       "draft_runner", "parallel_layout")),
        *(SymbolSpec(_WORKER, "EAGLEWorkerV2", name, instance=True)
          for name in ("topk", "speculative_num_steps", "speculative_num_draft_tokens",
                       "adaptive_controller", "_target_worker", "_draft_worker")),
        # where a shape's builders read top-k (and the widths): the spec bag
        SymbolSpec("sglang.srt.layers.attention.flashattention_backend",
                   "FlashAttentionBackend", "__init__", ("model_runner",), reads=_BAG_TOPK),
        SymbolSpec("sglang.srt.speculative.eagle_draft_cuda_graph_runner",
                   "EAGLEDraftCudaGraphRunner", "__init__", ("eagle_worker",), reads=_BAG_TOPK),
        SymbolSpec(_RUNNER, "DecodeCudaGraphRunner", "get_spec_info", ("num_tokens",),
                   reads=_BAG_TOPK),
        SymbolSpec(_SPEC_UTILS, "", "resolve_num_tokens_per_req", ("phase",),
                   reads="spec = get_spec()"),
        # the width rule: the extend's top-k is the draft worker's, outside any shape's graph
        SymbolSpec(_WORKER, "EagleDraftWorker", "_draft_extend_for_decode",
                   ("batch", "batch_result"), reads=_EXTEND_TOPK),
        # the KV reserve per decode batch: from the bag, which a switch leaves at the start-up
        # shape (a reserve that followed the live shape could land a wider draft in KV the
        # request does not own)
        SymbolSpec(_SIZING, "", "get_alloc_len_per_decode", reads="spec = get_spec()"),
        SymbolSpec(_SIZING, "", "get_alloc_reserve_per_decode",
                   reads="get_alloc_len_per_decode()"),
        SymbolSpec("sglang.srt.speculative.eagle_utils", "", "eagle_prepare_for_decode",
                   ("batch",), reads=_RESERVE),
        SymbolSpec("sglang.srt.managers.schedule_batch", "ScheduleBatch",
                   "_new_tokens_required_next_decode_spec_v2", ("requests", "page_size"),
                   reads=_RESERVE),
    ),
    scheduler_of=lambda controller: controller.scheduler,
    tokens_of=_tokens,
    shape_build=SHAPE_BUILD,
)
