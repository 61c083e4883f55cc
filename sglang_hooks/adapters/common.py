"""Hooks whose symbols are the same in every supported SGLang version."""

from __future__ import annotations

from sglang_hooks.adapters.base import AFTER, AROUND, HookSpec, SymbolSpec

_PARAMS = "sglang.srt.speculative.adaptive_spec_params"
_RUNTIME = "sglang.srt.speculative.adaptive_runtime_state"
_WORKER = "sglang.srt.speculative.eagle_worker_v2"
_RESULTS = "sglang.srt.managers.scheduler_components.batch_result_processor"
_METRICS = "sglang.srt.observability.metrics_collector"
_TOKENIZER = "sglang.srt.managers.tokenizer_manager"
_TOKENIZER_MIXIN = "sglang.srt.managers.tokenizer_control_mixin"
_UTILS = "sglang.srt.managers.utils"


def _hook(module: str, cls: str, name: str, kind: str, hook: str, *params: str,
          defined_in: tuple[str, str] | None = None, is_async: bool = False) -> HookSpec:
    mod, klass = defined_in or (module, cls)
    return HookSpec(
        target=f"{module}.{cls}.{name}",
        kind=kind,
        hook=hook,
        symbol=SymbolSpec(mod, klass, name, params, is_async=is_async),
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
    _hook(_RESULTS, "SchedulerBatchResultProcessor", "_resolve_spec_v2_tokens", AFTER,
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
)
