"""The fence at the replay (fence.py), through SGLang's real code where it runs on CPU.

Real: SGLang 0.5.23's `EAGLEWorkerV2.last_shared_read_runner` and
`EagleDraftWorker._draft_extend_for_decode` (patched by the plugin's loader, so the skip and
the hand-over run as on a server). Stand-ins, because the real objects need a GPU: the
workers' model runners (only the read-done attribute the scheduler's WAR barrier reads), the
read-done event a DECODE graph publishes before its replay (a plain object) and the decode
batch and result (the sequence lengths, the next draft input).
"""

from __future__ import annotations

import types
from types import SimpleNamespace as NS
from typing import Any

import pytest

from sglang_hooks import fence, settings
from sglang_hooks.adapters import v0_5_17, v0_5_23
from sglang_hooks.contract import PolicyTable, Tier
from sglang_hooks.runtime import SchedulerRuntime

HIDDEN = 16


def _worker_0523() -> Any:
    """A worker with SGLang 0.5.23's own `last_shared_read_runner` (the draft runner)."""
    import torch
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    cls = type("Worker", (), {"last_shared_read_runner": EAGLEWorkerV2.last_shared_read_runner})
    worker = cls()
    draft_runner = NS(shared_read_done_event=None,
                      model_config=NS(spec_hidden_size=HIDDEN, dtype=torch.bfloat16),
                      spec_algorithm=NS(is_standalone=lambda: False))
    worker._draft_worker = NS(draft_runner=draft_runner)
    worker.draft_worker = worker._draft_worker
    worker._target_worker = NS(model_runner=NS(attn_backend=NS(verify_mask=None)))
    worker.device, worker.topk, worker.speculative_num_steps = "cpu", 1, 0
    worker._stub_skipped_draft_extend = types.MethodType(
        EAGLEWorkerV2._stub_skipped_draft_extend, worker)
    return worker


def _worker_0517() -> Any:
    """A worker as 0.5.17 spells it: the barrier reads `war_fastpath_runner`'s event."""
    return NS(device="cpu", war_fastpath_runner=NS(war_fastpath_read_done_event=None))


def test_0523_hands_the_replay_event_to_the_draft_runner() -> None:
    worker, replayed = _worker_0523(), object()
    assert fence.barrier_runner(worker) is worker._draft_worker.draft_runner
    assert fence.hand_over(worker, replayed)
    assert worker._draft_worker.draft_runner.shared_read_done_event is replayed


def test_0517_hands_the_replay_event_to_the_war_fastpath_runner() -> None:
    worker, replayed = _worker_0517(), object()
    assert fence.hand_over(worker, replayed)
    assert worker.war_fastpath_runner.war_fastpath_read_done_event is replayed
    bare = NS(device="cpu", war_fastpath_runner=NS())  # no barrier attribute: nothing to hand
    assert not fence.hand_over(bare, object())


@pytest.fixture
def off_tier(runtime: SchedulerRuntime) -> SchedulerRuntime:
    runtime.activate({0, 1, 3}, None)
    runtime.commit(PolicyTable.build([Tier(1, 3), Tier(16, 0, hysteresis=1)], 2))
    return runtime


def _skipped_extend(runtime: SchedulerRuntime, worker: Any, result: Any) -> None:
    import torch
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker

    runtime.spec_worker = worker
    assert runtime.choose(20) == 0
    batch = NS(seq_lens=torch.zeros(20, dtype=torch.int64))
    EagleDraftWorker._draft_extend_for_decode(NS(), batch, result)  # the plugin's skip


def _result(**fields: Any) -> Any:
    return NS(next_draft_input=NS(topk_p=None, topk_index=None, hidden_states=None), **fields)


def test_a_plain_decodes_skipped_extend_hands_the_barrier_its_replay_event(
    off_tier: SchedulerRuntime,
) -> None:
    """0.5.17's off path (the plain decode and its fence): the replay's event goes to the
    barrier; a depth-0 batch that kept the verify (no replay event) leaves SGLang's
    whole-forward barrier alone."""
    off_tier.use_off_path(settings.SPECCTL, v0_5_17.ADAPTER.off_path)
    worker, replayed = _worker_0523(), object()
    result = _result(**{fence.REPLAY_EVENT: replayed})
    _skipped_extend(off_tier, worker, result)
    assert off_tier.skipped_extends == 1
    assert result.next_draft_input.topk_p.shape == (20, 1)  # SGLang's stub ran first
    assert worker._draft_worker.draft_runner.shared_read_done_event is replayed
    assert off_tier.replay_fences == 1 and off_tier.report()["replay_fences"] == 1
    worker._draft_worker.draft_runner.shared_read_done_event = None
    _skipped_extend(off_tier, worker, _result())  # a verify's result: no replay event
    assert worker._draft_worker.draft_runner.shared_read_done_event is None
    assert off_tier.skipped_extends == 2 and off_tier.replay_fences == 1


@pytest.mark.parametrize(("path", "features"), [
    (settings.SPECCTL, v0_5_23.ADAPTER.off_path),  # 0.5.23: no plain decode, no fence
    (settings.SGLANG, frozenset()),
])  # fmt: skip
def test_without_the_plain_decode_path_nothing_is_handed_over(
    off_tier: SchedulerRuntime, path: str, features: frozenset[Any],
) -> None:
    off_tier.use_off_path(path, features)
    worker = _worker_0523()
    result = _result(**{fence.REPLAY_EVENT: object()})
    if path == settings.SGLANG:  # SGLang's own depth 0: the real extend runs (and fails on
        with pytest.raises(AttributeError):  # the stand-in draft worker, which shows it ran)
            _skipped_extend(off_tier, worker, result)
    else:
        _skipped_extend(off_tier, worker, result)
    assert off_tier.skipped_extends == (path == settings.SPECCTL)
    assert worker._draft_worker.draft_runner.shared_read_done_event is None
    assert off_tier.replay_fences == 0
