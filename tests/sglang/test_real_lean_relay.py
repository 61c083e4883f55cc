"""The depth-0 relay trims (`specctl_lean_relay`), through SGLang's real code where it runs on CPU.

Real: SGLang 0.5.23's `EAGLEWorkerV2.last_shared_read_runner` and
`EagleDraftWorker._draft_extend_for_decode` (patched by the plugin's loader, so the skip and
the hand-over run as on a server), and SGLang 0.5.17's `FutureMap.stash`, compiled from the
unpacked 0.5.17 source. Stand-ins, because the real objects need a GPU: the workers' model
runners (only the read-done attribute the scheduler's WAR barrier reads), the CUDA event the
hand-over records (a plain object, by device) and the FutureMap `self` (CPU buffers of the
shapes SGLang allocates).
"""

from __future__ import annotations

import ast
import types
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any

import pytest

from sglang_hooks import hooks, lean_relay
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


@pytest.fixture
def events(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Events the hand-over records, by device (a server records a CUDA event)."""
    made: list[Any] = []

    def new_event(device: Any) -> Any:
        made.append((device, object()))
        return made[-1][1]

    monkeypatch.setattr(lean_relay, "new_event", new_event)
    return made


def test_0523_hands_the_barrier_an_event_on_the_draft_runner(events: list[Any]) -> None:
    worker = _worker_0523()
    assert lean_relay.barrier_runner(worker) is worker._draft_worker.draft_runner
    assert lean_relay.hand_over(worker)
    assert worker._draft_worker.draft_runner.shared_read_done_event is events[0][1]
    assert events[0][0] == "cpu"  # recorded on the worker's device


def test_0517_hands_the_barrier_an_event_on_the_war_fastpath_runner(events: list[Any]) -> None:
    worker = _worker_0517()
    assert lean_relay.hand_over(worker)
    assert worker.war_fastpath_runner.war_fastpath_read_done_event is events[0][1]
    bare = NS(device="cpu", war_fastpath_runner=NS())  # no barrier attribute: nothing to hand
    assert not lean_relay.hand_over(bare) and len(events) == 1


@pytest.fixture
def relay(runtime: SchedulerRuntime) -> SchedulerRuntime:
    runtime.activate({0, 1, 3}, None)
    runtime.commit(PolicyTable.build([Tier(1, 3), Tier(16, 0, hysteresis=1)], 2))
    runtime.lean_relay = True
    return runtime


def test_the_skipped_extend_hands_the_event_over_on_a_real_draft_worker(
    relay: SchedulerRuntime, events: list[Any]
) -> None:
    import torch
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker

    worker = _worker_0523()
    relay.spec_worker = worker
    assert relay.choose(20) == 0
    batch = NS(seq_lens=torch.zeros(20, dtype=torch.int64))
    result = NS(next_draft_input=NS(topk_p=None, topk_index=None, hidden_states=None))
    EagleDraftWorker._draft_extend_for_decode(NS(), batch, result)  # the plugin's skip
    assert relay.skipped_extends == 1 and relay.launch_stubbed
    assert result.next_draft_input.topk_p.shape == (20, 1)  # SGLang's stub ran first
    assert worker._draft_worker.draft_runner.shared_read_done_event is events[0][1]
    assert relay.early_fences == 1 and relay.report()["early_fences"] == 1
    relay.lean_relay = False
    worker._draft_worker.draft_runner.shared_read_done_event = None
    EagleDraftWorker._draft_extend_for_decode(NS(), batch, result)
    assert worker._draft_worker.draft_runner.shared_read_done_event is None  # trims off
    assert relay.early_fences == 1 and len(events) == 1


# ----------------------------------------------------------------------------- 0.5.17's stash


def _stash_0517(root: Path) -> Any:
    """SGLang 0.5.17's FutureMap.stash, compiled alone from its source."""
    source = (root / "srt" / "managers" / "overlap_utils.py").read_text()
    tree = ast.parse(source)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "FutureMap")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "stash")
    namespace: dict[str, Any] = {"torch": __import__("torch"), "RelayPayload": Any}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), "overlap_utils.py", "exec"), namespace)
    return namespace["stash"]


def _future_map(root: Path, slots: int = 8) -> Any:
    import torch

    fm = NS(spec_algo=NS(is_ngram=lambda: False), _forward_buf_initialized=True,
            need_topk=True, need_hidden_states=True, draft_probs_buf=None,
            dsa_topk_indices_buf=None,
            output_tokens_buf=torch.full((slots,), -1, dtype=torch.int64),
            topk_p_buf=torch.full((slots, 1), 7.0), topk_index_buf=torch.full((slots, 1), 7),
            hidden_states_buf=torch.full((slots, HIDDEN), 7.0, dtype=torch.bfloat16))
    fm._maybe_init_dsa_topk_indices_buf = lambda payload: None
    fm.stash = types.MethodType(_stash_0517(root), fm)
    return fm


def _payload(n: int) -> Any:
    import torch

    return NS(bonus_tokens=torch.arange(100, 100 + n, dtype=torch.int32),
              topk_p=torch.zeros(n, 1), topk_index=torch.zeros(n, 1, dtype=torch.int64),
              hidden_states=torch.zeros(n, HIDDEN, dtype=torch.bfloat16), draft_probs=None,
              dsa_topk_indices=None)


def test_0517_stash_bonus_only_writes_sglangs_bonus_rows_and_nothing_else(
    sglang17_root: Path, relay: SchedulerRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    monkeypatch.setattr(hooks, "RELEASE", "0.5.17")
    indices = torch.tensor([1, 4, 6])
    full, lean = _future_map(sglang17_root), _future_map(sglang17_root)
    full.stash(indices, _payload(3))  # SGLang's own: every field
    relay.launch_stubbed = True
    assert hooks.lean_stash(lambda *a: pytest.fail("SGLang's stash ran"), lean, indices,
                            _payload(3)) is None
    assert torch.equal(lean.output_tokens_buf, full.output_tokens_buf)
    assert float(full.topk_p_buf[1, 0]) == 0.0 and float(lean.topk_p_buf[1, 0]) == 7.0
    assert bool((lean.hidden_states_buf == 7.0).all()), "the dead draft state is not written"
    assert relay.lean_stashes == 1


@pytest.mark.parametrize("case", ["not stubbed", "0.5.23", "first stash", "off"])
def test_every_other_stash_is_sglangs(
    case: str, sglang17_root: Path, relay: SchedulerRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    fm = _future_map(sglang17_root)
    monkeypatch.setattr(hooks, "RELEASE", "0.5.23" if case == "0.5.23" else "0.5.17")
    relay.launch_stubbed = case != "not stubbed"
    relay.lean_relay = case != "off"
    if case == "first stash":
        fm._forward_buf_initialized = False  # SGLang sizes its buffers from the first payload
    ran: list[bool] = []
    hooks.lean_stash(lambda *a: ran.append(True), fm, torch.tensor([2]), _payload(1))
    assert ran == [True] and relay.lean_stashes == 0
