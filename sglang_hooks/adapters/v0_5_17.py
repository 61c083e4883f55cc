"""SGLang 0.5.17: `Scheduler.set_internal_state` checks a hard-coded whitelist itself.

The plugin wraps that method: the specctl keys are taken out before the whitelist sees them
(it would refuse them), the table is validated as a whole, the other keys go to SGLang
unchanged, and the table is installed only if SGLang accepted the rest. With no other keys
SGLang's method is not called at all, because on success it also resets the acceptance-rate
statistics, which a policy push should not do.
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

_SCHED = "sglang.srt.managers.scheduler"
_ALLOC = "sglang.srt.mem_cache.allocation"
_OVERLAP = "sglang.srt.managers.overlap_utils"
_WORKER = "sglang.srt.speculative.eagle_worker_v2"
_RUNNER = "sglang.srt.model_executor.runner.decode_cuda_graph_runner"
_MODEL_RUNNER = "sglang.srt.model_executor.model_runner"
_FORWARD = "sglang.srt.model_executor.forward_batch_info"
_EAGLE = "sglang.srt.speculative.eagle_utils"
_BATCH = "sglang.srt.managers.schedule_batch"
_BASE_ALLOC = "sglang.srt.mem_cache.allocator.base"
_INFO = "sglang.srt.speculative.eagle_info"


def _tokens(result: Any, batch_size: int) -> int:
    # 0.5.17 sets num_correct_drafts = sum(accept_lens) - batch size: one bonus per request
    return int(result.num_correct_drafts) + batch_size


# ----------------------------------------------------------------------------- draft shapes
# How a shape is built here (shapes.capture): FlashAttention 3, the draft graph runners and the
# verify widths read top-k from the read-only start-up record, which changes only through its
# `override(source, **fields)`.


def _start_up_records(worker: Any) -> list[Any]:
    """Every distinct start-up record the backends and runners read top-k from."""
    dw = worker._draft_worker
    found: dict[int, Any] = {}
    for owner in (worker, dw, worker._target_worker.model_runner, dw.draft_runner):
        args = getattr(owner, "server_args", None)
        if args is not None:
            found.setdefault(id(args), args)
    return list(found.values())


def _set_record_topk(records: list[Any], topk: int) -> None:
    for args in records:
        override = getattr(args, "override", None)
        if callable(override):  # the read-only record changes only through it
            override(SHAPE_CAPTURE_SOURCE, **{TOPK_FIELD: topk})
        else:
            setattr(args, TOPK_FIELD, topk)


def _set_bag_topk(topk: int | None) -> None:
    """The spec bag's top-k too (some backends read it there); absent while unpublished."""
    from sglang.srt.runtime_context import get_context

    if topk is not None:
        with contextlib.suppress(ValueError):
            get_context().override(SHAPE_CAPTURE_SOURCE, **{TOPK_FIELD: topk})


def _bag_topk() -> int | None:
    from sglang.srt.runtime_context import get_spec

    try:
        return int(get_spec().speculative_eagle_topk)
    except (ValueError, TypeError):  # unpublished
        return None


@contextlib.contextmanager
def _capture_topk(worker: Any, topk: int) -> Iterator[None]:
    records = _start_up_records(worker)
    startup, bag = [getattr(a, TOPK_FIELD) for a in records], _bag_topk()
    try:
        _set_record_topk(records, topk)
        _set_bag_topk(topk)
        yield
    finally:
        for args, value in zip(records, startup, strict=True):
            _set_record_topk([args], value)
        _set_bag_topk(bag)


@contextlib.contextmanager
def _capture_contexts(worker: Any) -> Iterator[None]:
    """As `EAGLEWorkerV2.init_cuda_graphs` builds its adaptive states: the draft worker's own
    TP context on its runner's group, then the speculative MoE contexts."""
    module = sys.modules[type(worker).__module__]
    dw = worker._draft_worker
    with (dw.draft_tp_context(dw.draft_runner.tp_group),
          module.speculative_moe_backend_context(),
          module.speculative_moe_a2a_backend_context()):
        yield


def _target_graph_runner(worker: Any) -> Any:
    return sys.modules[type(worker).__module__].DecodeCudaGraphRunner


SHAPE_BUILD = ShapeBuild(topk=_capture_topk, contexts=_capture_contexts,
                         target_graph_runner=_target_graph_runner)
_FA3 = "sglang.srt.layers.attention.flashattention_backend"
_RECORD_TOPK = "model_runner.server_args.speculative_eagle_topk"


_HOST_TRIMS, _PLAIN_DECODE = OffPathFeature.HOST_TRIMS, OffPathFeature.PLAIN_DECODE

ADAPTER = Adapter(
    name="sglang-0.5.17",
    min_version=(0, 5, 17),
    max_version=(0, 5, 22),
    # Measured on 0.5.17 (FA3, the seeded 8B pair), all four together: depth 0 at 0.98-1.01
    # of a plain server's tok/s at 1-128 streams on an H200 and 0.98-1.00 on an H100, greedy
    # outputs identical to a plain server's over 1,000 depth switches (docs/sglang.md, "Off").
    off_path=frozenset({OffPathFeature.SKIP_EXTEND, OffPathFeature.SKIP_DRAFT_PREFILL,
                        _PLAIN_DECODE, _HOST_TRIMS}),
    hooks=(
        *COMMON_HOOKS,
        HookSpec(f"{_SCHED}.Scheduler.set_internal_state", AROUND, "set_internal_state",
                 SymbolSpec(_SCHED, "Scheduler", "set_internal_state", ("recv_req",))),
        HookSpec(f"{_SCHED}.Scheduler.get_internal_state", AFTER, "get_internal_state",
                 SymbolSpec(_SCHED, "Scheduler", "get_internal_state", ("recv_req",))),
        # host-work trims (lean_host.py): the trivial verify input; the KV lengths as a list
        # (0.5.23 reads them as a list itself); the decode preparation, the next decode's KV
        # estimate, the free group's end, the next lengths' hand-over and the forward's
        # isolation as 0.5.17 writes them
        HookSpec(f"{_WORKER}.EAGLEWorkerV2._build_trivial_verify_input", AROUND,
                 "lean_trivial_verify",
                 SymbolSpec(_WORKER, "EAGLEWorkerV2", "_build_trivial_verify_input", ("batch",)),
                 _HOST_TRIMS),
        HookSpec(f"{_ALLOC}.alloc_for_spec_decode", AROUND, "lean_kv_lens",
                 SymbolSpec(_ALLOC, "", "alloc_for_spec_decode",
                            ("tree_cache", "nxt_kv_lens_cpu")), _HOST_TRIMS),
        HookSpec(f"{_EAGLE}.eagle_prepare_for_decode", AROUND, "lean_prepare",
                 SymbolSpec(_EAGLE, "", "eagle_prepare_for_decode", ("batch",)), _HOST_TRIMS),
        HookSpec(f"{_BATCH}.ScheduleBatch._new_tokens_required_next_decode_spec_v2", AROUND,
                 "lean_tokens_required",
                 SymbolSpec(_BATCH, "ScheduleBatch", "_new_tokens_required_next_decode_spec_v2",
                            ("requests", "page_size")), _HOST_TRIMS),
        HookSpec(f"{_BASE_ALLOC}.BaseTokenToKVPoolAllocator.free_group_end", AROUND,
                 "lean_free_group_end",
                 SymbolSpec(_BASE_ALLOC, "BaseTokenToKVPoolAllocator", "free_group_end"),
                 _HOST_TRIMS),
        HookSpec(f"{_OVERLAP}.FutureMap.resolve_seq_lens_cpu", AROUND, "lean_seq_lens",
                 SymbolSpec(_OVERLAP, "FutureMap", "resolve_seq_lens_cpu", ("batch",)),
                 _HOST_TRIMS),
        HookSpec(f"{_SCHED}.Scheduler._forward_isolation", AROUND, "lean_isolation",
                 SymbolSpec(_SCHED, "Scheduler", "_forward_isolation", ("batch",)), _HOST_TRIMS),
        # depth 0 as a plain decode (plain_decode.py): the capture after the adaptive states,
        # and the verify it replaces
        HookSpec(f"{_WORKER}.EAGLEWorkerV2.init_cuda_graphs", AFTER, "plain_decode_build",
                 SymbolSpec(_WORKER, "EAGLEWorkerV2", "init_cuda_graphs"), _PLAIN_DECODE),
        HookSpec(f"{_WORKER}.EAGLEWorkerV2.verify", AROUND, "plain_decode_verify",
                 SymbolSpec(_WORKER, "EAGLEWorkerV2", "verify", ("batch", "grammar_barrier")),
                 _PLAIN_DECODE),
        *SHAPE_HOOKS,
    ),
    reads=(
        *COMMON_READS,
        # the forward's isolation: the pinning it keeps calling
        SymbolSpec(_SCHED, "Scheduler", "record_batch_in_overlap", ("batch",)),
        # the free group's end: the allocator state it joins the group to
        SymbolSpec("sglang.srt.mem_cache.allocator.token", "TokenToKVPoolAllocator", "free",
                   ("free_index",)),
        *(SymbolSpec(_BASE_ALLOC, "BaseTokenToKVPoolAllocator", name, instance=True)
          for name in ("need_sort", "free_pages", "release_pages", "is_not_in_free_group",
                       "free_group")),
        # the trivial verify input's fields the host-work trims rebuild it with (and the
        # worker's target and top-k, which the plain decode reads too)
        SymbolSpec(_WORKER, "EAGLEWorkerV2", "topk", instance=True),
        SymbolSpec(_WORKER, "EAGLEWorkerV2", "_target_worker", instance=True),
        SymbolSpec(_INFO, "EagleVerifyInput", "retrieve_next_sibling", attribute=True),
        SymbolSpec(_INFO, "EagleVerifyInput", "seq_lens_cpu", attribute=True),
        # the fence at the replay (fence.py): the runner whose event the WAR barrier reads
        SymbolSpec(_WORKER, "EAGLEWorkerV2", "war_fastpath_runner"),
        # the next lengths' hand-over (host-work trims)
        *(SymbolSpec(_OVERLAP, "FutureMap", name, instance=True)
          for name in ("publish_ready", "new_seq_lens_buf", "needs_cpu_seq_lens",
                       "fwd_prepare_d2h_stream", "new_seq_lens_cpu_pinned", "device")),
        # depth 0 as a plain decode: what builds its runner and what it calls per batch
        SymbolSpec(_WORKER, "EAGLEWorkerV2", "_override_worker_state",
                   ("speculative_num_steps", "speculative_num_draft_tokens")),
        # where the worker's req_to_token_pool is set
        SymbolSpec("sglang.srt.speculative.base_spec_worker", "BaseSpecWorker",
                   "alloc_memory_pool", ("memory_pool_config", "req_to_token_pool")),
        SymbolSpec(_RUNNER, "DecodeCudaGraphRunner", "__init__",
                   ("model_runner",)),  # then keyword-only: attn_backend, the two widths
        SymbolSpec(_RUNNER, "DecodeCudaGraphRunner", "capture"),
        # a shape's capture (shapes.py): what SGLang's adaptive state builder calls, and the
        # fields a switch assigns
        SymbolSpec(_WORKER, "EagleDraftWorker", "init_attention_backend"),
        SymbolSpec(_WORKER, "EagleDraftWorker", "_capture_cuda_graphs"),
        SymbolSpec("sglang.srt.speculative.base_spec_worker", "EagleDraftWorkerBase",
                   "_rebuild_topk1_chain_buffers"),
        *(SymbolSpec(_WORKER, "EagleDraftWorker", name, instance=True)
          for name in ("topk", "draft_tp_context", "draft_runner")),
        SymbolSpec(_WORKER, "EAGLEWorkerV2", "adaptive_controller", instance=True),
        SymbolSpec(_RUNNER, "DecodeCudaGraphRunner", "get_spec_info", ("num_tokens",)),
        SymbolSpec(_RUNNER, "DecodeCudaGraphRunner", "can_run_graph", ("forward_batch",)),
        SymbolSpec(_MODEL_RUNNER, "ModelRunner", "_get_attention_backend",
                   ("init_new_workspace",)),
        SymbolSpec(_MODEL_RUNNER, "ModelRunner", "init_new_workspace", instance=True),
        SymbolSpec(_FORWARD, "ForwardBatch", "init_new",
                   ("batch", "model_runner")),
        SymbolSpec("sglang.srt.managers.tp_worker", "TpModelWorker", "forward_batch_generation",
                   ("batch", "forward_batch")),
        SymbolSpec("sglang.srt.speculative.spec_utils", "", "record_stream_for_v2_verify",
                   ("batch", "verify_input", "fwd_stream")),
    ),
    shape_reads=(
        SymbolSpec(_RUNNER, "DecodeCudaGraphRunner", "get_spec_info", ("num_tokens",),
                   reads=f"self.{_RECORD_TOPK}"),
        # where a shape's builders read top-k: the start-up record, and how it changes
        SymbolSpec(_FA3, "FlashAttentionBackend", "__init__", ("model_runner",),
                   reads=_RECORD_TOPK),
        SymbolSpec("sglang.srt.speculative.eagle_draft_cuda_graph_runner",
                   "EAGLEDraftCudaGraphRunner", "__init__", ("eagle_worker",),
                   reads=_RECORD_TOPK),
        SymbolSpec("sglang.srt.server_args", "ServerArgs", "override", ("source",)),
        # the width rule: the extend's top-k is the draft worker's
        SymbolSpec(_WORKER, "EagleDraftWorker", "_draft_extend_for_decode",
                   ("batch", "batch_result"), reads="fast_topk(probs, self.topk, dim=-1)"),
    ),
    scheduler_of=lambda scheduler: scheduler,
    tokens_of=_tokens,
    shape_build=SHAPE_BUILD,
)
