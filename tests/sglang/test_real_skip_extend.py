"""The off path's skipped draft extend, through SGLang's real methods.

Real: `EagleDraftWorker._draft_extend_for_decode` (patched by the plugin's loader; the real
body runs whenever the plugin does not skip) and `EAGLEWorkerV2._stub_skipped_draft_extend`
(SGLang's own stub, the one its SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND switch uses), both
SGLang 0.5.23's code. Stand-ins, because the workers need a GPU model runner: the two `self`
objects (`_spec_worker`: the device, top-k and draft runner config the stub reads; the draft
worker: nothing, so the real extend fails at once on it, which is how a test sees that it
ran) and the batch/result pair (the sequence lengths and the next draft input).
"""

from __future__ import annotations

import types
from types import SimpleNamespace as NS
from typing import Any

import pytest

from sglang_hooks import settings
from sglang_hooks.contract import OffPathFeature, PolicyTable, Tier
from sglang_hooks.runtime import SchedulerRuntime

HIDDEN = 64


def _spec_worker(steps: int) -> Any:
    import torch
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    runner = NS(model_config=NS(spec_hidden_size=HIDDEN, dtype=torch.bfloat16),
                spec_algorithm=NS(is_standalone=lambda: False))
    worker = NS(device="cpu", topk=1, speculative_num_steps=steps,
                draft_worker=NS(draft_runner=runner))
    worker._stub_skipped_draft_extend = types.MethodType(
        EAGLEWorkerV2._stub_skipped_draft_extend, worker)
    return worker


def _extend(runtime: SchedulerRuntime, batch_size: int, steps: int,
            want: tuple[int, bool] = (0, False)) -> Any:
    """One decode launch: the depth choice (drawn until it is `want`: depth, probe), then
    the draft extend SGLang calls after verify."""
    import torch
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker

    runtime.spec_worker = _spec_worker(steps)
    for _ in range(1000):
        if (runtime.choose(batch_size), runtime.launch_explore) == want:
            break
    else:
        raise AssertionError(f"the table never chose {want} at batch size {batch_size}")
    batch = NS(seq_lens=torch.zeros(batch_size, dtype=torch.int64))
    result = NS(next_draft_input=NS(topk_p=None, topk_index=None, hidden_states=None))
    EagleDraftWorker._draft_extend_for_decode(NS(), batch, result)
    return result.next_draft_input


@pytest.fixture
def off_table(runtime: SchedulerRuntime, plugin_loaded: bool) -> SchedulerRuntime:
    runtime.activate({0, 1, 3}, None)
    runtime.commit(PolicyTable.build([
        Tier(1, 3, explore_share=0.5, explore_depths=(0,)),
        Tier(16, 0, hysteresis=2),
        Tier(64, 0, hysteresis=8, explore_share=0.5, explore_depths=(3,)),
    ], 5))
    return runtime


def test_skip_extend_stubs_the_draft_inputs_in_an_off_tier(off_table: SchedulerRuntime) -> None:
    assert OffPathFeature.SKIP_EXTEND in off_table.features  # this SGLang's off path
    out = _extend(off_table, 20, steps=0)
    assert out.topk_p.shape == (20, 1) and float(out.topk_p.abs().sum()) == 0.0
    assert out.topk_index.shape == (20, 1) and out.hidden_states.shape == (20, HIDDEN)
    assert off_table.skipped_extends == 1


@pytest.mark.parametrize(("path", "batch", "skips"), [
    (settings.SGLANG, 20, False),  # SGLang's depth 0: the extend runs
    (settings.SPECCTL, 100, False),  # the off tier probes depth 3: keep the draft warm
    (settings.SPECCTL, 20, True),
])
def test_which_paths_and_tiers_keep_the_real_extend(off_table: SchedulerRuntime, path: str,
                                                    batch: int, skips: bool) -> None:
    if path == settings.SGLANG:
        off_table.use_off_path(path, ())
    if skips:
        _extend(off_table, batch, steps=0)
        assert off_table.skipped_extends == 1
    else:
        with pytest.raises(AttributeError):  # the real extend ran on the stand-in worker
            _extend(off_table, batch, steps=0)
        assert off_table.skipped_extends == 0


def test_a_depth_zero_probe_in_a_speculative_tier_keeps_the_extend(
    off_table: SchedulerRuntime,
) -> None:
    with pytest.raises(AttributeError):
        _extend(off_table, 4, steps=0, want=(0, True))
    assert off_table.skipped_extends == 0


def test_a_worker_not_at_depth_zero_is_never_skipped(off_table: SchedulerRuntime) -> None:
    """If the runtime state did not switch (the worker still runs 3), the real extend runs."""
    with pytest.raises(AttributeError):
        _extend(off_table, 20, steps=3)
    assert off_table.skipped_extends == 0


@pytest.mark.parametrize("path", [settings.SGLANG, settings.SPECCTL])
def test_accept_lengths_kept_on_the_host_go_to_the_device_before_a_real_extend(
    off_table: SchedulerRuntime, path: str,
) -> None:
    """A depth-0 plain decode keeps its accept lengths on the host when its launch skips the
    extend; whenever SGLang's real extend runs instead (here: the off path keeps it, or the
    stub fails on a stand-in worker without a draft runner), they are on the batch's device
    first. The device is "meta" so that the move shows on a machine without a GPU."""
    import torch
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker

    if path == settings.SGLANG:
        off_table.use_off_path(path, ())
    off_table.spec_worker = NS(device="meta", topk=1, speculative_num_steps=0)  # no stub
    while (off_table.choose(20), off_table.launch_explore) != (0, False):
        pass
    batch = NS(seq_lens=torch.zeros(20, dtype=torch.int64, device="meta"))
    result = NS(next_draft_input=NS(topk_p=None, topk_index=None, hidden_states=None),
                accept_lens=torch.ones(20, dtype=torch.int32))
    with pytest.raises(AttributeError):  # the real extend ran on the stand-in draft worker
        EagleDraftWorker._draft_extend_for_decode(NS(), batch, result)
    assert result.accept_lens.device.type == "meta"
    assert off_table.skipped_extends == 0


def test_a_skip_flag_does_not_outlive_its_launch(off_table: SchedulerRuntime) -> None:
    """The flag that makes the extend skip belongs to the launch whose depth choice set it:
    the next launch starts without it, steered or not."""
    from sglang_hooks import hooks

    off_table.launch_skips_extend = True
    hooks.time_launch(lambda worker, batch: NS(), NS(), NS())
    assert not off_table.launch_skips_extend
    off_table.launch_skips_extend = True
    off_table.deactivate("test")
    assert not off_table.launch_skips_extend
    off_table.launch_skips_extend = True
    hooks.time_launch(lambda worker, batch: NS(), NS(), NS())  # inactive: SGLang's launch
    assert not off_table.launch_skips_extend
