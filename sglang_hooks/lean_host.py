"""Trimmed host work on the speculative server's decode iteration (the host-work trims).

A depth-0 iteration's GPU work equals a plain decode's (kernel time within 0.7% on the H200);
what it loses against a server without speculation is host time around it (docs/sglang.md,
"Off"). On the SGLang versions whose adapter declares the trims (`OffPathFeature.HOST_TRIMS`:
0.5.17, whose bodies they reproduce; the H200's twenty-fifth run checked them under 1,000
depth switches), once a scheduler steers, three pieces of that work are done once instead of
every iteration, with the same values handed to SGLang:

- the trivial verify input of a depth-0 iteration (`_build_trivial_verify_input`): its three
  index tensors depend on the batch size only, so they are built once per batch size and
  reused; the draft tokens, positions and the mask fill are still SGLang's per iteration,
  except for a batch that depth 0's plain decode path (plain_decode.py) will run, which reads
  the draft tokens alone: its mask fill and positions (two kernel launches) are left until the
  batch turns out to need the verify after all (`finish_for_verify`);
- the zeroed draft inputs of a skipped draft extend (`_stub_skipped_draft_extend`): one set
  per batch size, reused (the overlap scheduler copies them into its own buffers and nothing
  reads them at depth 0);
- SGLang 0.5.17's per-request KV bookkeeping in `alloc_for_spec_decode`, which reads each
  request's next KV length out of a CPU tensor one element at a time (a tensor select and an
  item per running request): handed the same values as a list (0.5.23 does this itself).

Five more, in SGLang 0.5.17's spec-v2 scheduler at every depth, three of them with a page
size of 1 (read in that release's source; other releases and page sizes keep SGLang's own):

- the decode preparation (`eagle_prepare_for_decode`): the same per-request loop and the same
  KV reservation, with the current and next KV lengths in one CPU tensor and one copy to the
  GPU where SGLang makes two of each;
- the next decode's KV estimate (`_new_tokens_required_next_decode_spec_v2`, asked before
  every decode): the same sum without two page roundings per request, which at a page size
  of 1 change nothing;
- the end of a result's free group (`free_group_end` of the page-size-1 allocator): the KV
  slots freed while settling a decode result (a finished request's reserve beyond its
  committed length, which a server without speculation does not hold) joined to the
  allocator's free list in one concatenation where SGLang makes two;
- the hand-over of the next lengths (`FutureMap.resolve_seq_lens_cpu`, before every decode
  launch of the overlap scheduler; any page size): the same event waits (and, where the
  backends want host lengths, which FlashAttention 3 does not, the same copy and
  synchronization), with the batch's rows gathered out of the published lengths on the GPU
  (and out of their host mirror) through `index_select` where SGLang indexes, which costs the
  scheduler more host time per call;
- the forward's isolation (`Scheduler._forward_isolation`, around every launch of a
  speculative server, any page size): a server without speculation keeps only the sampling
  info aside; spec-v2 snapshots every field of the batch (about a hundred) and sets each
  back after the forward, in Python loops. The same snapshot and restore, in one call each
  (`operator.attrgetter`, the instance dictionary's `update`), where the batch's class keeps
  its fields as plain instance attributes.

With SPECCTL_OFF_PATH=sglang (settings.py) none of them is registered.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import operator
from collections.abc import Callable, Iterable
from typing import Any

# What /server_info counts of the five (`host_trim_runs`): calls each trim took over.
PREPARE_TRIMS = ("prepare", "estimate", "free_group_end", "hand_over", "isolation")
# Releases whose alloc_for_spec_decode reads `nxt_kv_lens_cpu` only in its per-request loop
# when the page size is 1 (read in their source); other releases are left alone.
KV_LIST_RELEASES = frozenset({"0.5.17"})
# Releases whose bodies the PREPARE_HOOKS trims reproduce (read in their source).
PREPARE_RELEASES = frozenset({"0.5.17"})
_MAX_CACHED_SIZES = 512  # batch sizes kept per cache; SGLang's largest graph batch is 512


class PerBatchSize:
    """Values that depend on the batch size alone, built once each (bounded)."""

    def __init__(self) -> None:
        self._by_size: dict[tuple[Any, ...], Any] = {}

    def get(self, key: tuple[Any, ...], build: Callable[[], Any]) -> tuple[Any, bool]:
        """(value, whether `build` made it on this call)."""
        value = self._by_size.get(key)
        if value is not None:
            return value, False
        if len(self._by_size) >= _MAX_CACHED_SIZES:
            self._by_size.clear()
        value = self._by_size[key] = build()
        return value, True

    def clear(self) -> None:
        self._by_size.clear()


VERIFY_INDEXES = PerBatchSize()
STUBS = PerBatchSize()


def trivial_verify_input(original: Callable[..., Any], worker: Any, batch: Any,
                         for_plain: bool = False) -> Any:
    """SGLang's trivial verify input for `batch`, its index tensors reused per batch size;
    `for_plain`: without the mask fill and the positions, which `finish_for_verify` adds.

    Falls back to SGLang's own body wherever the mask is not the backend's shared buffer
    (the input then carries per-batch values the cache would not know)."""
    if batch.forward_mode.is_idle():
        return original(worker, batch)
    verify_mask = getattr(worker._target_worker.model_runner.attn_backend, "verify_mask", None)
    bs = int(batch.seq_lens.shape[0])
    if verify_mask is None or not verify_mask.fits(bs):
        return original(worker, batch)
    first: Any = None

    def build() -> tuple[Any, Any, Any]:
        nonlocal first
        first = original(worker, batch)  # SGLang's own tensors, taken before anyone else
        return first.retrieve_index, first.retrieve_next_token, first.retrieve_next_sibling

    (index, next_token, next_sibling), built = VERIFY_INDEXES.get((bs, str(worker.device)), build)
    if built:
        return first
    import torch

    if not for_plain:
        verify_mask.buffer.fill_(True)  # the draft writes this buffer at positive depths
    verify_input = type_of_verify_input()(
        draft_token=batch.spec_info.bonus_tokens,
        custom_mask=verify_mask.buffer,
        positions=None if for_plain else batch.seq_lens.to(torch.int64),
        retrieve_index=index,
        retrieve_next_token=next_token,
        retrieve_next_sibling=next_sibling,
        retrieve_cum_len=None,
        spec_steps=0,
        topk=worker.topk,
        draft_token_num=1,
        capture_hidden_mode=capture_full(),
        seq_lens_sum=None,
        seq_lens_cpu=None,
    )
    if for_plain:
        verify_input.__dict__[_UNFINISHED] = True
    return verify_input


_UNFINISHED = "_specctl_unfinished"  # on a verify input built for the plain decode path


def unfinished(verify_input: Any) -> bool:
    return bool(getattr(verify_input, "__dict__", {}).get(_UNFINISHED))


def finish_for_verify(verify_input: Any, batch: Any) -> bool:
    """Give a verify input built for the plain decode path what SGLang's verify reads beside
    the draft tokens (the mask filled, the positions), before the verify runs it after all.
    True if it had to."""
    if not unfinished(verify_input):
        return False
    import torch

    verify_input.custom_mask.fill_(True)
    verify_input.positions = batch.seq_lens.to(torch.int64)
    del verify_input.__dict__[_UNFINISHED]
    return True


@functools.cache
def type_of_verify_input() -> Any:
    from sglang.srt.speculative.eagle_info import EagleVerifyInput

    return EagleVerifyInput


@functools.cache
def capture_full() -> Any:
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

    return CaptureHiddenMode.FULL


def stub_skipped_extend(worker: Any, batch: Any, batch_output: Any) -> None:
    """SGLang's stub for a skipped draft extend, its zeroed tensors reused per batch size."""
    bs = int(batch.seq_lens.shape[0])
    draft_input = batch_output.next_draft_input

    def build() -> tuple[Any, Any, Any]:
        worker._stub_skipped_draft_extend(batch, batch_output)  # SGLang's own zeros, kept
        return (draft_input.topk_p, draft_input.topk_index,
                getattr(draft_input, "hidden_states", None))

    (topk_p, topk_index, hidden), built = STUBS.get((bs, str(worker.device)), build)
    if built:
        return
    draft_input.topk_p = topk_p
    draft_input.topk_index = topk_index
    if hidden is not None:
        draft_input.hidden_states = hidden


def kv_lens_as_list(release: str | None, tree_cache: Any, kwargs: dict[str, Any]) -> bool:
    """Hand `alloc_for_spec_decode` its next KV lengths as a list where that release reads
    them only in its per-request loop. True if it did."""
    lens = kwargs.get("nxt_kv_lens_cpu")
    if release not in KV_LIST_RELEASES or lens is None or not hasattr(lens, "tolist"):
        return False
    if getattr(tree_cache.token_to_kv_pool_allocator, "page_size", None) != 1:
        return False
    kwargs["nxt_kv_lens_cpu"] = lens.tolist()
    return True


def tokens_required(requests: Iterable[Any], reserve: int) -> int:
    """SGLang 0.5.17's next-decode KV estimate at a page size of 1: what each request lacks
    of its committed length plus the per-decode reserve, summed."""
    total = 0
    for req in requests:
        lacking = req.kv_committed_len + reserve - req.kv.kv_allocated_len
        if lacking > 0:
            total += lacking
    return total


def prepares(release: str | None, batch: Any) -> bool:
    """Whether `prepare_for_decode` reproduces this release's preparation of `batch`."""
    return release in PREPARE_RELEASES \
        and getattr(batch.token_to_kv_pool_allocator, "page_size", None) == 1


def prepare_for_decode(batch: Any, reserve: int, alloc: Callable[..., Any]) -> None:
    """SGLang 0.5.17's `eagle_prepare_for_decode` at a page size of 1, with `reserve` (its
    `get_alloc_reserve_per_decode()`) and `alloc` (its `alloc_for_spec_decode`): each request
    reserved up to its committed length plus `reserve`, never below what it holds."""
    import torch

    batch.maybe_evict_swa()
    if batch.sampling_info.penalizer_orchestrator.is_required:
        batch.cumulate_penalty_output_tokens()
    reqs = batch.reqs
    held: list[int] = []
    wanted: list[int] = []
    needed = 0
    for req in reqs:
        cur = req.kv.kv_allocated_len
        nxt = req.kv_committed_len + reserve
        if nxt < cur:
            nxt = cur
        held.append(cur)
        wanted.append(nxt)
        needed += nxt - cur
        req.decode_batch_idx += 1
    bs = len(reqs)
    # One pageable tensor and one copy where SGLang makes two of each. Not pinned: on the
    # H200 (twenty-fifth run's copy probe) no pageable copy of this size waited for its
    # stream, and a pinned tensor cost the scheduler more host time to make and to copy.
    lens_cpu = torch.tensor(held + wanted, dtype=torch.int32)
    lens = lens_cpu.to(device=batch.device, non_blocking=True)
    alloc(batch.tree_cache, batch.req_to_token_pool, reqs=reqs,
          req_pool_indices=batch.req_pool_indices, cur_kv_lens=lens[:bs],
          cur_kv_lens_cpu=lens_cpu[:bs], nxt_kv_lens=lens[bs:], nxt_kv_lens_cpu=wanted,
          num_needed_tokens=needed, batch=batch)


def free_group_is_ours(release: str | None, allocator: Any) -> bool:
    """Whether `end_free_group` reproduces this allocator's `free_group_end`: the page-size-1
    `TokenToKVPoolAllocator` itself of a release read, which keeps the base class's."""
    cls = type(allocator)
    return release in PREPARE_RELEASES and cls.__name__ == "TokenToKVPoolAllocator" \
        and cls.__module__ == "sglang.srt.mem_cache.allocator.token" \
        and "free_group_end" not in cls.__dict__ and "free" in cls.__dict__


def end_free_group(allocator: Any) -> None:
    """SGLang 0.5.17's `free_group_end` and `free` of the page-size-1 allocator in one
    concatenation: the group's slots appended to the released (or free) list in order. Its
    entries are never empty (`free` leaves empty ones out of the group)."""
    import torch

    allocator.is_not_in_free_group = True
    group = allocator.free_group
    if not group:
        return
    if allocator.need_sort:
        allocator.release_pages = torch.cat((allocator.release_pages, *group))
    else:
        allocator.free_pages = torch.cat((allocator.free_pages, *group))


def resolves_seq_lens(release: str | None, future_map: Any, overlap_module: Any) -> bool:
    """Whether `resolve_seq_lens` reproduces this FutureMap's `resolve_seq_lens_cpu`: a
    release read, on CUDA (not ROCm, which synchronizes on the event instead), its debug
    checks off, after the first publish and, where the backends want host lengths (not
    FlashAttention 3's case), with the side stream that copies them."""
    return release in PREPARE_RELEASES \
        and not getattr(overlap_module, "_is_hip", True) \
        and not getattr(overlap_module, "_DEBUG_ASSERT", True) \
        and future_map.publish_ready is not None \
        and (not future_map.needs_cpu_seq_lens or future_map.fwd_prepare_d2h_stream is not None)


def resolve_seq_lens(future_map: Any, batch: Any) -> None:
    """SGLang 0.5.17's `FutureMap.resolve_seq_lens_cpu` where `resolves_seq_lens` holds: the
    schedule stream waits for the last publish, and the batch's lengths are gathered out of
    the published ones. Where the backends want host lengths, a side stream copies them all
    to the pinned host mirror, which the host waits for, and the batch's host lengths are
    gathered out of the mirror and summed; elsewhere the batch has none."""
    import torch

    draft_input = batch.spec_info
    if draft_input is None:
        return
    rows = draft_input.future_indices
    if rows is None:
        return
    published = future_map.publish_ready
    published.wait()
    batch.seq_lens = future_map.new_seq_lens_buf.index_select(0, rows)
    if not future_map.needs_cpu_seq_lens:
        batch.seq_lens_cpu = None
        batch.seq_lens_sum = None
        return
    side = future_map.fwd_prepare_d2h_stream
    side.wait_event(published)
    with torch.get_device_module(future_map.device).stream(side):
        future_map.new_seq_lens_cpu_pinned.copy_(future_map.new_seq_lens_buf, non_blocking=True)
    side.synchronize()
    mirror, mirror_rows = future_map.new_seq_lens_cpu_pinned, batch.req_pool_indices_cpu
    # 0.5.17 keeps the host rows as an int64 tensor; anything else is indexed as SGLang does
    batch.seq_lens_cpu = mirror.index_select(0, mirror_rows) \
        if isinstance(mirror_rows, torch.Tensor) else mirror[mirror_rows]
    batch.seq_lens_sum = int(batch.seq_lens_cpu.sum())


BatchFields = tuple[tuple[str, ...], Callable[[Any], tuple[Any, ...]]]


@functools.cache
def batch_fields(cls: type) -> BatchFields | None:
    """A batch class's dataclass field names and one getter of them all, where setting the
    instance dictionary is what `setattr` does for each: no `__setattr__` of its own, no
    slots, no field behind a data descriptor. Else None."""
    if not dataclasses.is_dataclass(cls) or cls.__setattr__ is not object.__setattr__:
        return None
    if any("__slots__" in vars(klass) for klass in cls.__mro__):
        return None
    names = tuple(f.name for f in dataclasses.fields(cls))
    if len(names) < 2:  # attrgetter of one name returns the value, not a tuple
        return None
    for name in names:
        if hasattr(type(inspect.getattr_static(cls, name, None)), "__set__"):
            return None
    return names, operator.attrgetter(*names)


def isolation_fields(release: str | None, batch: Any) -> BatchFields | None:
    """What `Isolation` needs to reproduce this release's `_forward_isolation` of `batch` (a
    speculative one, whose every field SGLang snapshots), or None."""
    if release not in PREPARE_RELEASES or batch.spec_algorithm.is_none():
        return None
    return batch_fields(batch.__class__)


class Isolation:
    """SGLang 0.5.17's `Scheduler._forward_isolation` of a speculative batch: its fields
    snapshotted where the forward starts, the sampling info swapped for a forward-only copy,
    the batch pinned for two iterations under the overlap scheduler, and every field set
    back where the forward ends (raised or not). The snapshot is one `attrgetter` call and
    the restore one dictionary update, where SGLang loops over `dataclasses.fields`."""

    __slots__ = ("_batch", "_getter", "_names", "_overlap", "_scheduler", "_values")

    def __init__(self, scheduler: Any, batch: Any, overlap: bool, fields: BatchFields) -> None:
        self._scheduler, self._batch, self._overlap = scheduler, batch, overlap
        self._names, self._getter = fields
        self._values: tuple[Any, ...] = ()

    def __enter__(self) -> None:
        batch = self._batch
        self._values = self._getter(batch)
        sampling_info = batch.sampling_info
        if sampling_info is not None:
            batch.sampling_info = sampling_info.copy_for_forward()
        if self._overlap:
            self._scheduler.record_batch_in_overlap(batch)

    def __exit__(self, *exc: object) -> None:
        self._batch.__dict__.update(zip(self._names, self._values, strict=True))
