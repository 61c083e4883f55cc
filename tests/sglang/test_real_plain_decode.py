"""Depth 0 as a plain decode (sglang_hooks/plain_decode.py).

Real: SGLang 0.5.23's `DecodeCudaGraphRunner` class (the plugin's runner subclasses it; its
constructor's capture-mode choice is read in the 0.5.17 and 0.5.23 sources), `ForwardMode`,
`CaptureHiddenMode`, `EagleDraftInput`, `GenerationBatchResult`, `Req`, and
`SchedulerBatchResultProcessor._resolve_spec_v2_tokens`, which the plain result goes through
as a verify's does where a grammar sends it there, and SGLang 0.5.17's
`_resolve_spec_v2_tokens` compiled alone from the unpacked 0.5.17 source (what the path's
one-pass result processing must equal). Stand-ins (no CUDA graph or model runs on a CPU): the
speculative worker (its target worker's forward adds one to each input id, so a result can be
traced to the tokens the forward saw), the model runner, the graph runner's `can_run_graph`,
the batch (the fields the path reads and writes), `ForwardBatch.init_new` (records the batch
as the forward sees it) and the result processor's `self` (the adaptive feedback it calls).
The H200 run checks the real path end to end: greedy outputs against the plain server and
1,000 switches (benchmarks/results/gpu/).
"""

from __future__ import annotations

import ast
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any

import pytest
import torch

from benchmarks import sglang17_source
from sglang_hooks import hooks, plain_decode

RUNNER_FILE = "srt/model_executor/runner/decode_cuda_graph_runner.py"


def _sglang23_root() -> Path:
    import sglang

    return Path(sglang.__file__).parent


def _method(root: Path, name: str) -> ast.FunctionDef:
    tree = ast.parse((root / RUNNER_FILE).read_text(encoding="utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef)
               and n.name == "DecodeCudaGraphRunner")
    return next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name)


def _assigned(node: ast.AST, attr: str) -> list[int]:
    return [n.lineno for n in ast.walk(node) if isinstance(n, ast.Assign)
            and any(isinstance(t, ast.Attribute) and t.attr == attr for t in n.targets)]


@pytest.mark.parametrize("release", ["0.5.17", "0.5.23"])
def test_sglang_chooses_the_capture_mode_before_the_capture_the_runner_overrides(
    release: str, sglang17_root: Path,
) -> None:
    """The subclass sets DECODE at the start of `capture()`: right only while SGLang picks the
    mode in its constructor before calling `capture()`, and picks it nowhere in the capture."""
    root = sglang17_root if release == "0.5.17" else _sglang23_root()
    init = _method(root, "__init__")
    capture_calls = [n.lineno for n in ast.walk(init) if isinstance(n, ast.Call)
                     and isinstance(n.func, ast.Attribute) and n.func.attr == "capture"]
    mode_sets = _assigned(init, "capture_forward_mode")
    assert capture_calls and mode_sets and max(mode_sets) < min(capture_calls)
    for name in ("capture", "capture_one_shape", "capture_prepare", "_capture_one_stream"):
        assert not _assigned(_method(root, name), "capture_forward_mode"), name
    # the spec input of a capture comes from get_spec_info, which the subclass empties
    assert "get_spec_info" in ast.unparse(_method(root, "capture_prepare"))


def test_the_runner_captures_decode_with_full_hidden_states_and_no_spec_input(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SGLang's capture itself needs a GPU: replaced here by one that records the modes."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import (
        DecodeCudaGraphRunner,
    )

    seen: list[tuple[Any, Any, bool]] = []
    monkeypatch.setattr(DecodeCudaGraphRunner, "capture", lambda self: seen.append(
        (self.capture_forward_mode, self.capture_hidden_mode, self.ragged_verify_mode)))
    runner = plain_decode.runner_class().__new__(plain_decode.runner_class())
    runner.capture_forward_mode = ForwardMode.TARGET_VERIFY  # what SGLang's constructor chose
    runner.capture_hidden_mode = CaptureHiddenMode.NULL
    runner.ragged_verify_mode = True
    runner.capture()
    assert seen == [(ForwardMode.DECODE, CaptureHiddenMode.FULL, False)]
    assert runner.get_spec_info(8) is None


# ----------------------------------------------------------------------------- per batch

REQ_TO_TOKEN = torch.arange(4 * 16, dtype=torch.int32).reshape(4, 16) + 1000


class Runner:
    def __init__(self, max_bs: int = 8) -> None:
        self.max_bs = max_bs

    def can_run_graph(self, forward_batch: Any) -> bool:
        return bool(forward_batch.batch_size <= self.max_bs)


class TargetWorker:
    """Its forward returns input id + 1 per request and records what it ran on."""

    def __init__(self, model_runner: Any, fail: bool = False) -> None:
        self.model_runner = model_runner
        self.fail = fail
        self.seen: list[dict[str, Any]] = []

    def forward_batch_generation(self, batch: Any, forward_batch: Any = None) -> Any:
        assert batch is None
        mr = self.model_runner
        self.seen.append({**forward_batch.__dict__, "runner": mr.decode_cuda_graph_runner,
                          "backend": mr.attn_backend})
        if self.fail:
            raise RuntimeError("replay failed")
        ids = forward_batch.input_ids.to(torch.int64) + 1
        hidden = torch.ones(len(ids), 12)
        return NS(next_token_ids=ids, can_run_cuda_graph=True,
                  logits_output=NS(hidden_states=hidden), routed_experts_output=None,
                  indexer_topk_output=None)


def _parts() -> plain_decode.SglangParts:
    from sglang.srt.managers.utils import GenerationBatchResult
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    def forward_batch(batch: Any, model_runner: Any, *, capture_hidden_mode: Any,
                      return_hidden_states_before_norm: bool) -> Any:
        return NS(batch_size=len(batch.reqs), forward_mode=batch.forward_mode,
                  spec_info=batch.spec_info, input_ids=batch.input_ids,
                  out_cache_loc=batch.out_cache_loc, seq_lens=batch.seq_lens.clone(),
                  capture_hidden_mode=capture_hidden_mode,
                  attn_backend_at_init=model_runner.attn_backend)

    return plain_decode.SglangParts(ForwardMode, CaptureHiddenMode, forward_batch,
                                    GenerationBatchResult, EagleDraftInput,
                                    lambda batch, verify_input: None)


def _worker(bs_limit: int = 8, fail: bool = False, steps: int = 0) -> Any:
    verify_runner, verify_backend = object(), object()
    mr = NS(decode_cuda_graph_runner=verify_runner, attn_backend=verify_backend)
    worker = NS(_target_worker=TargetWorker(mr, fail), speculative_num_steps=steps,
                req_to_token_pool=NS(req_to_token=REQ_TO_TOKEN))
    plain = plain_decode.PlainDecode(runner=Runner(bs_limit), backend=object())
    worker.__dict__[plain_decode._ATTR] = plain
    worker.verify_runner, worker.verify_backend = verify_runner, verify_backend
    return worker


def _batch(bs: int = 3, **overrides: Any) -> Any:
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    verify_input = NS(draft_token=torch.tensor([7, 8, 9, 10][:bs], dtype=torch.int32),
                      draft_token_num=1)
    fields = dict(forward_mode=ForwardMode.DECODE, spec_info=verify_input, input_ids=None,
                  out_cache_loc=None, seq_lens=torch.tensor([5, 9, 3, 4][:bs]),
                  seq_lens_cpu=None, seq_lens_sum=None,
                  req_pool_indices=torch.tensor([2, 0, 3, 1][:bs]), reqs=[object()] * bs,
                  has_grammar=False, return_logprob=False)
    fields.update(overrides)
    return NS(**fields)


@pytest.fixture
def stats() -> Iterator[plain_decode._Stats]:
    saved = plain_decode.STATS
    plain_decode.STATS = plain_decode._Stats()
    yield plain_decode.STATS
    plain_decode.STATS = saved


def test_a_depth_0_batch_decodes_on_the_reserved_slot_with_the_lengths_a_plain_decode_uses(
) -> None:
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode

    worker, batch = _worker(), _batch()
    verify_input, seq_lens = batch.spec_info, batch.seq_lens
    result = plain_decode.decode(worker, batch, _parts())
    assert result is not None
    [seen] = worker._target_worker.seen
    # the slot spec-v2 reserved for the token: req_to_token[request, spec-v2's length]
    slots = REQ_TO_TOKEN[torch.tensor([2, 0, 3]), torch.tensor([5, 9, 3])].to(torch.int64)
    assert torch.equal(seen["out_cache_loc"], slots)
    assert seen["forward_mode"] == ForwardMode.DECODE and seen["spec_info"] is None
    assert torch.equal(seen["input_ids"], verify_input.draft_token)
    assert torch.equal(seen["seq_lens"], seq_lens + 1)
    assert seen["capture_hidden_mode"] == CaptureHiddenMode.FULL
    plain = worker.__dict__[plain_decode._ATTR]
    assert seen["runner"] is plain.runner and seen["backend"] is plain.backend
    assert seen["attn_backend_at_init"] is plain.backend
    # the model runner is the verify's again
    mr = worker._target_worker.model_runner
    assert mr.decode_cuda_graph_runner is worker.verify_runner
    assert mr.attn_backend is worker.verify_backend
    # the batch as a one-token verify leaves it, for the draft extend and the hand-over
    assert batch.seq_lens is seq_lens and batch.spec_info is verify_input
    assert batch.forward_mode == ForwardMode.TARGET_VERIFY
    assert torch.equal(batch.out_cache_loc, slots)
    assert batch.input_ids is verify_input.draft_token
    # a one-token verify's result
    assert result.next_token_ids.tolist() == [8, 9, 10]
    assert result.accept_lens.tolist() == [1, 1, 1] and result.accept_lens.dtype == torch.int32
    assert result.new_seq_lens.tolist() == [6, 10, 4]
    assert result.speculative_num_draft_tokens == 1
    bonus = result.next_draft_input.bonus_tokens
    assert bonus.tolist() == [8, 9, 10] and bonus.dtype == torch.int32
    assert result.logits_output.hidden_states.shape == (3, 12)


def test_with_the_overlap_scheduler_the_bonus_tokens_stay_int64_and_lengths_are_one_tensor(
) -> None:
    """The overlap scheduler relays the bonus tokens through its int64 FutureMap buffer, so
    the sampler's int64 goes as it is; the lengths the forward counted are the lengths
    handed on."""
    worker, batch = _worker(), _batch(enable_overlap=True)
    seen_lens: list[Any] = []
    parts = _parts()
    inner = parts.forward_batch

    def forward_batch(batch: Any, model_runner: Any, **kw: Any) -> Any:
        seen_lens.append(batch.seq_lens)
        return inner(batch, model_runner, **kw)

    parts.forward_batch = forward_batch
    result = plain_decode.decode(worker, batch, parts)
    assert result is not None
    assert result.next_draft_input.bonus_tokens.dtype == torch.int64
    assert result.next_draft_input.bonus_tokens is result.next_token_ids
    assert result.new_seq_lens is seen_lens[0]
    assert result.new_seq_lens.tolist() == [6, 10, 4]


@pytest.mark.parametrize("overlap", [True, False])
def test_only_the_synchronous_scheduler_records_the_batchs_tensors_on_the_forward_stream(
    overlap: bool,
) -> None:
    """Under the overlap scheduler the batch's fields outlive the forward (the test below
    holds 0.5.17 to it), so the path makes none of the verify's records; the synchronous
    scheduler keeps SGLang's call."""
    recorded: list[tuple[Any, Any]] = []
    parts = _parts()
    parts.record_streams = lambda batch, verify_input: recorded.append((batch, verify_input))
    batch = _batch(enable_overlap=overlap)
    verify_input = batch.spec_info
    assert plain_decode.decode(_worker(), batch, parts) is not None
    assert recorded == ([] if overlap else [(batch, verify_input)])


def test_0517_overlap_scheduler_keeps_a_batchs_fields_until_two_forwards_later(
    sglang17_root: Path,
) -> None:
    """What lets the plain path drop the records: SGLang 0.5.17's `_forward_isolation` and
    `record_batch_in_overlap` (compiled from its source) pin every field the batch holds when
    its forward starts, and let go two forwards later, after the overlap loop has processed
    that forward's result (its copy-done event waited on). Here a batch's lengths, rebound
    during and after the forward as the scheduler does, stay alive through the next forward
    and are freed by the one after."""
    import dataclasses
    import gc
    import weakref

    isolation, record = sglang17_source.forward_isolation(sglang17_root)

    @dataclasses.dataclass
    class Batch:  # the ScheduleBatch fields these bodies and the plain path touch
        seq_lens: Any
        req_pool_indices: Any
        spec_info: Any = None
        sampling_info: Any = None
        spec_algorithm: Any = dataclasses.field(default_factory=lambda: NS(is_none=lambda: False))

    scheduler = NS(batch_record_buf=[None] * 2, batch_record_ct=0)
    scheduler.record_batch_in_overlap = lambda batch: record(scheduler, batch)
    batch = Batch(seq_lens=torch.tensor([5, 9]), req_pool_indices=torch.tensor([2, 0]))
    lengths = []
    for _ in range(3):
        lengths.append(weakref.ref(batch.seq_lens))
        with isolation(scheduler, batch, overlap=True):
            batch.seq_lens = batch.seq_lens + 1  # rebound mid-forward (restored at the exit)
        batch.seq_lens = batch.seq_lens + 1  # the next iteration's resolve rebinds it
        gc.collect()
    assert [ref() is not None for ref in lengths] == [False, True, True]


@pytest.mark.parametrize(("overlap", "skipped", "on_host"), [
    (True, True, True), (True, False, False), (False, True, False), (False, False, False),
])
def test_accept_lengths_stay_on_the_host_only_where_no_gpu_work_reads_them(
    monkeypatch: pytest.MonkeyPatch, overlap: bool, skipped: bool, on_host: bool,
) -> None:
    """Only the overlap scheduler with the extend skipped reads them on the host alone (its
    copy to the host is then none); a draft extend or the synchronous scheduler read them
    where the lengths are. `accept_ones` is wrapped to see the device asked for: the host by
    name, or the lengths' device (the two are the same CPU here, so the form tells them)."""
    asked: list[Any] = []
    real = plain_decode.accept_ones

    def accept_ones(bs: int, device: Any) -> Any:
        asked.append(device)
        return real(bs, device)

    monkeypatch.setattr(plain_decode, "accept_ones", accept_ones)
    batch = _batch(enable_overlap=overlap)
    plain_decode.decode(_worker(), batch, _parts(), extend_skipped=skipped)
    assert asked == (["cpu"] if on_host else [batch.seq_lens.device])
    assert isinstance(asked[0], str) is on_host


def test_accept_lengths_are_built_once_per_batch_size_and_device() -> None:
    a, b = plain_decode.accept_ones(3, "cpu"), plain_decode.accept_ones(3, "cpu")
    assert a is b and a.tolist() == [1, 1, 1] and a.dtype == torch.int32
    assert plain_decode.accept_ones(4, "cpu") is not a
    assert plain_decode.accept_ones(3, "meta").device.type == "meta"


def test_accept_lengths_on_the_host_move_to_the_device_and_others_stay() -> None:
    result = NS(accept_lens=torch.ones(3, dtype=torch.int32))
    plain_decode.accept_lens_to_device(result, torch.device("cpu"))
    host = result.accept_lens
    assert host.device.type == "cpu"
    plain_decode.accept_lens_to_device(result, "meta")
    assert result.accept_lens.device.type == "meta"
    plain_decode.accept_lens_to_device(NS(), "meta")  # no accept lengths: nothing to do


def test_host_lengths_when_the_backend_keeps_them_count_the_new_token() -> None:
    worker = _worker()
    batch = _batch(seq_lens_cpu=torch.tensor([5, 9, 3]), seq_lens_sum=17)
    captured: dict[str, Any] = {}
    parts = _parts()
    inner = parts.forward_batch

    def forward_batch(batch: Any, model_runner: Any, **kw: Any) -> Any:
        captured.update(cpu=batch.seq_lens_cpu.tolist(), total=batch.seq_lens_sum)
        return inner(batch, model_runner, **kw)

    parts.forward_batch = forward_batch
    plain_decode.decode(worker, batch, parts)
    assert captured == {"cpu": [6, 10, 4], "total": 20}
    assert batch.seq_lens_cpu.tolist() == [5, 9, 3] and batch.seq_lens_sum == 17


def test_the_result_goes_through_sglangs_result_processing_as_one_token_per_request(
    runtime: Any,
) -> None:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.managers.scheduler_components.batch_result_processor import (
        SchedulerBatchResultProcessor,
    )
    from sglang.srt.sampling.sampling_params import SamplingParams

    reqs = []
    for rid in "abc":
        req = Req(rid, "hi", [1, 2, 3], SamplingParams(max_new_tokens=64))
        if getattr(req, "kv", None) is None:
            req.kv = NS(kv_committed_len=3, kv_allocated_len=8)
        reqs.append(req)
    result = plain_decode.decode(_worker(), _batch(), _parts())
    assert result is not None
    feedback: list[Any] = []
    fake = NS(metrics_reporter=NS(snapshot_spec_decode_metrics=lambda batch, result: None),
              model_worker=NS(on_verify_complete_cpu=lambda *a, **k: feedback.append(a)))
    fake.advance_grammar_fsm = lambda result, batch: \
        SchedulerBatchResultProcessor.advance_grammar_fsm(fake, result, batch)
    sglang_body = SchedulerBatchResultProcessor._resolve_spec_v2_tokens
    while hasattr(sglang_body, "__wrapped__"):  # SGLang's own body, as a grammar batch gets
        sglang_body = sglang_body.__wrapped__
    runs = sglang_body(fake, result, NS(reqs=reqs, has_grammar=False))
    assert runs == [[8], [9], [10]]
    assert result.num_correct_drafts == 0
    assert feedback and list(feedback[0][0]) == [0, 0, 0]  # SGLang's adaptive feedback


def _resolve_0517(root: Path) -> Any:
    """SGLang 0.5.17's `SchedulerBatchResultProcessor._resolve_spec_v2_tokens`, compiled alone
    from its source."""
    # annotations unevaluated, as its module compiles it (`from __future__ import annotations`)
    return sglang17_source.compiled(
        root, "srt/managers/scheduler_components/batch_result_processor.py",
        "_resolve_spec_v2_tokens", "SchedulerBatchResultProcessor", {})


def _reqs_0517(finished: set[int], retracted: set[int], n: int = 5) -> list[Any]:
    """Real Reqs with 0.5.17's committed-length attribute, some finished or retracted, and
    histograms at different stages (empty, with zeros, with accepted drafts)."""
    from sglang.srt.managers.schedule_batch import FINISH_LENGTH, Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    reqs = []
    for i in range(n):
        req = Req(f"r{i}", "hi", [1, 2, 3], SamplingParams(max_new_tokens=64))
        req.kv_committed_len = 40 + i
        req.spec_verify_ct = 3 * i
        req.spec_num_correct_drafts = i
        req.spec_correct_drafts_histogram = [[], [2], [1, 4, 0, 1]][i % 3][:]
        if i in finished:
            req.finished_reason = FINISH_LENGTH(length=64)
        req.is_retracted = i in retracted
        reqs.append(req)
    return reqs


def _req_state(reqs: list[Any]) -> list[tuple[Any, ...]]:
    return [(r.kv_committed_len, r.spec_verify_ct, r.spec_num_correct_drafts,
             list(r.spec_correct_drafts_histogram)) for r in reqs]


def _plain_result(n: int) -> Any:
    """A plain decode's result as the scheduler processes it (after its copy to the host)."""
    worker = _worker()
    worker.req_to_token_pool = NS(req_to_token=torch.arange(8 * 64, dtype=torch.int32)
                                  .reshape(8, 64))
    batch = _batch(enable_overlap=True)
    batch.spec_info = NS(draft_token=torch.arange(100, 100 + n), draft_token_num=1)
    batch.seq_lens = torch.arange(10, 10 + n)
    batch.req_pool_indices = torch.arange(n)
    batch.reqs = [object()] * n
    result = plain_decode.decode(worker, batch, _parts(), extend_skipped=True)
    assert result is not None
    result.next_token_ids = result.next_token_ids.cpu()
    return result


@pytest.mark.parametrize(("finished", "retracted"), [(set(), set()), ({1, 4}, {2})])
def test_the_one_pass_result_processing_equals_sglangs_0517_body(
    sglang17_root: Path, finished: set[int], retracted: set[int],
) -> None:
    resolve_0517 = _resolve_0517(sglang17_root)
    outcomes = []
    for settle in ("sglang", "plain"):
        reqs = _reqs_0517(finished, retracted)
        result = _plain_result(len(reqs))
        feedback: list[Any] = []

        def adaptive(d: list[int], batch_size: int, feedback: list[Any] = feedback) -> None:
            feedback.append((list(d), batch_size))

        processor = NS(model_worker=NS(on_verify_complete_cpu=adaptive))
        processor.advance_grammar_fsm = lambda result, batch: None  # no grammar in the batch
        batch = NS(reqs=reqs, has_grammar=False)
        assert plain_decode.plain_result(result, batch)
        if settle == "sglang":
            runs = resolve_0517(processor, result, batch)
        else:
            runs, rows = plain_decode.resolve_tokens(processor, result, batch)
            assert rows == 5 - len(finished | retracted)  # the rows SGLang emits
            assert hooks.emitted(reqs, runs) == (rows, rows)
        outcomes.append((runs, _req_state(reqs), feedback, result.num_correct_drafts,
                         list(result.num_correct_drafts_per_req_cpu),
                         result.num_block_accept_tokens, result.num_cap_tokens))
    assert outcomes[0] == outcomes[1]
    runs, state = outcomes[1][:2]
    assert runs == [[101], [102], [103], [104], [105]]
    settled = [i for i in range(5) if i not in finished | retracted]
    assert [state[i][0] for i in settled] == [40 + i + 1 for i in settled]


@pytest.mark.parametrize(("marked", "grammar", "plain"), [
    (True, False, True), (True, True, False), (False, False, False),
])
def test_which_results_the_one_pass_settles(marked: bool, grammar: bool, plain: bool) -> None:
    result = _plain_result(3)
    if not marked:
        del result.specctl_plain
    assert plain_decode.plain_result(result, NS(has_grammar=grammar)) is plain


def test_the_result_hook_settles_plain_results_itself_and_counts_both_kinds(
    runtime: Any, stats: plain_decode._Stats,
) -> None:
    """The AROUND hook on `_resolve_spec_v2_tokens`: SGLang's body (here a recorder standing in
    for it) runs for every result but a plain decode's, and each is counted at its depth."""
    runtime.activate({0, 1, 3}, None)
    called: list[Any] = []

    def sglang_body(processor: Any, result: Any, batch: Any) -> Any:
        called.append(result)
        return [[7]] * len(batch.reqs)

    processor = NS(model_worker=NS(on_verify_complete_cpu=lambda d, batch_size: None))
    reqs = _reqs_0517(set(), set(), n=3)
    plain = _plain_result(3)
    plain.specctl_launch = (False, None)
    runs = hooks.count_result(sglang_body, processor, plain, NS(reqs=reqs, has_grammar=False))
    assert runs == [[101], [102], [103]] and called == []
    grammar = _plain_result(3)
    grammar.specctl_launch = (False, None)
    hooks.count_result(sglang_body, processor, grammar, NS(reqs=reqs, has_grammar=True))
    assert called == [grammar]
    assert stats.settled == 1 and plain_decode.state_report()["settled"] == 1
    from sglang_hooks.contract import bs_bucket

    assert runtime.counters.pending[(0, bs_bucket(3))][0] == 2  # two depth-0 iterations


def test_a_settled_result_is_counted_as_a_count_of_sglangs_return_would_count_it(
    runtime: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The one pass hands the per-depth count its rows, so the count makes no second pass
    over the requests: the same depth, rows, tokens and unemitted rows as when SGLang's body
    (a recorder returning one token a row) settles the same result."""
    runtime.activate({0, 1, 3}, None)
    recorded: list[tuple[int, int, int]] = []
    monkeypatch.setattr(runtime, "record_result",
                        lambda depth, rows, tokens, launch: recorded.append((depth, rows, tokens)))
    passes: list[int] = []
    real_emitted = hooks.emitted

    def emitted(reqs: Any, runs: Any) -> Any:
        passes.append(len(reqs))
        return real_emitted(reqs, runs)

    monkeypatch.setattr(hooks, "emitted", emitted)
    processor = NS(model_worker=NS(on_verify_complete_cpu=lambda d, batch_size: None))
    settled_by: list[str] = []
    for settle in ("plain", "sglang"):
        reqs = _reqs_0517({1}, {3})
        result = _plain_result(len(reqs))
        if settle == "sglang":
            result.specctl_plain = False  # not one of the path's: the hook leaves it to the body

        def body(processor: Any, result: Any, batch: Any, settle: str = settle) -> Any:
            settled_by.append(settle)
            return [[7]] * len(batch.reqs)

        hooks.count_result(body, processor, result, NS(reqs=reqs, has_grammar=False))
    assert settled_by == ["sglang"] and passes == [5]  # a pass for SGLang's return only
    assert recorded == [(0, 3, 3), (0, 3, 3)]
    assert runtime.unemitted_rows == 4


def test_a_failing_read_leaves_the_result_to_sglangs_body_with_nothing_changed(
    runtime: Any,
) -> None:
    runtime.activate({0, 1, 3}, None)
    reqs = _reqs_0517(set(), set(), n=3)
    del reqs[2].spec_correct_drafts_histogram  # unreadable: nothing may change before
    before = [(r.kv_committed_len, r.spec_verify_ct) for r in reqs]
    feedback: list[Any] = []
    processor = NS(model_worker=NS(on_verify_complete_cpu=lambda *a, **k: feedback.append(a)))
    called: list[Any] = []

    def sglang_body(processor: Any, result: Any, batch: Any) -> list[list[int]]:
        called.append(result)
        return [[1]] * 3

    hooks.count_result(sglang_body, processor, _plain_result(3),
                       NS(reqs=reqs, has_grammar=False))
    assert len(called) == 1 and feedback == []
    assert [(r.kv_committed_len, r.spec_verify_ct) for r in reqs] == before


def test_no_graph_for_the_batch_size_leaves_the_batch_and_the_runner_untouched() -> None:
    worker, batch = _worker(bs_limit=2), _batch()
    before = dict(batch.__dict__)
    assert plain_decode.decode(worker, batch, _parts()) is None
    assert batch.__dict__ == before
    assert worker._target_worker.seen == []
    assert worker._target_worker.model_runner.decode_cuda_graph_runner is worker.verify_runner


def test_a_failed_forward_restores_the_batch_and_the_runner() -> None:
    worker, batch = _worker(fail=True), _batch()
    before = dict(batch.__dict__)
    with pytest.raises(RuntimeError, match="replay failed"):
        plain_decode.decode(worker, batch, _parts())
    assert batch.__dict__ == before
    mr = worker._target_worker.model_runner
    assert mr.decode_cuda_graph_runner is worker.verify_runner
    assert mr.attn_backend is worker.verify_backend


@pytest.mark.parametrize(("overrides", "worker_kw", "reason"), [
    ({}, {"steps": 2}, plain_decode.NOT_DEPTH_0),
    ({"has_grammar": True}, {}, "a grammar-constrained request"),
    ({"return_logprob": True}, {}, "a request asking for logprobs"),
    ({"spec_info": NS(draft_token=torch.tensor([1]), draft_token_num=4)}, {},
     "not a one-token verify"),
    ({}, {}, None),
])
def test_which_batches_keep_the_verify(overrides: dict[str, Any], worker_kw: dict[str, Any],
                                       reason: str | None) -> None:
    assert plain_decode.batch_reason(_worker(**worker_kw), _batch(**overrides)) == reason


def test_an_idle_batch_keeps_the_verify() -> None:
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    batch = _batch(forward_mode=ForwardMode.IDLE)
    assert plain_decode.batch_reason(_worker(), batch) == "an idle batch"


def _verify(worker: Any, batch: Any) -> Any:
    return ("verify", batch)


def test_the_hook_counts_plain_decodes_and_sends_the_rest_to_the_verify(
    stats: plain_decode._Stats, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(plain_decode, "_PARTS", _parts())
    worker = _worker(bs_limit=2)
    assert hooks.plain_decode_verify(_verify, worker, _batch(bs=2)).accept_lens.tolist() == [1, 1]
    assert hooks.plain_decode_verify(_verify, worker, _batch(bs=3))[0] == "verify"
    assert hooks.plain_decode_verify(_verify, worker, _batch(has_grammar=True))[0] == "verify"
    worker.speculative_num_steps = 3
    assert hooks.plain_decode_verify(_verify, worker, _batch(bs=2))[0] == "verify"
    assert (stats.launches, stats.fallbacks) == (1, 2)  # a positive depth is not a fallback
    assert stats.last_fallback == "a grammar-constrained request"


def test_a_batch_sent_to_the_verify_after_all_gets_the_mask_and_positions_it_reads(
    stats: plain_decode._Stats, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A verify input built for the path without its mask fill and positions (lean_host.py)
    is finished before SGLang's verify runs it: here for a batch size with no DECODE graph."""
    from sglang_hooks import lean_host

    monkeypatch.setattr(plain_decode, "_PARTS", _parts())
    batch = _batch(bs=3)
    mask = torch.zeros(8, dtype=torch.bool)
    batch.spec_info.custom_mask, batch.spec_info.positions = mask, None
    batch.spec_info.__dict__[lean_host._UNFINISHED] = True
    seen: list[tuple[Any, Any]] = []

    def verify(worker: Any, batch: Any) -> Any:
        seen.append((batch.spec_info.positions, batch.spec_info.custom_mask.clone()))
        return "verified"

    assert hooks.plain_decode_verify(verify, _worker(bs_limit=2), batch) == "verified"
    positions, mask_seen = seen[0]
    assert positions.dtype == torch.int64 and positions.tolist() == [5, 9, 3]
    assert bool(mask_seen.all()) and not lean_host.unfinished(batch.spec_info)
    assert stats.fallbacks == 1


def test_a_failing_plain_decode_turns_the_path_off_for_that_worker(
    stats: plain_decode._Stats, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(plain_decode, "_PARTS", _parts())
    worker = _worker(fail=True)
    batch = _batch()
    assert hooks.plain_decode_verify(_verify, worker, batch) == ("verify", batch)
    assert batch.forward_mode.is_decode() and batch.seq_lens.tolist() == [5, 9, 3]
    worker._target_worker.fail = False
    assert hooks.plain_decode_verify(_verify, worker, _batch())[0] == "verify"
    assert len(worker._target_worker.seen) == 1  # not tried again
    report = plain_decode.state_report()
    assert report["runners"] == 0 and report["launches"] == 0
    assert "a plain decode failed: replay failed" in str(
        worker.__dict__[plain_decode._ATTR].reason)


# ----------------------------------------------------------------------------- start-up


class ModelRunner:
    def __init__(self, **server: Any) -> None:
        self.server_args = NS(**server)
        self.attn_backend = NS(fa_impl_ver=3, use_mla=False)
        self.init_new_workspace = False
        self.backends: list[Any] = []

    def _get_attention_backend(self, init_new_workspace: bool = False) -> Any:
        self.init_new_workspace = init_new_workspace  # as SGLang's backend factory leaves it
        backend = NS(new_workspace=init_new_workspace, spec=dict(SPEC))
        self.backends.append(backend)
        return backend


SPEC = {"steps": 3, "draft_tokens": 4}


def _start_worker(topk: int = 1, **server: Any) -> Any:
    worker = NS(topk=topk, _target_worker=NS(model_runner=ModelRunner(**server)))

    @contextlib.contextmanager
    def override(steps: int, draft_tokens: int) -> Iterator[None]:
        saved = dict(SPEC)
        SPEC.update(steps=steps, draft_tokens=draft_tokens)
        try:
            yield
        finally:
            SPEC.update(saved)

    worker._override_worker_state = override
    return worker


def test_the_runner_is_built_once_on_a_fresh_backend_sized_for_one_token(
    stats: plain_decode._Stats,
) -> None:
    made: list[dict[str, Any]] = []

    def make_runner(model_runner: Any, **kw: Any) -> Any:
        made.append({**kw, "spec": dict(SPEC)})
        return NS(kind="runner")

    worker = _start_worker()
    ticks = iter([10.0, 12.5])
    free = iter([40.0, 38.75])
    plain = plain_decode.build(worker, make_runner=make_runner, clock=lambda: next(ticks),
                               gpu_free_gb=lambda: next(free))
    mr = worker._target_worker.model_runner
    [backend] = mr.backends
    assert backend.new_workspace and backend.spec == {"steps": 0, "draft_tokens": 1}
    assert mr.init_new_workspace is False and SPEC == {"steps": 3, "draft_tokens": 4}
    assert made == [{"attn_backend": backend, "speculative_num_steps": 0,
                     "speculative_num_draft_tokens": 1, "spec": {"steps": 0, "draft_tokens": 1}}]
    assert plain.runner.kind == "runner" and plain.reason is None
    assert (plain.build_s, plain.memory_gb) == (2.5, 1.25)
    assert plain_decode.build(worker, make_runner=make_runner) is plain and len(made) == 1
    report = plain_decode.state_report()
    assert (report["runners"], report["build_s"], report["memory_gb"]) == (1, 2.5, 1.25)


@pytest.mark.parametrize(("topk", "server", "backend", "reason"), [
    (4, {}, {}, "top-k above 1 (tree verify)"),
    (1, {}, {"fa_impl_ver": 4}, "the target's attention backend is not FlashAttention 3"),
    (1, {"enable_dp_attention": True}, {}, "DP attention"),
    (1, {"disable_cuda_graph": True}, {}, "CUDA graphs are off"),
    (1, {"pp_size": 2}, {}, "pipeline parallelism"),
])
def test_servers_the_path_does_not_cover_keep_the_verify_and_say_why(
    stats: plain_decode._Stats, topk: int, server: dict[str, Any], backend: dict[str, Any],
    reason: str,
) -> None:
    worker = _start_worker(topk, **server)
    worker._target_worker.model_runner.attn_backend.__dict__.update(backend)
    plain = plain_decode.build(worker, make_runner=lambda *a, **k: pytest.fail("built"))
    assert plain.runner is None and plain.reason == reason
    assert plain_decode.state_report()["unbuilt_reasons"] == [reason]
    assert plain_decode.batch_reason(worker, _batch()) == plain_decode.NOT_DEPTH_0


def test_a_failed_capture_leaves_depth_0_on_the_verify(stats: plain_decode._Stats) -> None:
    worker = _start_worker()
    worker.device = "cpu"

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("out of memory")

    plain_decode.runner_class()  # the real class exists; the hook builds with it
    saved = plain_decode._RUNNER_CLASS
    plain_decode._RUNNER_CLASS = broken
    try:
        assert hooks.plain_decode_build("ret", worker) == "ret"
    finally:
        plain_decode._RUNNER_CLASS = saved
    plain = worker.__dict__[plain_decode._ATTR]
    assert "capturing the DECODE graphs failed: out of memory" in str(plain.reason)
    assert plain_decode.batch_reason(worker, _batch()) == plain_decode.NOT_DEPTH_0
    assert SPEC == {"steps": 3, "draft_tokens": 4}  # the override was undone


@pytest.mark.parametrize("feature", ["plain-decode", "host-trims"])
def test_the_hooks_are_registered_on_0517s_off_path_only(feature: str) -> None:
    """This path's hooks (and the host-work trims' of lean_host.py): registered on 0.5.17's
    off path, not on 0.5.23's nor with SPECCTL_OFF_PATH=sglang; the adapter's other hooks
    registered either way."""
    from sglang_hooks import plugin, settings
    from sglang_hooks.adapters import v0_5_17, v0_5_23

    names = {spec.hook for spec in v0_5_17.ADAPTER.hooks if spec.feature == feature}
    assert names and all(callable(getattr(hooks, name)) for name in names)
    ours = {spec.hook for spec in plugin.wanted_hooks(v0_5_17.ADAPTER, settings.SPECCTL)}
    sglangs = {spec.hook for spec in plugin.wanted_hooks(v0_5_17.ADAPTER, settings.SGLANG)}
    assert names <= ours and not names & sglangs and sglangs < ours
    assert not names & {s.hook for s in plugin.wanted_hooks(v0_5_23.ADAPTER, settings.SPECCTL)}


@pytest.mark.parametrize("release", ["0.5.17", "0.5.23", "fallback"])
def test_tp_ranks_compare_the_off_path_before_a_table_steers(
    release: str, runtime: Any, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A rank on the plain path samples where its peers verify: the ranks must agree on what
    depth 0 runs. The peer check is a recorder here (test_real_peers.py runs the real one)."""
    from sglang_hooks import settings
    from sglang_hooks.adapters import v0_5_17, v0_5_23

    published: list[str] = []

    class Peers:
        world_size = 2

        def publish(self, mine: str) -> None:
            published.append(mine)

    path, features = {"0.5.17": (settings.SPECCTL, v0_5_17.ADAPTER.off_path),
                      "0.5.23": (settings.SPECCTL, v0_5_23.ADAPTER.off_path),
                      "fallback": (settings.SGLANG, frozenset())}[release]
    monkeypatch.setattr(hooks, "OFF_PATH", path)
    monkeypatch.setattr(hooks, "FEATURES", features)
    monkeypatch.setattr(hooks, "default_peer_check", lambda: Peers())
    params = NS(candidate_steps=[0, 3], cuda_graph_bs_for_step=lambda step: [1, 2])
    controller = NS(params=params, worker=NS(speculative_num_steps=3))
    hooks.on_states_built(None, controller, [1, 2])
    [mine] = published
    assert f'"off_path":"{path}"' in mine
    assert f'"off_path_features":{json.dumps(sorted(features), separators=(",", ":"))}' in mine
    assert '"SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND":""' in mine
    assert runtime.features == features and runtime.plain_decode_path is (release == "0.5.17")


def test_the_simulator_reports_the_same_plain_decode_fields_as_the_plugin() -> None:
    """The simulator's /server_info speaks the plugin's language: the same keys, one runner
    where the profile has the plain decode path (the seeded built-in, as `specctl serve` runs
    SGLang 0.5.17) and none where it runs depth 0 through the verify, so tools that read one
    read the other."""
    from sims.profile import load_profile
    from sims.server import SimulatedServer
    from sims.workload import Workload

    for name, runners in (("h200-sglang-llama8b-seeded", 1), ("h200-llama8b-eagle3", 0)):
        server = SimulatedServer(load_profile(name), Workload.closed(1))
        simulated = server.specctl_state()["plain_decode"]
        assert set(simulated) == set(plain_decode.state_report())
        assert simulated["runners"] == runners
        assert simulated["light_inputs"] == 0


# ----------------------------------------------------------------------------- fence at the replay


def test_0517_decode_graphs_publish_their_read_done_event_before_replaying(
    sglang17_root: Path,
) -> None:
    """What the fence at the replay hands over (fence.py): 0.5.17's graph runner records
    the model runner's read-done event before its replay for a DECODE batch, and after it only
    for a breakable verify."""
    replay = _method(sglang17_root, "execute")
    source = ast.unparse(replay)
    assert "publish_read_done = forward_batch.forward_mode.is_decode() or" in source
    post = next(n for n in ast.walk(replay) if isinstance(n, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "read_done_post_replay"
                        for t in n.targets))
    assert "is_target_verify()" in ast.unparse(post.value)
    publishes = _assigned(replay, "war_fastpath_read_done_event")
    replays = [n.lineno for n in ast.walk(replay) if isinstance(n, ast.Call)
               and isinstance(n.func, ast.Attribute) and n.func.attr == "replay"
               and ast.unparse(n.func.value) == "self.backend"]
    assert len(publishes) == 2 and len(replays) == 1
    assert min(publishes) < replays[0] < max(publishes)


class PublishingTargetWorker(TargetWorker):
    """Its forward publishes a read-done event on the model runner, as 0.5.17's DECODE graph
    runner does before it replays; `publish=False`: a forward that publishes none."""

    def __init__(self, model_runner: Any, publish: bool = True) -> None:
        super().__init__(model_runner)
        self.publish = publish
        self.events: list[object] = []

    def forward_batch_generation(self, batch: Any, forward_batch: Any = None) -> Any:
        if self.publish:
            self.events.append(object())
            self.model_runner.war_fastpath_read_done_event = self.events[-1]
        return super().forward_batch_generation(batch, forward_batch)


@pytest.mark.parametrize("publish", [True, False])
def test_a_plain_decode_keeps_the_event_its_own_replay_published(publish: bool) -> None:
    from sglang_hooks import fence

    worker = _worker()
    mr = worker._target_worker.model_runner
    mr.war_fastpath_read_done_event = "an earlier forward's"
    worker._target_worker = PublishingTargetWorker(mr, publish)
    result = plain_decode.decode(worker, _batch(enable_overlap=True), _parts())
    assert result is not None
    kept = getattr(result, fence.REPLAY_EVENT)
    assert kept is (worker._target_worker.events[0] if publish else None)


def test_a_runner_without_the_event_leaves_the_result_without_one() -> None:
    from sglang_hooks import fence

    result = plain_decode.decode(_worker(), _batch(), _parts())
    assert result is not None and not hasattr(result, fence.REPLAY_EVENT)
