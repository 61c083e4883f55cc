"""Depth 0 as a plain decode: the target's own DECODE graph instead of a one-token verify.

A speculative SGLang server runs depth 0 through spec-v2's verify: the target forward in
TARGET_VERIFY mode over the previous bonus token, then `eagle_sample` and the accepted-token
bookkeeping, with its metadata prepared on a second stream. A server without speculation runs
the same token through a DECODE-mode CUDA graph and the sampler. On the SGLang versions whose
adapter declares this path (`OffPathFeature.PLAIN_DECODE`), a depth-0 decode batch takes the
plain server's path for its target forward:

- **At start-up** (after `EAGLEWorkerV2.init_cuda_graphs`): one more target graph runner,
  captured in DECODE mode with full hidden states (the draft's extend and a later positive
  depth read the target's EAGLE-3 hidden states) on a fresh attention backend of its own.
  SGLang's runner captures TARGET_VERIFY on every speculative model runner and has no switch
  for it, so a subclass sets the mode where the capture starts. The backend cannot be shared:
  FA3's `init_cuda_graph_state` rebuilds every metadata buffer of the backend it is given.
- **Each depth-0 decode** (AROUND `EAGLEWorkerV2.verify`): the target runs in DECODE mode on
  the KV slot spec-v2 already reserved for the token (`req_to_token[req, seq_len]`; no new
  allocation, which would leak the reserved one), with `seq_lens + 1` as a plain decode counts
  them, the DECODE runner and its backend swapped into the model runner for that call only.
  The result is shaped like a one-token verify's (one token and an accept length of 1 per
  request, the new lengths, the bonus tokens for the next iteration), and the batch is left
  as the verify leaves it, so spec-v2's publish, draft extend (or its skip) and hand-over run
  unchanged, except that the WAR barrier gets the DECODE graph's read-done event (fence.py).
- **Its own host work, kept small** (each tensor operation on the forward's stream costs the
  scheduler a launch, and at 128 streams the scheduler has no slack left): the new lengths are
  one tensor, used for the forward and handed over as the next lengths; the accept lengths
  are ones, built once per batch size and shared, and kept on the host where no GPU work reads
  them (the overlap scheduler with the draft's extend skipped: its copy to the host is then
  none); in the overlap scheduler the bonus tokens stay in the sampler's int64, which is the
  dtype the FutureMap relays them in anyway, and the verify's `record_stream` calls are left
  out (the scheduler keeps the batch's tensors for two iterations).
- **Its result processing** (AROUND `_resolve_spec_v2_tokens`, with the per-depth counts):
  a result of this path is one token per request with no draft, so SGLang's accept-length
  bookkeeping comes down to one pass over the requests with the same effects (committed KV
  length, verify count, the correct-drafts histogram at 0, the adaptive feedback of zeros).
  A batch with a grammar goes through SGLang's own.

Batches that keep the verify: idle ones, those with a grammar (their mask is built inside the
verify against the tree) or asking for logprobs (spec-v2 reshapes them per accepted token),
and any batch the DECODE runner has no graph for. Servers that get no DECODE runner at all
(the reason is logged and on /server_info): other attention backends than FlashAttention 3,
top-k above 1, DP attention, pipeline parallelism, two-batch overlap, PD multiplexing, and
CUDA graphs off. Versions: SGLang 0.5.17 (the adapter that lists these hooks).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sglang_hooks import fence
from sglang_hooks.lean_host import PerBatchSize

logger = logging.getLogger("specctl")

_ATTR = "_specctl_plain_decode"  # per worker: its PlainDecode


@dataclass
class PlainDecode:
    """A worker's DECODE-mode target runner and backend, or why it has none."""

    runner: Any = None
    backend: Any = None
    reason: str | None = None
    build_s: float = 0.0
    memory_gb: float | None = None  # GPU memory the runner took at capture

    @property
    def ready(self) -> bool:
        """Captured, and not turned off since by a failure."""
        return self.runner is not None and self.reason is None


@dataclass
class _Stats:
    """What /server_info reports."""

    launches: int = 0  # depth-0 decodes run on the plain path
    fallbacks: int = 0  # depth-0 decodes that kept the verify (see `batch_reason`)
    last_fallback: str | None = None
    settled: int = 0  # results settled by `resolve_tokens` instead of SGLang's general body
    light_inputs: int = 0  # verify inputs built without the mask fill and positions (lean_host)
    workers: list[PlainDecode] = field(default_factory=list)


STATS = _Stats()


def state_report() -> dict[str, Any]:
    built = [w for w in STATS.workers if w.ready]
    reasons = sorted({w.reason for w in STATS.workers if w.reason})
    return {
        "runners": len(built),
        "unbuilt_reasons": reasons,
        "build_s": round(sum(w.build_s for w in built), 2),
        "memory_gb": (round(sum(w.memory_gb or 0.0 for w in built), 3) if built else None),
        "launches": STATS.launches,
        "fallbacks": STATS.fallbacks,
        "last_fallback": STATS.last_fallback,
        "settled": STATS.settled,
        "light_inputs": STATS.light_inputs,
    }


# ----------------------------------------------------------------------------- start-up


def server_reason(server_args: Any, worker: Any, backend: Any) -> str | None:
    """Why this worker gets no DECODE runner, or None."""
    if getattr(worker, "topk", None) != 1:
        return "top-k above 1 (tree verify)"
    if getattr(backend, "fa_impl_ver", None) != 3:
        return "the target's attention backend is not FlashAttention 3"
    if getattr(backend, "use_mla", True):
        return "MLA attention"
    for flag, what in (("enable_dp_attention", "DP attention"),
                       ("enable_two_batch_overlap", "two-batch overlap"),
                       ("enable_pdmux", "PD multiplexing"),
                       ("disable_cuda_graph", "CUDA graphs are off")):
        if getattr(server_args, flag, False):
            return what
    if (getattr(server_args, "pp_size", 1) or 1) > 1:
        return "pipeline parallelism"
    return None


_RUNNER_CLASS: Any = None


def runner_class() -> Any:
    """SGLang's DecodeCudaGraphRunner, capturing DECODE with full hidden states and no spec
    input. Its constructor chooses TARGET_VERIFY for any speculative model runner and captures
    at its end, so the mode is set where the capture starts."""
    global _RUNNER_CLASS
    if _RUNNER_CLASS is None:
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode
        from sglang.srt.model_executor.runner.decode_cuda_graph_runner import (
            DecodeCudaGraphRunner,
        )

        class PlainDecodeGraphRunner(DecodeCudaGraphRunner):  # type: ignore[misc]
            def capture(self) -> None:
                self.capture_forward_mode = ForwardMode.DECODE
                self.capture_hidden_mode = CaptureHiddenMode.FULL
                self.ragged_verify_mode = False  # a verify-only layout
                super().capture()

            def get_spec_info(self, num_tokens: int) -> Any:
                return None  # a spec input would make FA3 capture draft-decode metadata

        _RUNNER_CLASS = PlainDecodeGraphRunner
    return _RUNNER_CLASS


def build(worker: Any, *, make_runner: Callable[..., Any] | None = None,
          gpu_free_gb: Callable[[], float] | None = None,
          clock: Callable[[], float] | None = None) -> PlainDecode:
    """Capture the worker's DECODE-mode target runner on a fresh backend (once)."""
    import time

    existing = worker.__dict__.get(_ATTR)
    if existing is not None:
        return existing
    clock = clock or time.perf_counter
    model_runner = worker._target_worker.model_runner
    plain = PlainDecode(reason=server_reason(model_runner.server_args, worker,
                                             model_runner.attn_backend))
    worker.__dict__[_ATTR] = plain
    STATS.workers.append(plain)
    if plain.reason is not None:
        logger.warning("specctl: depth 0 keeps SGLang's verify path: %s", plain.reason)
        return plain
    make_runner = make_runner or runner_class()
    tic = clock()
    before = gpu_free_gb() if gpu_free_gb else None
    # As SGLang builds its depth-0 runtime state: the backend and the graphs sized for one
    # token per request (the backend reads the draft width from the server's spec settings).
    with worker._override_worker_state(0, 1):
        saved_workspace = model_runner.init_new_workspace
        try:
            backend = model_runner._get_attention_backend(init_new_workspace=True)
        finally:
            model_runner.init_new_workspace = saved_workspace
        runner = make_runner(model_runner, attn_backend=backend, speculative_num_steps=0,
                             speculative_num_draft_tokens=1)
    plain.runner, plain.backend = runner, backend
    plain.build_s = clock() - tic
    if before is not None and gpu_free_gb is not None:
        plain.memory_gb = before - gpu_free_gb()
    logger.info("specctl: depth 0 decodes with the target's DECODE graphs (captured in %.1f s%s)",
                plain.build_s, "" if plain.memory_gb is None else f", {plain.memory_gb:.2f} GB")
    return plain


# ----------------------------------------------------------------------------- per batch


NOT_DEPTH_0 = "not a depth-0 batch on a worker with a DECODE runner"


def batch_reason(worker: Any, batch: Any) -> str | None:
    """Why this decode batch keeps the verify, or None (checked before anything changes)."""
    reason = _launch_reason(worker, batch)
    if reason is not None:
        return reason
    verify_input = batch.spec_info
    if getattr(verify_input, "draft_token_num", None) != 1 \
            or getattr(verify_input, "draft_token", None) is None:
        return "not a one-token verify"
    return None


def expects(worker: Any, batch: Any) -> bool:
    """Whether this batch goes to the plain path as far as can be told before its verify input
    is built (`batch.spec_info` still the draft input with the previous bonus tokens): only the
    DECODE runner's graph for its size is left to see."""
    return _launch_reason(worker, batch) is None \
        and getattr(batch.spec_info, "bonus_tokens", None) is not None


def _launch_reason(worker: Any, batch: Any) -> str | None:
    """What keeps a batch on the verify whatever its verify input."""
    plain = worker.__dict__.get(_ATTR)
    if plain is None or not plain.ready or getattr(worker, "speculative_num_steps", None) != 0:
        return NOT_DEPTH_0
    if batch.forward_mode.is_idle():
        return "an idle batch"
    if batch.has_grammar:
        return "a grammar-constrained request"
    if batch.return_logprob:
        return "a request asking for logprobs"
    return None


@dataclass
class _Saved:
    """The batch fields the plain path changes, restored after it (or on a fallback)."""

    forward_mode: Any
    spec_info: Any
    input_ids: Any
    out_cache_loc: Any
    seq_lens: Any
    seq_lens_cpu: Any
    seq_lens_sum: Any

    @classmethod
    def of(cls, batch: Any) -> _Saved:
        return cls(batch.forward_mode, batch.spec_info, batch.input_ids, batch.out_cache_loc,
                   batch.seq_lens, batch.seq_lens_cpu, batch.seq_lens_sum)

    def restore(self, batch: Any) -> None:
        (batch.forward_mode, batch.spec_info, batch.input_ids, batch.out_cache_loc,
         batch.seq_lens, batch.seq_lens_cpu, batch.seq_lens_sum) = (
            self.forward_mode, self.spec_info, self.input_ids, self.out_cache_loc,
            self.seq_lens, self.seq_lens_cpu, self.seq_lens_sum)


@dataclass
class SglangParts:
    """The SGLang names the plain path calls (looked up once; tests pass their own)."""

    forward_mode: Any  # ForwardMode
    capture_hidden_mode: Any  # CaptureHiddenMode
    forward_batch: Callable[..., Any]  # ForwardBatch.init_new
    result: Callable[..., Any]  # GenerationBatchResult
    draft_input: Callable[..., Any]  # EagleDraftInput
    record_streams: Callable[[Any, Any], None]  # (batch, verify input): as the verify does


_PARTS: SglangParts | None = None


def sglang_parts() -> SglangParts:
    global _PARTS
    if _PARTS is None:
        import torch
        from sglang.srt.managers.utils import GenerationBatchResult
        from sglang.srt.model_executor.forward_batch_info import (
            CaptureHiddenMode,
            ForwardBatch,
            ForwardMode,
        )
        from sglang.srt.speculative.eagle_info import EagleDraftInput
        from sglang.srt.speculative.spec_utils import record_stream_for_v2_verify

        def record(batch: Any, verify_input: Any) -> None:
            stream = torch.get_device_module(batch.seq_lens.device).current_stream()
            record_stream_for_v2_verify(batch, verify_input, stream)

        _PARTS = SglangParts(ForwardMode, CaptureHiddenMode, ForwardBatch.init_new,
                             GenerationBatchResult, EagleDraftInput, record)
    return _PARTS


def disable(worker: Any, why: str) -> None:
    """Send every later depth-0 batch of this worker back to the verify (its graphs are kept:
    freeing captured graphs while serving is not worth the risk)."""
    plain = worker.__dict__.get(_ATTR)
    if plain is not None:
        plain.reason = why


# Accept lengths of depth-0 results (all ones), per (batch size, device): read-only wherever
# SGLang reads them (the host copy, the draft extend's arithmetic), so one tensor serves all.
_ACCEPT_ONES = PerBatchSize()


def accept_ones(bs: int, device: Any) -> Any:
    import torch

    ones, _ = _ACCEPT_ONES.get((bs, str(device)),
                               lambda: torch.ones(bs, dtype=torch.int32, device=device))
    return ones


def accept_lens_to_device(result: Any, device: Any) -> None:
    """Put a result's accept lengths on `device` if they were kept on the host: for a draft
    extend that runs after all (the stub of a skipped one failed)."""
    accept_lens = getattr(result, "accept_lens", None)
    if accept_lens is not None and not accept_lens.is_cuda and str(device) != "cpu":
        result.accept_lens = accept_lens.to(device)


def decode(worker: Any, batch: Any, parts: SglangParts | None = None, *,
           extend_skipped: bool = False) -> Any | None:
    """The depth-0 decode on the DECODE graphs, as a one-token verify's result; None (the
    batch untouched) where the runner has no graph for it. `extend_skipped`: this launch
    stubs the draft's extend (nothing on the GPU reads the accept lengths)."""
    import torch

    parts = parts or sglang_parts()
    plain: PlainDecode = worker.__dict__[_ATTR]
    model_runner = worker._target_worker.model_runner
    saved = _Saved.of(batch)
    verify_input = saved.spec_info
    seq_lens = saved.seq_lens
    overlap = bool(getattr(batch, "enable_overlap", False))
    if not overlap:
        parts.record_streams(batch, verify_input)
    # The overlap scheduler needs no record: of what this forward reads, the schedule stream
    # made the lengths and the pool rows, fields of the batch that 0.5.17's
    # `record_batch_in_overlap` keeps for two iterations, past this forward's result; the
    # bonus tokens and the rest are made on the forward stream. A record costs a call, and the
    # allocator an event it polls at later allocations (tests/sglang/test_real_plain_decode.py
    # holds 0.5.17's scheduler to this).
    # The slot spec-v2 reserved for this token (where the verify would write it).
    out_cache_loc = worker.req_to_token_pool.req_to_token[
        batch.req_pool_indices, seq_lens].to(torch.int64)
    batch.forward_mode = parts.forward_mode.DECODE
    batch.spec_info = None
    batch.input_ids = verify_input.draft_token
    batch.out_cache_loc = out_cache_loc
    # A plain decode counts the token it writes; the same values are spec-v2's next lengths.
    new_seq_lens = seq_lens + 1
    batch.seq_lens = new_seq_lens
    if saved.seq_lens_cpu is not None:
        batch.seq_lens_cpu = saved.seq_lens_cpu + 1
    if saved.seq_lens_sum is not None:
        batch.seq_lens_sum = saved.seq_lens_sum + len(batch.reqs)
    # The read-done event the DECODE graph runner publishes before it replays (fence.py),
    # cleared first so that one found after is this forward's.
    read_done_attr = fence.event_attr(model_runner)
    if read_done_attr is not None:
        setattr(model_runner, read_done_attr, None)
    verify_runner, verify_backend = model_runner.decode_cuda_graph_runner, model_runner.attn_backend
    model_runner.decode_cuda_graph_runner, model_runner.attn_backend = plain.runner, plain.backend
    try:
        forward_batch = parts.forward_batch(
            batch, model_runner, capture_hidden_mode=parts.capture_hidden_mode.FULL,
            return_hidden_states_before_norm=False)
        if not plain.runner.can_run_graph(forward_batch):
            saved.restore(batch)
            return None
        output = worker._target_worker.forward_batch_generation(None, forward_batch=forward_batch)
    except BaseException:
        saved.restore(batch)
        raise
    finally:
        model_runner.decode_cuda_graph_runner = verify_runner
        model_runner.attn_backend = verify_backend
    next_token_ids = output.next_token_ids
    # With the overlap scheduler and the extend skipped, only the host reads them.
    accept_lens = accept_ones(seq_lens.shape[0],
                              "cpu" if overlap and extend_skipped else seq_lens.device)
    # The overlap scheduler relays the bonus tokens through its int64 buffer; the synchronous
    # one hands them on as they are, in the int32 of SGLang's verify.
    bonus_tokens = next_token_ids if overlap else next_token_ids.to(torch.int32)
    # Left as the verify leaves it: the draft extend reads the written slot and spec-v2's
    # lengths (without this token).
    saved.restore(batch)
    batch.forward_mode = parts.forward_mode.TARGET_VERIFY
    batch.input_ids = verify_input.draft_token
    batch.out_cache_loc = out_cache_loc
    result = parts.result(
        logits_output=output.logits_output,
        next_token_ids=next_token_ids,
        can_run_cuda_graph=output.can_run_cuda_graph,
        speculative_num_draft_tokens=1,
        next_draft_input=parts.draft_input(bonus_tokens=bonus_tokens),
        accept_lens=accept_lens,
        new_seq_lens=new_seq_lens,
        routed_experts_output=getattr(output, "routed_experts_output", None),
        indexer_topk_output=getattr(output, "indexer_topk_output", None),
        extra_keep_alive_refs=[forward_batch],
    )
    result.specctl_plain = True  # its result processing: `resolve_tokens`
    if read_done_attr is not None:
        setattr(result, fence.REPLAY_EVENT, getattr(model_runner, read_done_attr, None))
    return result


def plain_result(result: Any, batch: Any) -> bool:
    """Whether `resolve_tokens` settles this result: one of this path's (one token and no
    draft per request), for a batch without a grammar (whose FSM SGLang advances there)."""
    return getattr(result, "specctl_plain", False) is True and not batch.has_grammar \
        and result.block_accept_lens is None and result.cap_lens is None


def resolve_tokens(processor: Any, result: Any, batch: Any) -> tuple[list[list[int]], int]:
    """SGLang 0.5.17's `_resolve_spec_v2_tokens` for a `plain_result`, in one pass: the same
    return value and the same effects on the result, the requests and the adaptive feedback
    as its general body, which reads accept lengths that are all 1 here. Returned with it:
    the rows SGLang emits (requests neither finished nor retracted, one token each), which
    the per-depth count would otherwise find in a pass of its own."""
    assert result.next_token_ids.is_cpu
    runs = [[token] for token in result.next_token_ids.tolist()]
    reqs = batch.reqs
    # Everything read before anything changes: a failure up to here leaves SGLang's body to
    # settle the result. Finished and retracted requests are settled at release.
    # (`finished_reason is None` is 0.5.17's `Req.finished()`, without a call per request.)
    live = [(req, req.kv_committed_len, req.spec_verify_ct, req.spec_correct_drafts_histogram)
            for req in reqs if not req.is_retracted and req.finished_reason is None]
    zeros = [0] * len(reqs)
    processor.model_worker.on_verify_complete_cpu(zeros, batch_size=len(reqs))
    result.num_correct_drafts = 0
    result.num_correct_drafts_per_req_cpu = zeros
    result.num_block_accept_tokens = 0
    result.num_cap_tokens = 0
    for req, committed, verifies, histogram in live:
        req.kv_committed_len = committed + 1
        req.spec_verify_ct = verifies + 1
        if histogram:
            histogram[0] += 1
        else:
            histogram.append(1)
    return runs, len(live)
