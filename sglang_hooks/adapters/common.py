"""Hooks whose symbols are the same in every supported SGLang version."""

from __future__ import annotations

from sglang_hooks.adapters.base import AFTER, AROUND, HookSpec, OffPathFeature, SymbolSpec

_PARAMS = "sglang.srt.speculative.adaptive_spec_params"
_RUNTIME = "sglang.srt.speculative.adaptive_runtime_state"
_WORKER = "sglang.srt.speculative.eagle_worker_v2"
_RESULTS = "sglang.srt.managers.scheduler_components.batch_result_processor"
_METRICS = "sglang.srt.observability.metrics_collector"
_TOKENIZER = "sglang.srt.managers.tokenizer_manager"
_TOKENIZER_MIXIN = "sglang.srt.managers.tokenizer_control_mixin"
_UTILS = "sglang.srt.managers.utils"
_BATCH = "sglang.srt.managers.schedule_batch"
_CONTEXT = "sglang.srt.runtime_context"
_INFO = "sglang.srt.speculative.eagle_info"


def _hook(module: str, cls: str, name: str, kind: str, hook: str, *params: str,
          defined_in: tuple[str, str] | None = None, is_async: bool = False,
          feature: OffPathFeature | None = None) -> HookSpec:
    mod, klass = defined_in or (module, cls)
    return HookSpec(
        target=f"{module}.{cls}.{name}",
        kind=kind,
        hook=hook,
        symbol=SymbolSpec(mod, klass, name, params, is_async=is_async),
        feature=feature,
    )


COMMON_HOOKS: tuple[HookSpec, ...] = (
    _hook(_PARAMS, "AdaptiveSpeculativeParams", "get_steps_for_batch", AROUND,
          "choose_depth", "batch_size"),
    _hook(_PARAMS, "AdaptiveSpeculativeParams", "on_verify_complete", AROUND,
          "feed_ema", "num_correct_drafts_per_req", "batch_size"),
    _hook(_RUNTIME, "AdaptiveController", "init_states", AFTER,
          "on_states_built", "cuda_graph_bs"),
    _hook(_WORKER, "EAGLEWorkerV2", "forward_batch_generation", AROUND,
          "time_launch", "batch"),
    _hook(_WORKER, "EAGLEWorkerV2", "apply_runtime_state", AROUND,
          "on_apply_state", "state"),
    _hook(_WORKER, "EagleDraftWorker", "_draft_extend_for_decode", AROUND,
          "skip_extend", "batch", "batch_result", feature=OffPathFeature.SKIP_EXTEND),
    _hook(_WORKER, "EagleDraftWorker", "_draft_extend_for_prefill", AROUND,
          "skip_draft_prefill", "batch", "target_hidden_states", "next_token_ids",
          feature=OffPathFeature.SKIP_DRAFT_PREFILL),
    _hook(_RESULTS, "SchedulerBatchResultProcessor", "_resolve_spec_v2_tokens", AROUND,
          "count_result", "result", "batch"),
    _hook(_METRICS, "SchedulerMetricsCollector", "__init__", AFTER,
          "on_metrics_collector", "labels"),
    _hook(_TOKENIZER, "TokenizerManager", "__init__", AFTER,
          "on_tokenizer_manager", "server_args", "port_args"),
    _hook(_TOKENIZER, "TokenizerManager", "set_internal_state", AROUND,
          "validate_push", "obj", defined_in=(_TOKENIZER_MIXIN, "TokenizerControlMixin"),
          is_async=True),
)

COMMON_READS: tuple[SymbolSpec, ...] = (
    SymbolSpec(_UTILS, "GenerationBatchResult", "speculative_num_draft_tokens",
               attribute=True),
    SymbolSpec(_UTILS, "GenerationBatchResult", "num_correct_drafts", attribute=True),
    SymbolSpec(_PARAMS, "AdaptiveSpeculativeParams", "cuda_graph_bs_for_step", ("step",)),
    SymbolSpec(_PARAMS, "AdaptiveSpeculativeParams", "candidate_steps"),
    SymbolSpec(_TOKENIZER_MIXIN, "TokenizerControlMixin", "get_internal_state",
               is_async=True),
    # skip-extend: SGLang's own stub for a skipped draft extend
    SymbolSpec(_WORKER, "EAGLEWorkerV2", "_stub_skipped_draft_extend",
               ("batch", "batch_output")),
    # the draft prefill's skip: the draft input it builds, and what says a batch is idle
    *(SymbolSpec(_INFO, "EagleDraftInput", name, attribute=True)
      for name in ("bonus_tokens", "num_tokens_per_req", "num_tokens_for_logprob_per_req")),
    SymbolSpec(_BATCH, "ScheduleBatch", "reqs", attribute=True),
    # the configuration a scheduler checks before it steers (pipeline parallelism)
    SymbolSpec(_WORKER, "EAGLEWorkerV2", "server_args", instance=True),
    # emitted-token counts: the rows SGLang's output loop skips
    SymbolSpec(_BATCH, "Req", "finished_reason", instance=True),
    SymbolSpec(_BATCH, "Req", "is_retracted", instance=True),
    # the override log each depth switch appends to
    SymbolSpec(_CONTEXT, "RuntimeContext", "override", ("source",)),
    SymbolSpec(_CONTEXT, "RuntimeContext", "_overrides_log", instance=True),
)


# Draft shapes (shapes.py), registered only where SPECCTL_SHAPES lists shapes: the capture after
# SGLang's graphs, the switch where SGLang's adaptive mode chooses its state, the narrower
# shape's draft (0.5.23's keyword-only `with_topology` passes through).
SHAPE_HOOKS: tuple[HookSpec, ...] = (
    HookSpec(f"{_WORKER}.EAGLEWorkerV2.init_cuda_graphs", AFTER, "shapes_build",
             SymbolSpec(_WORKER, "EAGLEWorkerV2", "init_cuda_graphs"), shapes=True),
    HookSpec(f"{_WORKER}.EAGLEWorkerV2.activate_step_by_batch", AROUND, "shape_switch",
             SymbolSpec(_WORKER, "EAGLEWorkerV2", "activate_step_by_batch", ("batch_size",)),
             shapes=True),
    HookSpec(f"{_WORKER}.EagleDraftWorker.draft", AROUND, "shape_draft",
             SymbolSpec(_WORKER, "EagleDraftWorker", "draft", ("batch",)), shapes=True),
)
