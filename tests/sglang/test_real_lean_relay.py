"""The depth-0 relay trims (`specctl_lean_relay`), through SGLang's real code where it runs on CPU.

Real: SGLang 0.5.23's `EAGLEWorkerV2.last_shared_read_runner` and
`EagleDraftWorker._draft_extend_for_decode` (patched by the plugin's loader, so the skip and
the hand-over run as on a server), and SGLang 0.5.17's `FutureMap.stash` and
`FutureMap._resolve_spec_extras`, compiled from the unpacked 0.5.17 source (the latter's fused
gather kernel, Triton, replaced by the indexing it does). Stand-ins, because the real objects
need a GPU: the workers' model runners (only the read-done attribute the scheduler's WAR
barrier reads), the CUDA event the hand-over records (a plain object, by device), the
FutureMap `self` (CPU buffers of the shapes SGLang allocates) and the decode batch (its
draft input's fields).
"""

from __future__ import annotations

import types
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any

import pytest

from benchmarks import sglang17_source
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


def test_a_given_replay_event_goes_to_the_barrier_instead_of_a_new_one(
    events: list[Any]
) -> None:
    worker, replayed = _worker_0517(), object()
    assert lean_relay.hand_over(worker, replayed)
    assert worker.war_fastpath_runner.war_fastpath_read_done_event is replayed and not events


@pytest.mark.parametrize("fence_at_replay", [True, False])
def test_the_skipped_extend_hands_over_the_plain_decodes_replay_event_when_asked(
    relay: SchedulerRuntime, events: list[Any], fence_at_replay: bool
) -> None:
    import torch
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker

    worker = _worker_0523()
    relay.spec_worker = worker
    relay.fence_at_replay = fence_at_replay
    assert relay.choose(20) == 0
    batch = NS(seq_lens=torch.zeros(20, dtype=torch.int64))
    replayed = object()
    result = NS(next_draft_input=NS(topk_p=None, topk_index=None, hidden_states=None),
                **{lean_relay.REPLAY_EVENT: replayed})
    EagleDraftWorker._draft_extend_for_decode(NS(), batch, result)
    handed = worker._draft_worker.draft_runner.shared_read_done_event
    assert handed is (replayed if fence_at_replay else events[0][1])
    assert relay.early_fences == 1 and relay.replay_fences == int(fence_at_replay)
    assert relay.report()["replay_fences"] == int(fence_at_replay)
    assert relay.report()["fence_at_replay"] is fence_at_replay
    # a verify's result carries no replay event: the barrier gets one at its outputs
    verified = NS(next_draft_input=NS(topk_p=None, topk_index=None, hidden_states=None))
    EagleDraftWorker._draft_extend_for_decode(NS(), batch, verified)
    assert worker._draft_worker.draft_runner.shared_read_done_event is events[-1][1]
    assert relay.early_fences == 2 and relay.replay_fences == int(fence_at_replay)


def test_the_fence_at_the_replay_is_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(lean_relay.FENCE_ENV, "1")
    assert lean_relay.fence_from_env() == (True, None)
    monkeypatch.setenv(lean_relay.FENCE_ENV, "maybe")
    on, error = lean_relay.fence_from_env()
    assert not on and error is not None and lean_relay.FENCE_ENV in error
    monkeypatch.delenv(lean_relay.FENCE_ENV)
    assert lean_relay.fence_from_env() == (False, None)


# ----------------------------------------------------------------------------- 0.5.17's stash


def _stash_0517(root: Path) -> Any:
    """SGLang 0.5.17's FutureMap.stash, compiled alone from its source."""
    return sglang17_source.compiled(root, "srt/managers/overlap_utils.py", "stash", "FutureMap",
                                    {"torch": __import__("torch")})


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


@pytest.mark.parametrize("index_dtype", ["int64", "int32"])
def test_0517_stash_bonus_only_writes_sglangs_bonus_rows_and_nothing_else(
    sglang17_root: Path, relay: SchedulerRuntime, monkeypatch: pytest.MonkeyPatch,
    index_dtype: str,
) -> None:
    """Pool rows as int64 take the direct copy, any other dtype SGLang's indexed assignment:
    the same rows either way."""
    import torch

    monkeypatch.setattr(hooks, "RELEASE", "0.5.17")
    indices = torch.tensor([1, 4, 6], dtype=getattr(torch, index_dtype))
    full, lean = _future_map(sglang17_root), _future_map(sglang17_root)
    lean.__dict__["_specctl_draft_state_zeroed"] = True  # past its first bonus-only stash
    full.stash(indices, _payload(3))  # SGLang's own: every field
    relay.launch_stubbed = True
    assert hooks.lean_stash(lambda *a: pytest.fail("SGLang's stash ran"), lean, indices,
                            _payload(3)) is None
    assert torch.equal(lean.output_tokens_buf, full.output_tokens_buf)
    assert float(full.topk_p_buf[1, 0]) == 0.0 and float(lean.topk_p_buf[1, 0]) == 7.0
    assert bool((lean.hidden_states_buf == 7.0).all()), "the dead draft state is not written"
    assert relay.lean_stashes == 1


def test_the_first_bonus_only_stash_zeroes_the_draft_buffers_once(
    sglang17_root: Path, relay: SchedulerRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SGLang allocates the draft buffers uninitialised (here: 7s) and fills a row at its
    request's first stash. A row whose first stash is bonus-only would keep the garbage, so
    the first bonus-only stash zeroes every draft buffer, as SGLang's stub would write;
    later ones leave the rows' draft state alone, as before."""
    import torch

    monkeypatch.setattr(hooks, "RELEASE", "0.5.17")
    fm = _future_map(sglang17_root)
    relay.launch_stubbed = True
    hooks.lean_stash(lambda *a: pytest.fail("SGLang's stash ran"), fm,
                     torch.tensor([1, 4]), _payload(2))
    for buf in (fm.topk_p_buf, fm.topk_index_buf, fm.hidden_states_buf):
        assert bool((buf == 0).all()), "a row never stashed in full holds zeros"
    assert fm.output_tokens_buf.tolist() == [-1, 100, -1, -1, 101, -1, -1, -1]
    payload = _payload(1)
    payload.topk_p.fill_(0.5)
    payload.hidden_states.fill_(3.0)
    fm.stash(torch.tensor([2]), payload)  # a drafting launch: SGLang's stash, real state
    hooks.lean_stash(lambda *a: pytest.fail("SGLang's stash ran"), fm,
                     torch.tensor([2, 5]), _payload(2))
    assert float(fm.topk_p_buf[2, 0]) == 0.5 and bool((fm.hidden_states_buf[2] == 3.0).all())
    assert relay.lean_stashes == 2


def test_an_admission_without_its_draft_prefill_stashes_its_bonus_tokens_alone(
    sglang17_root: Path, relay: SchedulerRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A prefill admitted into the depth-0 tier gets the skipped extend's stub (0.5.23's
    `_stub_skipped_draft_extend`, reused per batch size under the host-work trims); what the
    overlap scheduler relays of it is the bonus tokens (`RelayPayload`, 0.5.23's), stashed
    alone into 0.5.17's buffers."""
    import torch
    from sglang.srt.managers.overlap_utils import RelayPayload

    monkeypatch.setattr(hooks, "RELEASE", "0.5.17")
    relay.skip_draft_prefill = relay.lean_host = True
    relay.spec_worker = _worker_0523()
    assert relay.choose(20) == 0
    batch = NS(forward_mode=NS(is_idle=lambda: False), reqs=[object()] * 2,
               seq_lens=torch.full((2,), 100, dtype=torch.int64))
    bonus = torch.tensor([31, 32])
    stub = hooks.skip_draft_prefill(lambda *a: pytest.fail("the draft prefill ran"), NS(),
                                    batch, torch.zeros(200, 3 * HIDDEN), bonus, None)
    assert relay.skipped_prefills == 1 and relay.launch_stubbed
    assert stub.bonus_tokens is bonus and float(stub.hidden_states.abs().sum()) == 0.0
    fm = _future_map(sglang17_root)
    fm.__dict__["_specctl_draft_state_zeroed"] = True
    hooks.lean_stash(lambda *a: pytest.fail("SGLang's stash ran"), fm, torch.tensor([3, 6]),
                     RelayPayload.from_draft_input(stub))
    assert fm.output_tokens_buf.tolist() == [-1, -1, -1, 31, -1, -1, 32, -1]
    assert bool((fm.hidden_states_buf == 7.0).all()) and relay.lean_stashes == 1
    again = hooks.skip_draft_prefill(lambda *a: pytest.fail("the draft prefill ran"), NS(),
                                     batch, torch.zeros(200, 3 * HIDDEN), bonus, None)
    assert again.topk_p is stub.topk_p and again.hidden_states is stub.hidden_states


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


# ----------------------------------------------------------------------------- 0.5.17's gather


def _gather_0517(root: Path) -> Any:
    """SGLang 0.5.17's FutureMap._resolve_spec_extras, compiled alone from its source. Its
    fused gather kernel (`gather_spec_extras`, Triton) is replaced by the indexing it does."""
    import torch

    def gather_spec_extras(indices: Any, topk_p: Any, topk_index: Any, tokens: Any,
                           hidden: Any) -> tuple[Any, ...]:
        return (topk_p[indices], topk_index[indices], tokens[indices],
                None if hidden is None else hidden[indices])

    return sglang17_source.compiled(
        root, "srt/managers/overlap_utils.py", "_resolve_spec_extras", "FutureMap",
        {"torch": torch, "gather_spec_extras": gather_spec_extras, "_DEBUG_ASSERT": False})


RECORDS: list[Any] = []  # streams passed to the pool indices' `record_stream`


def _indices(values: list[int]) -> Any:
    """Pool indices whose `record_stream` only notes the call: CPU tensors have no streams."""
    import torch

    class NoStreams(torch.Tensor):
        def record_stream(self, stream: Any) -> None:
            RECORDS.append(stream)

    return torch.tensor(values).as_subclass(NoStreams)


def _gather_map(root: Path) -> Any:
    import torch

    fm = _future_map(root)
    fm.device = "cpu"
    fm.output_tokens_buf = torch.arange(200, 208, dtype=torch.int64)
    fm.topk_p_buf = torch.arange(8, dtype=torch.float32).unsqueeze(1)
    fm.topk_index_buf = torch.arange(10, 18).unsqueeze(1)
    fm.hidden_states_buf = torch.arange(8 * HIDDEN, dtype=torch.float32).reshape(8, HIDDEN)
    fm._resolve_spec_extras = types.MethodType(_gather_0517(root), fm)
    return fm


def _decode_batch(values: list[int]) -> Any:
    """A decode batch as the scheduler resolves it: last iteration's draft input, its fields
    still those of the last launch's output (here: marked stale)."""
    import torch

    n = len(values)
    return NS(spec_info=NS(future_indices=_indices(values), future_dsa_topk_indices_available=False,
                           bonus_tokens=None, topk_p=torch.full((n, 1), -1.0),
                           topk_index=torch.full((n, 1), -1), draft_probs=None,
                           hidden_states=torch.full((n, HIDDEN), -1.0), dsa_topk_indices=None),
              reqs=[object()] * n)


def _draft_state(batch: Any) -> list[list[Any]]:
    d = batch.spec_info
    return [d.bonus_tokens.tolist(), d.topk_p.tolist(), d.topk_index.tolist(),
            d.hidden_states.tolist()]


@pytest.mark.parametrize(("batch_size", "drafts"), [(20, False), (4, True)])
def test_0517_gather_waits_for_the_depth_choice_and_matches_sglangs(
    sglang17_root: Path, relay: SchedulerRuntime, monkeypatch: pytest.MonkeyPatch,
    batch_size: int, drafts: bool,
) -> None:
    """The table runs depth 3 under 16 requests and 0 from there. The trimmed gather takes
    the bonus tokens only; the depth choice of a launch that drafts then runs SGLang's own
    gather, leaving the draft state exactly as SGLang's gather at the start would have."""
    monkeypatch.setattr(hooks, "RELEASE", "0.5.17")
    rows = [1, 4, 6]
    full_map, lean_map = _gather_map(sglang17_root), _gather_map(sglang17_root)
    full, lean = _decode_batch(rows), _decode_batch(rows)
    RECORDS.clear()
    full_map._resolve_spec_extras(full)  # SGLang's own, at the start of the iteration
    assert len(RECORDS) == 1  # SGLang records the indices on the stream; the trim does not
    RECORDS.clear()

    def sglang_gather(fm: Any, batch: Any) -> None:
        fm._resolve_spec_extras(batch)

    assert hooks.lean_resolve_extras(sglang_gather, lean_map, lean) is None
    assert lean.spec_info.bonus_tokens.tolist() == [201, 204, 206] and RECORDS == []
    assert lean.spec_info.topk_p.tolist() == [[-1.0]] * 3  # not gathered yet
    assert relay.lean_gathers == 1 and relay.owed_gather is not None
    depth = hooks.choose_depth(lambda *a: pytest.fail("a table rules"), NS(), batch_size)
    assert depth == (3 if drafts else 0) and relay.owed_gather is None
    if drafts:
        assert _draft_state(lean) == _draft_state(full) and relay.late_gathers == 1
    else:
        assert lean.spec_info.topk_p.tolist() == [[-1.0]] * 3 and relay.late_gathers == 0
    assert relay.report()["lean_gathers"] == 1


@pytest.mark.parametrize("case", ["off", "0.5.23", "first stash", "rejection sampling",
                                  "dsa", "no table yet"])
def test_every_other_gather_is_sglangs(
    case: str, sglang17_root: Path, relay: SchedulerRuntime, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    monkeypatch.setattr(hooks, "RELEASE", "0.5.23" if case == "0.5.23" else "0.5.17")
    relay.lean_relay = case != "off"
    relay.active = case != "no table yet"
    fm, batch = _gather_map(sglang17_root), _decode_batch([2])
    fm._forward_buf_initialized = case != "first stash"
    if case == "rejection sampling":
        fm.draft_probs_buf = torch.zeros(8, 4)
    batch.spec_info.future_dsa_topk_indices_available = case == "dsa"
    ran: list[bool] = []
    hooks.lean_resolve_extras(lambda *a: ran.append(True), fm, batch)
    assert ran == [True] and relay.lean_gathers == 0 and relay.owed_gather is None


def test_a_stub_flag_does_not_outlive_its_launch(relay: SchedulerRuntime) -> None:
    """The flag that makes the relay stash the bonus tokens alone belongs to the launch that
    set it: the next launch starts without it, steered or not (after the runtime stopped
    steering, a drafting launch's state must be stashed in full)."""
    relay.launch_stubbed = True
    hooks.time_launch(lambda worker, batch: NS(), NS(), NS())
    assert not relay.launch_stubbed
    relay.launch_stubbed = True
    relay.deactivate("test")
    assert not relay.launch_stubbed
    relay.launch_stubbed = True
    hooks.time_launch(lambda worker, batch: NS(), NS(), NS())  # inactive: SGLang's launch
    assert not relay.launch_stubbed


def test_a_gather_is_owed_to_its_own_launch_only(relay: SchedulerRuntime) -> None:
    """Whatever a launch did with it, nothing owed outlives the launch."""
    relay.owed_gather = (lambda *a: pytest.fail("gathered for another launch"), None, None)
    hooks.time_launch(lambda worker, batch: NS(), NS(), NS())
    assert relay.owed_gather is None
    relay.owed_gather = (lambda *a: pytest.fail("gathered for another launch"), None, None)
    with pytest.raises(RuntimeError):
        hooks.time_launch(lambda worker, batch: (_ for _ in ()).throw(RuntimeError("oom")),
                          NS(), NS())
    assert relay.owed_gather is None
