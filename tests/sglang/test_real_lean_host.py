"""The host-work trims (0.5.17's off path), through SGLang's real methods.

Real: `EAGLEWorkerV2._build_trivial_verify_input` and `_stub_skipped_draft_extend` (SGLang
0.5.23's bodies: the first behind the plugin's hook, called as 0.5.17's adapter registers it,
the second through the skipped extend the plugin's loader patched in), `EagleVerifyInput`,
and SGLang 0.5.17's `alloc_for_spec_decode`, compiled from the unpacked 0.5.17 source. Stand-ins,
because the workers need a GPU model runner: the worker `self` (device, top-k, the target's
attention backend with its verify mask buffer, the draft runner config the stub reads), the
batch (sequence lengths, the previous bonus tokens, the forward mode) and, for 0.5.17's
allocator, the token-slot and req-to-token helpers it calls (recorded, not run).
"""

from __future__ import annotations

import contextlib
import types
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any

import pytest

from benchmarks import sglang17_source
from sglang_hooks import hooks, lean_host, settings
from sglang_hooks.adapters import v0_5_17
from sglang_hooks.contract import PolicyTable, Tier
from sglang_hooks.runtime import SchedulerRuntime

HIDDEN = 32
MASK_SLOTS = 64


class _Mask:
    def __init__(self) -> None:
        import torch

        self.buffer = torch.zeros(MASK_SLOTS, dtype=torch.bool)

    def fits(self, bs: int) -> bool:
        return bs <= MASK_SLOTS // 2


def _worker(mask: _Mask | None) -> Any:
    import torch
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    draft_runner = NS(model_config=NS(spec_hidden_size=HIDDEN, dtype=torch.bfloat16),
                      spec_algorithm=NS(is_standalone=lambda: False))
    worker = NS(device="cpu", topk=1, speculative_num_steps=0,
                _target_worker=NS(model_runner=NS(attn_backend=NS(verify_mask=mask,
                                                                  max_context_len=128))),
                draft_worker=NS(draft_runner=draft_runner))
    worker._stub_skipped_draft_extend = types.MethodType(
        EAGLEWorkerV2._stub_skipped_draft_extend, worker)
    return worker


def _batch(seq_lens: list[int]) -> Any:
    import torch

    n = len(seq_lens)
    return NS(forward_mode=NS(is_idle=lambda: False),
              seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
              seq_lens_sum=sum(seq_lens), seq_lens_cpu=None,
              spec_info=NS(bonus_tokens=torch.arange(100, 100 + n, dtype=torch.int32)))


def _verify_input(worker: Any, batch: Any) -> Any:
    """The trivial verify input through the plugin's hook around SGLang's body, as the 0.5.17
    adapter registers it (the installed 0.5.23's adapter does not)."""
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    return hooks.lean_trivial_verify(EAGLEWorkerV2._build_trivial_verify_input, worker, batch)


def _same(a: Any, b: Any) -> None:
    import torch

    for name in ("draft_token", "positions", "retrieve_index", "retrieve_next_token",
                 "retrieve_next_sibling", "custom_mask"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and torch.equal(x, y), name
    for name in ("retrieve_cum_len", "spec_steps", "topk", "draft_token_num",
                 "capture_hidden_mode", "seq_lens_sum", "seq_lens_cpu", "num_tokens_per_req"):
        assert getattr(a, name) == getattr(b, name), name


@pytest.fixture
def trims(runtime: SchedulerRuntime) -> SchedulerRuntime:
    """A runtime on 0.5.17's off path: the trims, beside the plain decode."""
    lean_host.VERIFY_INDEXES.clear()
    lean_host.STUBS.clear()
    runtime.use_off_path(settings.SPECCTL, v0_5_17.ADAPTER.off_path)
    assert runtime.host_trims
    return runtime


def test_the_installed_releases_trivial_verify_input_is_sglangs_own(
    runtime: SchedulerRuntime,
) -> None:
    """0.5.23's off path has no trims: its verify input is SGLang's own body, unhooked."""
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    assert not runtime.host_trims
    assert not hasattr(EAGLEWorkerV2._build_trivial_verify_input, "__wrapped__")
    worker = _worker(_Mask())
    first, second = (EAGLEWorkerV2._build_trivial_verify_input(worker, _batch([3, 4]))
                     for _ in range(2))
    assert first.retrieve_index is not second.retrieve_index


def test_the_trivial_verify_input_equals_sglangs_and_reuses_its_indexes(
    runtime: SchedulerRuntime,
) -> None:
    mask = _Mask()
    worker = _worker(mask)
    runtime.host_trims = False
    wanted = [_verify_input(worker, _batch(lens)) for lens in ([5, 9, 7], [6, 10, 8], [4, 4])]
    assert wanted[0].retrieve_index is not wanted[1].retrieve_index  # SGLang builds anew
    lean_host.VERIFY_INDEXES.clear()
    runtime.host_trims = True
    got = []
    for lens in ([5, 9, 7], [6, 10, 8], [4, 4]):
        mask.buffer.zero_()  # a positive depth's draft wrote its own tree mask here
        got.append(_verify_input(worker, _batch(lens)))
        assert bool(mask.buffer.all()), "the mask is filled every iteration"
    for a, b in zip(got, wanted, strict=True):
        _same(a, b)
    assert got[1].retrieve_index is got[0].retrieve_index  # same batch size: reused
    assert got[1].retrieve_next_sibling is got[0].retrieve_next_sibling
    assert got[2].retrieve_index is not got[0].retrieve_index
    assert got[1] is not got[0] and got[1].positions.tolist() == [6, 10, 8]


def test_without_the_shared_mask_buffer_sglangs_own_body_runs(trims: SchedulerRuntime) -> None:
    worker = _worker(None)
    first, second = (_verify_input(worker, _batch([3, 3])) for _ in range(2))
    assert first.retrieve_index is not second.retrieve_index
    assert first.custom_mask.shape == (8,)  # SGLang's per-batch mask: sum(seq_lens) + bs
    big = _worker(_Mask())
    lens = [2] * (MASK_SLOTS // 2 + 1)  # the buffer does not fit this batch
    assert _verify_input(big, _batch(lens)).custom_mask is not big._target_worker \
        .model_runner.attn_backend.verify_mask.buffer


def _plain_ready(worker: Any, batch: Any) -> None:
    """The worker as depth 0's plain decode path leaves it once its graphs are captured, and
    the batch fields that path reads (plain_decode.py)."""
    from sglang_hooks import plain_decode

    worker.__dict__[plain_decode._ATTR] = plain_decode.PlainDecode(runner=object(),
                                                                   backend=object())
    batch.has_grammar = batch.return_logprob = False


def test_a_batch_for_the_plain_path_gets_its_mask_and_positions_only_if_the_verify_runs_it(
    trims: SchedulerRuntime, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With the path on, the input carries SGLang's draft tokens and indexes but no mask fill
    and no positions (the DECODE graph reads neither); `finish_for_verify` gives it both, after
    which it equals SGLang's own input. Without the path, or at a positive depth, nothing
    changes."""
    from sglang_hooks import plain_decode

    assert trims.plain_decode_path
    monkeypatch.setattr(plain_decode, "STATS", plain_decode._Stats())
    mask = _Mask()
    worker = _worker(mask)
    _plain_ready(worker, warm := _batch([5, 9, 7]))
    _verify_input(worker, warm)  # the first of a size is SGLang's own, whole
    trims.host_trims = False
    wanted = _verify_input(worker, _batch([6, 10, 8]))
    trims.host_trims = True
    mask.buffer.zero_()  # a positive depth's draft wrote its tree mask here
    batch = _batch([6, 10, 8])
    _plain_ready(worker, batch)
    light = _verify_input(worker, batch)
    assert light.positions is None and not bool(mask.buffer.any())
    assert light.draft_token is batch.spec_info.bonus_tokens and lean_host.unfinished(light)
    assert plain_decode.STATS.light_inputs == 1
    assert lean_host.finish_for_verify(light, batch)
    assert not lean_host.unfinished(light) and not lean_host.finish_for_verify(light, batch)
    _same(light, wanted)
    worker.speculative_num_steps = 3  # not depth 0: the verify reads what SGLang builds
    mask.buffer.zero_()
    whole = _verify_input(worker, batch)
    assert whole.positions is not None and bool(mask.buffer.all())
    batch.return_logprob = True  # a batch the path leaves to the verify
    worker.speculative_num_steps = 0
    assert not lean_host.unfinished(_verify_input(worker, batch))
    trims.plain_decode_path = False  # an off path without the plain decode
    batch.return_logprob = False
    assert not lean_host.unfinished(_verify_input(worker, batch))
    assert plain_decode.STATS.light_inputs == 1


@pytest.fixture
def off_table(trims: SchedulerRuntime, plugin_loaded: bool) -> SchedulerRuntime:
    trims.activate({0, 1, 3}, None)
    trims.commit(PolicyTable.build([Tier(1, 3), Tier(16, 0, hysteresis=1)], 2))
    return trims


def _skipped_extend(runtime: SchedulerRuntime, batch_size: int) -> Any:
    import torch
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker

    runtime.spec_worker = _worker(_Mask())
    assert runtime.choose(batch_size) == 0
    batch = NS(seq_lens=torch.zeros(batch_size, dtype=torch.int64))
    result = NS(next_draft_input=NS(topk_p=None, topk_index=None, hidden_states=None))
    EagleDraftWorker._draft_extend_for_decode(NS(), batch, result)
    return result.next_draft_input


def test_the_skipped_extends_stub_is_sglangs_zeros_reused_per_batch_size(
    off_table: SchedulerRuntime,
) -> None:
    first, second, other = (_skipped_extend(off_table, bs) for bs in (20, 20, 24))
    assert first.topk_p.shape == (20, 1) and float(first.topk_p.abs().sum()) == 0.0
    assert first.hidden_states.shape == (20, HIDDEN) and not bool(first.hidden_states.any())
    assert second.topk_p is first.topk_p and second.hidden_states is first.hidden_states
    assert second.topk_index is first.topk_index
    assert other.topk_p.shape == (24, 1) and other.topk_p is not first.topk_p
    assert off_table.skipped_extends == 3


# ----------------------------------------------------------------------------- 0.5.17's allocator


def _alloc_for_spec_decode_0517(root: Path, calls: list[str]) -> Any:
    """SGLang 0.5.17's alloc_for_spec_decode, compiled alone from its source, with the
    helpers it calls recorded instead of run (they need the real pools)."""
    namespace: dict[str, Any] = {
        "Optional": Any, "BasePrefixCache": Any, "ReqToTokenPool": Any, "Req": Any,
        "ScheduleBatch": Any, "torch": __import__("torch"),
        "alloc_token_slots": lambda cache, n: calls.append(f"alloc {n}") or "slots",
        "assign_req_to_token_pool_func": lambda *a: calls.append(f"assign {a[-1]}"),
        "get_last_loc": lambda *a: calls.append("last_loc"),
        "ALLOC_EXTEND_FUNCS": {},
    }
    return sglang17_source.compiled(root, "srt/mem_cache/allocation.py",
                                    "alloc_for_spec_decode", None, namespace)


def test_0517_allocator_takes_the_kv_lengths_as_a_list_with_the_same_result(
    sglang17_root: Path,
) -> None:
    import torch

    def run(as_list: bool) -> tuple[list[int], list[str]]:
        calls: list[str] = []
        alloc = _alloc_for_spec_decode_0517(sglang17_root, calls)
        reqs = [NS(kv=NS(kv_allocated_len=n)) for n in (10, 30, 12)]
        nxt = torch.tensor([14, 20, 16], dtype=torch.int32)
        tree_cache = NS(token_to_kv_pool_allocator=NS(page_size=1))
        kwargs: dict[str, Any] = dict(
            reqs=reqs, req_pool_indices=torch.arange(3), cur_kv_lens=torch.tensor([10, 30, 12]),
            cur_kv_lens_cpu=torch.tensor([10, 30, 12]), nxt_kv_lens=nxt.clone(),
            nxt_kv_lens_cpu=nxt, num_needed_tokens=8, batch=None)
        if as_list:
            assert lean_host.kv_lens_as_list("0.5.17", tree_cache, kwargs)
            assert kwargs["nxt_kv_lens_cpu"] == [14, 20, 16]
        alloc(tree_cache, NS(req_to_token=None), **kwargs)
        return [r.kv.kv_allocated_len for r in reqs], calls

    assert run(as_list=True) == run(as_list=False) == ([14, 30, 16], ["alloc 8", "assign 3"])


def test_the_kv_lengths_stay_a_tensor_where_a_release_or_page_size_needs_it() -> None:
    import torch

    lens = torch.tensor([4, 5])
    for release, page in (("0.5.23", 1), ("0.5.17", 16), (None, 1)):
        kwargs: dict[str, Any] = {"nxt_kv_lens_cpu": lens}
        cache = NS(token_to_kv_pool_allocator=NS(page_size=page))
        assert not lean_host.kv_lens_as_list(release, cache, kwargs)
        assert kwargs["nxt_kv_lens_cpu"] is lens


def _requests(seed: int, n: int, reserve: int) -> list[Any]:
    """Requests as the overlap scheduler leaves them: some with their reserve in hand, some
    short of it (just admitted, or back from a lower depth), some holding more than it (a
    higher depth's draft reserve)."""
    import random

    rng = random.Random(seed)
    reqs = []
    for _ in range(n):
        committed = rng.randint(1, 300)
        held = max(1, committed + rng.randint(-2, 2 * reserve))
        reqs.append(NS(kv_committed_len=committed, kv=NS(kv_allocated_len=held),
                       decode_batch_idx=rng.randint(0, 50)))
    return reqs


def test_0517_next_decode_estimate_is_sglangs_at_page_size_1(sglang17_root: Path) -> None:
    reserve = 8
    estimate = sglang17_source.compiled(
        sglang17_root, "srt/managers/schedule_batch.py",
        "_new_tokens_required_next_decode_spec_v2", "ScheduleBatch",
        {"get_alloc_reserve_per_decode": lambda: reserve,
         "ceil_align": lambda x, a: (x + a - 1) // a * a})
    for seed in range(20):
        reqs = _requests(seed, 1 + seed * 7, reserve)
        assert lean_host.tokens_required(reqs, reserve) == estimate(None, reqs, 1), seed
    short = [NS(kv_committed_len=10, kv=NS(kv_allocated_len=4))]  # 14 short of 10 + 8
    assert lean_host.tokens_required(short, reserve) == estimate(None, short, 1) == 14


def _prepare_batch(reqs: list[Any], penalized: bool, calls: list[str]) -> Any:
    import torch

    return NS(
        reqs=reqs, device="cpu", tree_cache="tree", req_to_token_pool="pool",
        req_pool_indices=torch.arange(len(reqs)),
        token_to_kv_pool_allocator=NS(page_size=1),
        maybe_evict_swa=lambda: calls.append("evict_swa"),
        sampling_info=NS(penalizer_orchestrator=NS(is_required=penalized)),
        cumulate_penalty_output_tokens=lambda: calls.append("penalty"),
        batch_size=lambda: len(reqs))


def test_0517_decode_preparation_reserves_as_sglangs_with_one_copy(sglang17_root: Path) -> None:
    """SGLang 0.5.17's `eagle_prepare_for_decode` compiled from its source against the lean
    one, both handing their lengths to a recording `alloc_for_spec_decode` (the real one
    assigns KV slots through a Triton kernel) on stand-in batches: the same calls, the same
    lengths and slots asked for, the same per-request counters."""
    reserve = 8

    def record(calls: list[str], seen: list[dict[str, Any]]) -> Any:
        def alloc(tree_cache: Any, req_to_token_pool: Any, **kwargs: Any) -> None:
            calls.append(f"alloc {tree_cache} {req_to_token_pool}")
            seen.append({k: v.tolist() if hasattr(v, "tolist") else v
                         for k, v in kwargs.items() if k not in ("reqs", "batch")})
            for req, nxt in zip(kwargs["reqs"], seen[-1]["nxt_kv_lens_cpu"], strict=True):
                req.kv.kv_allocated_len = max(req.kv.kv_allocated_len, int(nxt))
        return alloc

    for seed, penalized in ((1, False), (2, True), (3, False)):
        results = []
        for lean in (False, True):
            calls: list[str] = []
            seen: list[dict[str, Any]] = []
            reqs = _requests(seed, 40, reserve)
            batch = _prepare_batch(reqs, penalized, calls)
            if lean:
                lean_host.prepare_for_decode(batch, reserve, record(calls, seen))
            else:
                import torch

                sglang = sglang17_source.compiled(
                    sglang17_root, "srt/speculative/eagle_utils.py",
                    "eagle_prepare_for_decode", None,
                    {"torch": torch, "get_alloc_reserve_per_decode": lambda: reserve,
                     "get_spec": lambda: NS(speculative_eagle_topk=1),
                     "alloc_for_spec_decode": record(calls, seen)})
                sglang(batch)
            results.append((calls, seen,
                            [(r.kv.kv_allocated_len, r.decode_batch_idx) for r in reqs]))
        assert results[1] == results[0], seed
        assert results[0][1][0]["num_needed_tokens"] > 0  # some requests were short


def test_the_decode_preparation_is_sglangs_own_elsewhere() -> None:
    for release, page in (("0.5.23", 1), ("0.5.17", 16), (None, 1)):
        batch = NS(token_to_kv_pool_allocator=NS(page_size=page))
        assert not lean_host.prepares(release, batch)
    assert lean_host.prepares("0.5.17", NS(token_to_kv_pool_allocator=NS(page_size=1)))


def test_the_hooks_take_the_lean_preparation_only_where_it_is_sglangs(
    runtime: SchedulerRuntime, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The hooks against the real `eagle_utils` and `schedule_batch` modules of the installed
    SGLang, with the 0.5.17 helpers they look up there (0.5.23 has other ones) set to
    recording stand-ins: trims on and 0.5.17 take the lean bodies; trims off, another
    release, another page size or a failing lookup leave SGLang's own."""
    from sglang.srt.managers import schedule_batch
    from sglang.srt.speculative import eagle_utils

    from sglang_hooks import hooks

    allocs: list[int] = []
    monkeypatch.setattr(eagle_utils, "get_alloc_reserve_per_decode", lambda: 8, raising=False)
    monkeypatch.setattr(schedule_batch, "get_alloc_reserve_per_decode", lambda: 8,
                        raising=False)
    monkeypatch.setattr(eagle_utils, "alloc_for_spec_decode",
                        lambda *a, **k: allocs.append(k["num_needed_tokens"]))
    originals: list[str] = []

    def original_prepare(batch: Any) -> None:
        originals.append("prepare")

    def original_estimate(batch: Any, requests: Any, page_size: int) -> int:
        originals.append("estimate")
        return -1

    reqs = [NS(kv_committed_len=10, kv=NS(kv_allocated_len=12), decode_batch_idx=0)]
    monkeypatch.setattr(hooks, "RELEASE", "0.5.17")
    runtime.host_trims = True
    hooks.lean_prepare(original_prepare, _prepare_batch(reqs, False, []))
    assert hooks.lean_tokens_required(original_estimate, None, reqs, 1) == 6
    assert (allocs, originals) == ([6], [])
    assert reqs[0].decode_batch_idx == 1
    paged = _prepare_batch(reqs, False, [])
    paged.token_to_kv_pool_allocator.page_size = 16
    hooks.lean_prepare(original_prepare, paged)
    assert hooks.lean_tokens_required(original_estimate, None, reqs, 16) == -1
    monkeypatch.delattr(eagle_utils, "get_alloc_reserve_per_decode")
    hooks.lean_prepare(original_prepare, _prepare_batch(reqs, False, []))
    assert originals == ["prepare", "estimate", "prepare"]
    monkeypatch.setattr(hooks, "RELEASE", "0.5.23")
    hooks.lean_prepare(original_prepare, _prepare_batch(reqs, False, []))
    assert hooks.lean_tokens_required(original_estimate, None, reqs, 1) == -1
    monkeypatch.setattr(hooks, "RELEASE", "0.5.17")
    runtime.host_trims = False
    hooks.lean_prepare(original_prepare, _prepare_batch(reqs, False, []))
    assert hooks.lean_tokens_required(original_estimate, None, reqs, 1) == -1
    assert originals[3:] == ["prepare", "estimate", "prepare", "estimate"]
    assert allocs == [6] and reqs[0].decode_batch_idx == 1
    # /server_info counts the calls each trim took over, none that SGLang's body ran
    assert runtime.report()["host_trim_runs"] == {
        "prepare": 1, "estimate": 1, "free_group_end": 0, "hand_over": 0, "isolation": 0}


def _allocator_0517(root: Path, need_sort: bool) -> Any:
    return sglang17_source.allocator(root, 64, need_sort)


def test_0517_free_group_ends_as_sglangs_in_one_concatenation(sglang17_root: Path) -> None:
    """Groups of none, one and three freed spans (int32 views of a request-to-token row, as
    a finished request's reserve is freed), ended by SGLang's `free_group_end` and by the
    lean one: the same free and released lists, in value, order and dtype, and the same
    slots handed out after."""
    import torch

    row = torch.arange(100, 140, dtype=torch.int32)
    for need_sort in (True, False):
        for spans in ((), ((0, 3),), ((3, 5), (10, 18), (20, 21))):
            ends = []
            for lean in (False, True):
                allocator = _allocator_0517(sglang17_root, need_sort)
                assert lean_host.free_group_is_ours("0.5.17", allocator)
                taken = allocator.alloc(40)
                allocator.free(taken[:4])  # freed outside a group, before
                allocator.free_group_begin()
                for start, end in spans:
                    allocator.free(row[start:end])
                if lean:
                    lean_host.end_free_group(allocator)
                else:
                    allocator.free_group_end()
                ends.append((allocator.is_not_in_free_group, allocator.free_pages.tolist(),
                             allocator.free_pages.dtype, allocator.release_pages.tolist(),
                             allocator.release_pages.dtype, allocator.alloc(26).tolist()))
            assert ends[1] == ends[0], (need_sort, spans)
    assert not lean_host.free_group_is_ours("0.5.23", _allocator_0517(sglang17_root, True))


def test_other_allocators_keep_their_own_free_group_end(sglang17_root: Path) -> None:
    allocator = _allocator_0517(sglang17_root, True)

    class Paged(type(allocator)):  # type: ignore[misc]
        def free_group_end(self) -> None:
            super().free_group_end()

    paged = Paged.__new__(Paged)
    assert not lean_host.free_group_is_ours("0.5.17", paged)
    assert not lean_host.free_group_is_ours("0.5.17", NS(free=None))


def test_the_free_group_hook_ends_it_once_whichever_body_runs(
    runtime: SchedulerRuntime, monkeypatch: pytest.MonkeyPatch, sglang17_root: Path,
) -> None:
    from sglang_hooks import hooks

    for lean, release in ((True, "0.5.17"), (False, "0.5.17"), (True, "0.5.23")):
        monkeypatch.setattr(hooks, "RELEASE", release)
        runtime.host_trims = lean
        allocator = _allocator_0517(sglang17_root, True)
        taken = allocator.alloc(8)
        allocator.free_group_begin()
        allocator.free(taken[:3])
        calls: list[str] = []

        def original(a: Any, calls: list[str] = calls) -> None:
            calls.append("sglang")
            type(a).free_group_end(a)

        hooks.lean_free_group_end(original, allocator)
        assert allocator.release_pages.tolist() == taken[:3].tolist()
        assert allocator.is_not_in_free_group
        assert calls == ([] if lean and release == "0.5.17" else ["sglang"])
    assert runtime.prepare_trims["free_group_end"] == 1


class _Stream:
    """The CUDA event and side stream of the hand-over, as stand-ins that log their calls (no
    CUDA here); `torch.cpu.stream` takes one as its stream."""

    def __init__(self, name: str, log: list[tuple[str, ...]]) -> None:
        self.name, self.log = name, log

    def wait(self) -> None:
        self.log.append((self.name, "wait"))

    def wait_event(self, event: Any) -> None:
        self.log.append((self.name, "wait_event", event.name))

    def synchronize(self) -> None:
        self.log.append((self.name, "synchronize"))


def _handover(log: list[tuple[str, ...]], rows: list[int]) -> tuple[Any, Any]:
    """A FutureMap after a publish, and a decode batch whose pool rows are `rows`."""
    import torch

    published = torch.tensor([31, 7, 12, 55, 9, 40, 3, 18], dtype=torch.int64)
    future_map = NS(device="cpu", publish_ready=_Stream("published", log),
                    fwd_prepare_d2h_stream=_Stream("side", log), needs_cpu_seq_lens=True,
                    new_seq_lens_buf=published.clone(),
                    new_seq_lens_cpu_pinned=torch.full((8,), -1, dtype=torch.int64))
    batch = NS(spec_info=NS(future_indices=torch.tensor(rows)), seq_lens=None,
               seq_lens_cpu=None, seq_lens_sum=None, req_pool_indices_cpu=torch.tensor(rows))
    return future_map, batch


def _resolve_0517(root: Path) -> Any:
    import torch

    return sglang17_source.compiled(
        root, "srt/managers/overlap_utils.py", "resolve_seq_lens_cpu", "FutureMap",
        {"torch": torch, "_is_hip": False, "_DEBUG_ASSERT": False, "ScheduleBatch": Any})


@pytest.mark.parametrize(("rows", "host_rows_as"), [
    ([5, 0, 3], "tensor"), ([7], "tensor"), (list(range(8)), "tensor"), ([5, 0, 3], "list"),
    ([5, 0, 3], None),
])
def test_0517_lengths_hand_over_as_sglangs_with_index_select(
    sglang17_root: Path, rows: list[int], host_rows_as: str | None,
) -> None:
    """SGLang 0.5.17's `resolve_seq_lens_cpu` (compiled from its source) and the lean one,
    on the same published lengths: the same batch lengths on the device and the host, in
    value and dtype, the same sum, the same mirror, and the same waits in the same order.
    Host rows that are not a tensor (0.5.17 keeps a tensor) are indexed as SGLang does; with
    backends that want no host lengths (`None`: FlashAttention 3's case, the H200's) the
    batch gets none, and nothing is copied."""
    ends = []
    for lean in (False, True):
        log: list[tuple[str, ...]] = []
        future_map, batch = _handover(log, rows)
        future_map.needs_cpu_seq_lens = host_rows_as is not None
        if host_rows_as == "list":
            batch.req_pool_indices_cpu = list(rows)
        overlap = NS(_is_hip=False, _DEBUG_ASSERT=False)
        assert lean_host.resolves_seq_lens("0.5.17", future_map, overlap)
        if lean:
            lean_host.resolve_seq_lens(future_map, batch)
        else:
            _resolve_0517(sglang17_root)(future_map, batch)
        host = batch.seq_lens_cpu
        ends.append((batch.seq_lens.tolist(), batch.seq_lens.dtype,
                     None if host is None else (host.tolist(), host.dtype), batch.seq_lens_sum,
                     future_map.new_seq_lens_cpu_pinned.tolist(), log))
    assert ends[1] == ends[0]
    if host_rows_as is None:
        assert ends[0][2:4] == (None, None) and ends[0][-1] == [("published", "wait")]
        assert ends[0][4] == [-1] * 8  # the mirror untouched
    else:
        assert ends[0][-1] == [("published", "wait"), ("side", "wait_event", "published"),
                               ("side", "synchronize")]


@pytest.mark.parametrize("case", ["lean", "lean without host lengths", "0.5.23",
                                  "before the first publish", "no side stream", "ROCm",
                                  "debug checks", "trims off"])
def test_the_hand_over_hook_runs_sglangs_body_but_where_the_lean_one_reproduces_it(
    case: str, runtime: SchedulerRuntime, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The hook reads the ROCm and debug switches off the hooked method's module (a stand-in
    here: the installed SGLang is 0.5.23)."""
    import sys

    from sglang_hooks import hooks

    log: list[tuple[str, ...]] = []
    future_map, batch = _handover(log, [1, 2])
    monkeypatch.setitem(sys.modules, "sglang.srt.managers.overlap_utils",
                        NS(_is_hip=case == "ROCm", _DEBUG_ASSERT=case == "debug checks"))
    monkeypatch.setattr(hooks, "RELEASE", "0.5.23" if case == "0.5.23" else "0.5.17")
    runtime.host_trims = case != "trims off"
    if case == "before the first publish":
        future_map.publish_ready = None
    future_map.needs_cpu_seq_lens = case != "lean without host lengths"
    if case == "no side stream":  # with host lengths wanted: SGLang's bootstrap copy
        future_map.fwd_prepare_d2h_stream = None
    calls: list[Any] = []
    hooks.lean_seq_lens(lambda fm, b: calls.append((fm, b)), future_map, batch)
    lean = case.startswith("lean")
    if lean:
        assert calls == [] and batch.seq_lens.tolist() == [7, 12]
        assert len(log) == (3 if case == "lean" else 1)
    else:
        assert calls == [(future_map, batch)] and batch.seq_lens is None and log == []
    assert runtime.prepare_trims["hand_over"] == (1 if lean else 0)


def test_a_batch_without_a_draft_input_or_rows_hands_nothing_over() -> None:
    for batch in (NS(spec_info=None), NS(spec_info=NS(future_indices=None))):
        log: list[tuple[str, ...]] = []
        future_map, _ = _handover(log, [1])
        lean_host.resolve_seq_lens(future_map, batch)
        assert log == [] and not hasattr(batch, "seq_lens")


def _real_batch(tag: str) -> Any:
    """A real ScheduleBatch (the installed SGLang's class), every field a value of its own."""
    import dataclasses

    from sglang.srt.managers.schedule_batch import ScheduleBatch

    batch = ScheduleBatch.__new__(ScheduleBatch)
    for f in dataclasses.fields(ScheduleBatch):
        setattr(batch, f.name, (tag, f.name))
    batch.spec_algorithm = NS(is_none=lambda: False)
    batch.sampling_info = NS(copy_for_forward=lambda: NS(forward_copy_of=tag))
    return batch


def _forward(batch: Any, fail: bool) -> None:
    """What spec-v2's worker does to a batch mid-forward: rebinds fields, adds one."""
    batch.seq_lens = "rebound"
    batch.spec_info = "verify input"
    batch.forward_mode = "TARGET_VERIFY"
    batch.specctl_note = "not a field"
    if fail:
        raise RuntimeError("cuda error")


@pytest.mark.parametrize(("overlap", "fail"), [(True, False), (False, False), (True, True)])
def test_0517_forward_isolation_is_sglangs_with_one_snapshot_call(
    sglang17_root: Path, overlap: bool, fail: bool,
) -> None:
    """Against 0.5.17's own body on a real ScheduleBatch class: the same sampling info copy
    inside the forward, the same pinning, and every field put back afterwards, raised or not."""
    import dataclasses

    isolation, record = sglang17_source.forward_isolation(sglang17_root)
    runs = []
    for tag in ("sglang", "trim"):
        batch = _real_batch(tag)
        before = {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)}
        scheduler = NS(batch_record_buf=[None] * 2, batch_record_ct=0)
        scheduler.record_batch_in_overlap = lambda b, s=scheduler: record(s, b)
        fields = lean_host.isolation_fields("0.5.17", batch)
        assert fields is not None
        manager = isolation(scheduler, batch, overlap=overlap) if tag == "sglang" \
            else lean_host.Isolation(scheduler, batch, overlap, fields)
        inside: list[Any] = []
        with contextlib.suppress(RuntimeError), manager:
            inside.append(batch.sampling_info.forward_copy_of)
            _forward(batch, fail)
        after = {f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)}
        assert all(after[name] is value for name, value in before.items()), tag
        pinned = scheduler.batch_record_buf[1]
        # what the pinning holds: the batch, and each field as the forward starts (by name;
        # the sampling info is then the forward copy, the algorithm a stand-in)
        held = None if pinned is None else (pinned[0] is batch, [
            v[1] if isinstance(v, tuple) else getattr(v, "forward_copy_of", "stand-in")
            for v in pinned[1]])
        runs.append((inside, batch.specctl_note, scheduler.batch_record_ct, held))
    assert runs[0][0] == ["sglang"] and runs[1][0] == ["trim"]
    assert runs[0][1:3] == runs[1][1:3] == ("not a field", 1 if overlap else 0)
    sglang_held, trim_held = runs[0][3], runs[1][3]
    if overlap:
        assert sglang_held is not None and trim_held is not None
        assert sglang_held[0] and trim_held[0]
        assert [v if v != "sglang" else "trim" for v in sglang_held[1]] == trim_held[1]
        assert "trim" in trim_held[1]  # the forward copy was pinned, as SGLang pins it
    else:
        assert sglang_held is None and trim_held is None


class _Slotted:
    __slots__ = ("a", "b")


@pytest.mark.parametrize("case", ["lean", "0.5.23", "not speculative", "trims off",
                                  "own __setattr__", "a field behind a property", "slots",
                                  "positional overlap"])
def test_the_isolation_hook_runs_sglangs_body_but_where_the_trim_reproduces_it(
    case: str, runtime: SchedulerRuntime, monkeypatch: pytest.MonkeyPatch,
) -> None:
    import dataclasses

    from sglang_hooks import hooks

    batch: Any = _real_batch("b")
    monkeypatch.setattr(hooks, "RELEASE", "0.5.23" if case == "0.5.23" else "0.5.17")
    runtime.host_trims = case != "trims off"
    if case == "not speculative":
        batch.spec_algorithm = NS(is_none=lambda: True)
    if case == "own __setattr__":
        @dataclasses.dataclass
        class Guarded:
            a: int = 0
            b: int = 0
            spec_algorithm: Any = None

            def __setattr__(self, name: str, value: Any) -> None:
                object.__setattr__(self, name, value)

        batch = Guarded(spec_algorithm=NS(is_none=lambda: False))
    if case == "a field behind a property":
        @dataclasses.dataclass
        class Base:
            a: int = 0
            spec_algorithm: Any = None

        class Described(Base):
            a = property(lambda self: 1, lambda self, v: None)  # type: ignore[assignment]

        batch = Described.__new__(Described)
        batch.spec_algorithm = NS(is_none=lambda: False)
    if case == "slots":
        batch = dataclasses.dataclass(type("Slotted", (_Slotted,), {
            "__annotations__": {"a": int, "b": int}}))
        batch = batch.__new__(batch)
        batch.a, batch.b = 1, 2
        monkeypatch.setattr(lean_host, "isolation_fields",
                            lambda release, b: lean_host.batch_fields(type(b)))
    calls: list[Any] = []
    original = lambda s, b, *a, **k: calls.append((a, k)) or "sglang's"  # noqa: E731
    if case == "positional overlap":
        got = hooks.lean_isolation(original, NS(), batch, True)
    else:
        got = hooks.lean_isolation(original, NS(), batch, overlap=True)
    lean = case == "lean"
    assert isinstance(got, lean_host.Isolation) == lean
    assert (calls == []) == lean
    assert runtime.prepare_trims["isolation"] == (1 if lean else 0)


def test_the_host_trims_benchmark_runs_at_a_tiny_scale(
    sglang17_root: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    from benchmarks import host_trims

    monkeypatch.setattr("sys.argv", ["host_trims", "--sglang17-src", str(sglang17_root),
                                     "--requests", "8", "--calls", "3", "--rounds", "1"])
    assert host_trims.main() == 0
    out = capsys.readouterr().out
    for body in ("next-decode KV estimate", "decode preparation", "free group end",
                 "hand-over, FA3", "hand-over, host lengths", "forward isolation"):
        assert body in out
    assert "bonus tokens'" not in out  # the relay trims' operators are gone with them
