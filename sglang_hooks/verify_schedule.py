"""Depth 0's verify attention scheduled once per iteration, as a plain decode's is.

A plain SGLang decode on FlashAttention 3 computes FA3's scheduler metadata (how each request's
KV is split across thread blocks) once per iteration into a buffer its CUDA graph reads, and
every attention layer reuses it. A speculative server runs depth 0 as a TARGET_VERIFY forward
of one token per request, whose attention goes through `forward_extend` without that metadata,
so every layer prepares its own: on an H200 with an 8B target, 32 `prepare_varlen_num_blocks`
launches took 98-103 us of GPU time per iteration against 5 us for the plain decode's one, the
largest item of the 126-170 us a depth-0 iteration spent on the GPU beyond a plain decode
(benchmarks/results/gpu/h200-sglang-0.5.17-seeded-8b-run3/profile/).

With `SPECCTL_VERIFY_SCHEDULE=1` in the server's environment (read once, before the CUDA
graphs are captured), two hooks give the depth-0 verify graphs the decode's treatment:

- AROUND `FlashAttentionBackend._apply_cuda_graph_metadata` (the shared body of a graph's
  capture and of every replay), after SGLang's own body: for a TARGET_VERIFY graph of a
  backend that verifies one token per request, SGLang's own `_compute_scheduler_metadata`
  (the call its decode path makes, with the same inputs) fills a buffer of that backend, and
  the graph's metadata points at it.
- AROUND `FlashAttentionBackend.forward_extend`: a TARGET_VERIFY forward whose metadata points
  at that buffer runs SGLang's `forward_decode` instead, the same attention over the same
  metadata (one query token per request, causal, the page table and cache lengths verify
  built), which hands the buffer to FA3. Only capture runs this Python: a replayed graph
  re-runs the captured kernels, reading the buffer each replay refreshed.

Every other forward, backend and graph is left as SGLang built it: positive depths (several
tokens per request), top-k above 1, MLA, FA4, prefill-aware sliding windows, and servers whose
attention modes can change cache lengths across ranks (SGLang skips its own precompute there
too). A backend is judged once, when it first captures a graph; the decision never changes
afterwards, since the captured graph depends on it.
"""

from __future__ import annotations

import inspect
import logging
import os
from collections.abc import Callable
from typing import Any

logger = logging.getLogger("specctl")

ENV = "SPECCTL_VERIFY_SCHEDULE"
_PLAN_ATTR = "_specctl_verify_schedule"  # per backend: the buffer, or False (not eligible)


def enabled_from_env() -> bool:
    return os.environ.get(ENV, "").strip() in ("1", "true", "yes", "on")


ENABLED = enabled_from_env()
_failed: set[str] = set()
# The hooks (names in sglang_hooks.hooks) registered only when ENABLED.
HOOKS = ("verify_schedule_refresh", "verify_as_decode")


def _log_once(name: str, message: str) -> None:
    if name not in _failed:
        _failed.add(name)
        logger.warning("specctl: %s", message)


def ineligible_reason(backend: Any) -> str | None:
    """Why this backend's verify graphs keep SGLang's per-layer scheduling, or None."""
    if getattr(backend, "fa_impl_ver", None) != 3:
        return "not FlashAttention 3"
    if getattr(backend, "use_mla", True):
        return "MLA attention"
    if getattr(backend, "topk", 2) > 1:
        return "top-k above 1 (tree verify)"
    if getattr(backend, "speculative_num_draft_tokens", None) != 1:
        return "verifies more than one token per request"
    if getattr(backend, "_sched_meta_buf", None) is None:
        return "no scheduler-metadata buffer (SGLang found no FA3 scheduler)"
    if getattr(backend, "_disable_scheduler_metadata_precompute", True):
        return "SGLang disables the precompute for this server (DP attention or prefill CP)"
    if getattr(backend, "is_prefill_aware_swa", False):
        return "prefill-aware sliding-window attention"
    if not callable(getattr(backend, "_compute_scheduler_metadata", None)):
        return "no _compute_scheduler_metadata"
    return None


def plan_for(backend: Any) -> Any | None:
    """The backend's buffer for depth-0 verify metadata, or None: decided once per backend."""
    plan = backend.__dict__.get(_PLAN_ATTR)
    if plan is None:
        reason = ineligible_reason(backend) if ENABLED else "off"
        if reason is None:
            plan = backend._sched_meta_buf.clone().zero_()  # the decode buffer's size
            STATS.backends += 1
            logger.info("specctl: depth-0 verify graphs get the decode's FA3 scheduling")
        else:
            plan = False
        backend.__dict__[_PLAN_ATTR] = plan
    return plan if plan is not False else None


class _Stats:
    """What /server_info reports: backends whose depth-0 verify graphs use the buffer."""

    backends = 0


STATS = _Stats()

_POSITIONS: dict[Callable[..., Any], dict[str, int]] = {}


def _argument(original: Callable[..., Any], name: str, args: tuple[Any, ...],
              kwargs: dict[str, Any]) -> Any:
    """A parameter of `original` by name, wherever the caller put it (0.5.17 and 0.5.23 order
    them differently; positions are read once per function)."""
    if name in kwargs:
        return kwargs[name]
    positions = _POSITIONS.get(original)
    if positions is None:
        names = list(inspect.signature(original).parameters)[1:]  # after self
        positions = _POSITIONS[original] = {n: i for i, n in enumerate(names)}
    i = positions.get(name)
    return args[i] if i is not None and i < len(args) else None


def refresh(backend: Any, original: Callable[..., Any], args: tuple[Any, ...],
            kwargs: dict[str, Any]) -> None:
    """After SGLang built a graph's metadata: a depth-0 verify graph's scheduler metadata.

    A failure before any graph reads the buffer turns the feature off for this backend (its
    graphs keep SGLang's scheduling). Once a captured graph reads it, a refresh that fails
    would leave the previous iteration's schedule in place and silently wrong attention, so
    the error is raised instead."""
    forward_mode = _argument(original, "forward_mode", args, kwargs)
    if forward_mode is None or not forward_mode.is_target_verify():
        return
    buffer = plan_for(backend)
    if buffer is None:
        return
    bs = int(_argument(original, "bs", args, kwargs))
    metadata = backend.target_verify_metadata.get(bs)
    # Each depth has its own backend; checked per graph anyway, as the buffer is only right
    # for one query token per request.
    if metadata is None or getattr(metadata, "max_seq_len_q", None) != 1 \
            or backend.speculative_num_draft_tokens != 1:
        return
    try:
        _fill(backend, buffer, metadata, bs, _argument(original, "seq_lens_cpu", args, kwargs))
    except Exception as err:
        if getattr(metadata, "scheduler_metadata", None) is not None:
            raise RuntimeError(
                f"specctl: refreshing the depth-0 verify graph's FA3 scheduler metadata failed "
                f"({err}); unset {ENV} to run SGLang's own verify scheduling"
            ) from err
        backend.__dict__[_PLAN_ATTR] = False
        _log_once("verify_schedule", f"depth-0 verify keeps SGLang's scheduling: {err}")


def _fill(backend: Any, buffer: Any, metadata: Any, bs: int, seq_lens_cpu: Any) -> None:
    # As SGLang's decode: the host's lengths when it has them, else the static bound. A verify
    # of one token reads one position past each request's committed length.
    max_k = (int(seq_lens_cpu[:bs].max()) + 1 if seq_lens_cpu is not None
             else int(backend.max_context_len))  # fmt: skip
    sched = backend._compute_scheduler_metadata(
        bs, max(max_k, 1), metadata.cache_seqlens_int32, metadata.cu_seqlens_q
    )
    if sched is None:
        raise RuntimeError("SGLang computed no scheduler metadata")
    n = int(sched.shape[0])
    if n > buffer.shape[0]:  # SGLang sizes its decode buffer for the largest graph
        raise RuntimeError(f"scheduler metadata of {n} entries, buffer of {buffer.shape[0]}")
    buffer[:n] = sched
    buffer[n:] = 0
    metadata.scheduler_metadata = buffer[:n]


def forward_batch_of(original: Callable[..., Any], args: tuple[Any, ...],
                     kwargs: dict[str, Any]) -> Any:
    return _argument(original, "forward_batch", args, kwargs)


def uses_decode_attention(backend: Any, forward_batch: Any) -> bool:
    """Whether this forward is a depth-0 verify whose metadata carries the buffer."""
    buffer = backend.__dict__.get(_PLAN_ATTR)
    if buffer is None or buffer is False or not forward_batch.forward_mode.is_target_verify():
        return False
    metadata = backend.forward_metadata
    sched = getattr(metadata, "scheduler_metadata", None)
    return (sched is not None and sched.data_ptr() == buffer.data_ptr()
            and getattr(metadata, "max_seq_len_q", None) == 1)
