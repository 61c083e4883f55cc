"""The draft's prefill skipped while off, through SGLang's real methods.

Real: `EagleDraftWorker._draft_extend_for_prefill` (patched by the plugin's loader; its real
body runs whenever the plugin does not skip), `EAGLEWorkerV2._stub_skipped_draft_extend`
(SGLang's own stub), `EagleDraftInput` and the overlap scheduler's `RelayPayload`, all SGLang
0.5.23's code. Stand-ins, because the workers need a GPU model runner: the two `self` objects
(the speculative worker: the device, top-k and draft runner config the stub reads; the draft
worker: nothing, so the real extend fails at once on it, which is how a test sees that it
ran) and the prefill batch (its mode, requests and sequence lengths).
"""

from __future__ import annotations

import types
from types import SimpleNamespace as NS
from typing import Any

import pytest

from sglang_hooks import settings
from sglang_hooks.adapters import v0_5_17
from sglang_hooks.contract import OffPathFeature, PolicyTable, Tier
from sglang_hooks.runtime import SchedulerRuntime

HIDDEN = 64


def _spec_worker() -> Any:
    import torch
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    runner = NS(model_config=NS(spec_hidden_size=HIDDEN, dtype=torch.bfloat16),
                spec_algorithm=NS(is_standalone=lambda: False))
    worker = NS(device="cpu", topk=1, speculative_num_steps=0,
                draft_worker=NS(draft_runner=runner))
    worker._stub_skipped_draft_extend = types.MethodType(
        EAGLEWorkerV2._stub_skipped_draft_extend, worker)
    return worker


def _batch(admitted: int, idle: bool = False) -> Any:
    import torch

    return NS(forward_mode=NS(is_idle=lambda: idle), reqs=[object()] * admitted,
              seq_lens=torch.full((admitted,), 100, dtype=torch.int64))


def _prefill(runtime: SchedulerRuntime, admitted: int, *extra: Any, idle: bool = False,
             **extra_kw: Any) -> Any:
    """The draft prefill SGLang runs after the target's prefill of `admitted` requests."""
    import torch
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker

    runtime.spec_worker = _spec_worker()
    bonus = torch.arange(admitted, dtype=torch.int32) + 7
    hidden = torch.zeros((admitted * 100, 3 * HIDDEN))
    return EagleDraftWorker._draft_extend_for_prefill(
        NS(), _batch(admitted, idle), hidden, bonus, *extra, **extra_kw), bonus


def _decode(runtime: SchedulerRuntime, batch_size: int) -> None:
    runtime.choose(batch_size)


@pytest.fixture
def off_table(runtime: SchedulerRuntime, plugin_loaded: bool) -> SchedulerRuntime:
    runtime.activate({0, 1, 3}, None)
    runtime.commit(PolicyTable.build([
        Tier(1, 3),
        Tier(16, 0, hysteresis=2),
        Tier(64, 0, hysteresis=8, explore_share=0.5, explore_depths=(3,)),
    ], 5))
    assert OffPathFeature.SKIP_DRAFT_PREFILL in runtime.features  # this SGLang's off path
    return runtime


def test_an_admission_into_an_off_tier_gets_the_stub_and_no_draft_forward(
    off_table: SchedulerRuntime,
) -> None:
    from sglang.srt.managers.overlap_utils import RelayPayload
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    _decode(off_table, 20)
    out, bonus = _prefill(off_table, 3)
    assert isinstance(out, EagleDraftInput)
    assert out.bonus_tokens is bonus
    assert out.topk_p.shape == (3, 1) and float(out.topk_p.abs().sum()) == 0.0
    assert out.topk_index.shape == (3, 1) and out.hidden_states.shape == (3, HIDDEN)
    assert out.num_tokens_per_req == 1 and out.num_tokens_for_logprob_per_req == 1
    # what the overlap scheduler stashes for the next iteration takes it as it takes SGLang's
    payload = RelayPayload.from_draft_input(out)
    assert payload.bonus_tokens is bonus and payload.hidden_states.shape == (3, HIDDEN)
    assert off_table.skipped_prefills == 1
    assert off_table.report()["skipped_draft_prefills"] == 1


def test_with_the_host_trims_the_stub_is_sglangs_zeros_built_once_per_batch_size(
    off_table: SchedulerRuntime,
) -> None:
    """0.5.17's off path, with the trims: the reused stub has the shapes, dtypes and zeros of
    SGLang's own (0.5.23's off path, without them, builds it anew); a prefill of another size
    gets its own."""
    _decode(off_table, 20)
    sglang_stub, _ = _prefill(off_table, 3)
    again, _ = _prefill(off_table, 3)
    assert again.topk_p is not sglang_stub.topk_p  # without the trims: SGLang's, every time
    off_table.use_off_path(settings.SPECCTL, v0_5_17.ADAPTER.off_path)
    first, _ = _prefill(off_table, 3)
    second, bonus = _prefill(off_table, 3)
    other, _ = _prefill(off_table, 5)
    for name in ("topk_p", "topk_index", "hidden_states"):
        ours, sglangs = getattr(second, name), getattr(sglang_stub, name)
        assert ours is getattr(first, name), f"{name} built again"
        assert ours.shape == sglangs.shape and ours.dtype == sglangs.dtype
        assert float(ours.abs().sum()) == 0.0
        assert getattr(other, name).shape[0] == 5
    assert second.bonus_tokens is bonus and off_table.skipped_prefills == 5


def _runs_the_real_extend(runtime: SchedulerRuntime, admitted: int, *extra: Any,
                          idle: bool = False, **extra_kw: Any) -> bool:
    before = runtime.skipped_prefills
    try:
        _prefill(runtime, admitted, *extra, idle=idle, **extra_kw)
    except AttributeError:  # the real body reached the stand-in draft worker
        return runtime.skipped_prefills == before
    return False


def test_an_admission_into_a_speculative_tier_runs_the_real_extend(
    off_table: SchedulerRuntime,
) -> None:
    _decode(off_table, 4)
    assert _runs_the_real_extend(off_table, 3)


def test_the_landing_tier_is_read_with_hysteresis_and_leaves_it_alone(
    off_table: SchedulerRuntime,
) -> None:
    """In the off tier (16+, hysteresis 2) a running batch of 13 plus 1 admitted stays off;
    plus nothing it would fall back below 14, to depth 3. The peek moves no state."""
    _decode(off_table, 20)
    assert off_table.selector is not None and off_table.selector.tier == 1
    off_table.last_batch_size = 13
    assert off_table.prefill_skips_draft(1)
    assert not off_table.prefill_skips_draft(0)
    assert off_table.selector.tier == 1
    _prefill(off_table, 1)
    assert off_table.skipped_prefills == 1


@pytest.mark.parametrize(("features", "path", "running"), [
    # an off path without the prefill's skip: SGLang's draft prefill
    (frozenset({OffPathFeature.SKIP_EXTEND}), settings.SPECCTL, 20),
    # SGLang's depth 0 keeps the draft current: so does its prefill
    (frozenset(), settings.SGLANG, 20),
    (None, settings.SPECCTL, 100),  # the off tier probes depth 3: keep the draft warm
])
def test_which_paths_and_tiers_keep_the_real_extend(off_table: SchedulerRuntime,
                                                    features: frozenset[OffPathFeature] | None,
                                                    path: str, running: int) -> None:
    if features is not None:
        off_table.use_off_path(path, features)
    _decode(off_table, running)
    assert _runs_the_real_extend(off_table, 2)


def test_idle_and_multimodal_batches_keep_the_real_extend(off_table: SchedulerRuntime) -> None:
    import torch

    _decode(off_table, 20)
    embeds = torch.zeros((200, HIDDEN))
    assert _runs_the_real_extend(off_table, 2, embeds)
    assert _runs_the_real_extend(off_table, 2, mm_input_embeds=embeds)
    # 0.5.23's KV location plan only says where the extend would write: still skipped
    _prefill(off_table, 2, None, kv_loc_plan=object())
    assert off_table.skipped_prefills == 1


def test_an_idle_batch_keeps_the_real_extend(off_table: SchedulerRuntime) -> None:
    """An idle batch (data-parallel attention) takes SGLang's own path, whose idle branch
    needs the real draft runner: here it fails on the stand-in, which shows it ran."""
    _decode(off_table, 20)
    assert _runs_the_real_extend(off_table, 0, idle=True)


def test_without_a_table_the_skip_changes_nothing(runtime: SchedulerRuntime,
                                                  plugin_loaded: bool) -> None:
    runtime.activate({0, 1, 3}, None)
    assert runtime.skips_draft_prefill
    runtime.choose(100)
    assert _runs_the_real_extend(runtime, 2)
