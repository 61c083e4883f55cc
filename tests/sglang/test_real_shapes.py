"""Draft shapes inside one server (sglang_hooks/shapes.py) and the hooks that capture, switch
and narrow them (hooks.shapes_build, shape_switch, shape_draft), on the CPU.

Real: SGLang's `EAGLEWorkerV2._override_worker_state` and
`EagleDraftWorkerBase._rebuild_topk1_chain_buffers`, called through SGLang 0.5.23's classes on
stand-in workers (the first test checks that their bodies are 0.5.17's, the release shapes run
on, word for word); the real `RuntimeContext` with a published `ServerArgs` (its spec and exec
bags, which both methods read and write); `eagle_worker_v2`'s speculative MoE contexts, which
a capture enters; `fast_topk`; `EagleDraftInput`; `maybe_create_verify_mask` / `VerifyMask`
(the mask mode a target backend is built with); `SchedulerBatchResultProcessor.
_resolve_spec_v2_tokens` and `GenerationBatchResult` for the counts; the plugin's contract,
runtime, settings, adapters and hooks; torch.distributed's `TCPStore` for the TP ranks' check
(its section says what stands in for the ranks).

Stand-ins, because no attention backend, CUDA graph or model can be built on a CPU: the
speculative worker, its draft worker and their model runners (`SpecWorker`, `DraftWorker`,
`DraftRunner`, `ModelRunner`), carrying exactly the attributes shapes.py reads and writes;
their `init_attention_backend`, `_capture_cuda_graphs` and `_get_attention_backend` build
marker objects that record the top-k the start-up record held when they were built (what
FlashAttention 3 and the graph runners read in 0.5.17), and the target backend a real
`VerifyMask`, read only at top-k > 1 as FA3 builds it; the start-up records (`Record`, 0.5.17's
read-only `ServerArgs` with its `override(source, **fields)`, each call recorded; `PlainRecord`,
set by attribute); and SGLang's `DecodeCudaGraphRunner`, replaced by a recorder where a capture
asks for target graphs.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import json
import logging
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any

import pytest
import torch

from sglang_hooks import hooks, plugin, settings, shapes
from sglang_hooks.adapters import v0_5_17, v0_5_23
from sglang_hooks.adapters.base import SHAPE_CAPTURE_SOURCE, TOPK_FIELD
from sglang_hooks.contract import (
    PolicyError,
    PolicyTable,
    Tier,
    TierSelector,
    encode_table,
    shape_tier,
)
from sglang_hooks.draft_shape import DraftShape, Shape, chain, parse_shapes
from sglang_hooks.gpu_timer import HostIntervalTimer
from sglang_hooks.peers import SHAPES_FIX, SHAPES_STAKE, PeerCheck
from sglang_hooks.runtime import SchedulerRuntime, exploration_rng
from sglang_hooks.shapes import ShapeRegistry, ShapeSetupError, ShapeState

STARTUP = DraftShape(3, 4, 16)  # the tree the server starts at: it dominates the others
CHAIN = DraftShape(3, 1, 4)
NARROW = DraftShape(3, 2, 8)  # a tree of top-k 2: its draft reads 2 of the 4 columns
MAX_RUNNING = 8  # max_running_requests of the published ServerArgs: the chain buffers' rows
WORKER_MODULE = "sglang.srt.speculative.eagle_worker_v2"
SHAPE_HOOKS = {"shapes_build", "shape_switch", "shape_draft"}
BUILD = v0_5_17.SHAPE_BUILD  # how 0.5.17 builds a shape: its start-up records hold top-k


# ----------------------------------------------------------------------------- stand-ins


class Record:
    """0.5.17's start-up record: read-only, changed only through `override(source,
    **fields)`, whose calls are recorded here."""

    calls: list[tuple[str, dict[str, Any]]]
    speculative_eagle_topk: int

    def __init__(self, topk: int) -> None:
        object.__setattr__(self, "calls", [])
        object.__setattr__(self, "speculative_eagle_topk", topk)

    def override(self, source: str, **fields: Any) -> None:
        self.calls.append((source, dict(fields)))
        for name, value in fields.items():
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{name}: the start-up record is read-only; use override()")


class PlainRecord:
    """A start-up record without `override`: shapes.py sets its top-k by attribute."""

    def __init__(self, topk: int) -> None:
        self.speculative_eagle_topk = topk


@dataclass(eq=False)
class Built:
    """A backend or graph runner: what it is and the shape it was built for (top-k as the
    start-up record held it at the time: what FA3 and the graph runners read)."""

    what: str
    steps: int
    topk: int
    draft_tokens: int


@dataclass(eq=False)
class TargetBackend:
    topk: int
    verify_mask: Any
    fa_impl_ver: int = 3


def _verify_mask(read: bool) -> Any:
    """SGLang's own mask, in the mode FA3 builds it: `is_read=self.topk > 1`."""
    from sglang.srt.layers.attention.verify_mask import maybe_create_verify_mask

    return maybe_create_verify_mask(is_draft_runner=False, skip_prefill=False, max_bs=2,
                                    max_context_len=8, num_draft_tokens=4, device="cpu",
                                    is_read=read)


class DraftRunner:
    def __init__(self, record: Any) -> None:
        self.server_args = record
        self.tp_group = object()
        self.draft_attn_backend: Any = None
        self.attn_backend: Any = None


class DraftWorker:
    """EagleDraftWorker's attributes; its builders read top-k from the start-up records."""

    def __init__(self, shape: DraftShape, record: Any, runner_record: Any) -> None:
        self.topk = shape.topk
        self.speculative_num_steps = shape.steps
        self.speculative_num_draft_tokens = shape.draft_tokens
        self.server_args = record
        self.device = "cpu"
        self.draft_runner = DraftRunner(runner_record)
        self.tp_contexts: list[Any] = []
        self.draft_attn_backend: Any = None
        self.draft_extend_attn_backend: Any = None
        self.cuda_graph_runner: Any = None
        self.cuda_graph_runner_for_draft_extend: Any = None
        self.init_attention_backend()
        self._capture_cuda_graphs()
        self._rebuild_topk1_chain_buffers()

    def _built(self, what: str, record: Any) -> Built:
        return Built(what, self.speculative_num_steps, record.speculative_eagle_topk,
                     self.speculative_num_draft_tokens)

    def draft_tp_context(self, group: Any) -> contextlib.AbstractContextManager[None]:
        self.tp_contexts.append(group)
        return contextlib.nullcontext()

    def init_attention_backend(self) -> None:
        runner = self.draft_runner
        self.draft_attn_backend = runner.draft_attn_backend = self._built(
            "draft decode", runner.server_args)
        self.draft_extend_attn_backend = runner.attn_backend = self._built(
            "draft extend", runner.server_args)

    def _capture_cuda_graphs(self) -> None:
        self.cuda_graph_runner = self._built("draft graphs", self.server_args)
        self.cuda_graph_runner_for_draft_extend = None  # 0.5.17 runs FA3's draft extend eagerly

    def _rebuild_topk1_chain_buffers(self) -> None:
        from sglang.srt.speculative.base_spec_worker import EagleDraftWorkerBase

        EagleDraftWorkerBase._rebuild_topk1_chain_buffers(self)


class ModelRunner:
    """The target's model runner: its backend reads top-k from its start-up record."""

    def __init__(self, record: Any, steps: int, draft_tokens: int) -> None:
        self.server_args = record
        self.init_new_workspace = False
        self.workspaces: list[bool] = []
        self.attn_backend: Any = self._get_attention_backend()
        self.decode_cuda_graph_runner: Any = Built("target graphs", steps,
                                                   record.speculative_eagle_topk, draft_tokens)

    def _get_attention_backend(self, init_new_workspace: bool = False) -> TargetBackend:
        self.workspaces.append(init_new_workspace)
        self.init_new_workspace = init_new_workspace  # left set, as SGLang's builder leaves it
        topk = self.server_args.speculative_eagle_topk
        return TargetBackend(topk, _verify_mask(topk > 1))


class SpecWorker:
    """EAGLEWorkerV2's attributes. Its module is SGLang's, where a capture finds the
    speculative MoE contexts (and the graph runner class) it enters."""

    __module__ = WORKER_MODULE

    def __init__(self, shape: DraftShape = STARTUP, runner: type[ModelRunner] = ModelRunner
                 ) -> None:
        record, runner_record = Record(shape.topk), PlainRecord(shape.topk)
        self.topk = shape.topk
        self.speculative_num_steps = shape.steps
        self.speculative_num_draft_tokens = shape.draft_tokens
        self.server_args = record
        self.adaptive_controller = None
        self.device = "cpu"
        self.gpu_id = 0
        self._draft_worker = DraftWorker(shape, record, runner_record)
        self._target_worker = NS(model_runner=runner(runner_record, shape.steps,
                                                     shape.draft_tokens))

    def _override_worker_state(self, steps: int, draft_tokens: int,
                               cuda_graph_bs: list[int] | None = None
                               ) -> contextlib.AbstractContextManager[None]:
        from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

        return EAGLEWorkerV2._override_worker_state(  # type: ignore[no-any-return]
            self, steps, draft_tokens, cuda_graph_bs)


class StartupTopkRunner(ModelRunner):
    """A target backend that reads top-k where the capture's override does not reach: it is
    built at the start-up top-k whatever the shape."""

    def _get_attention_backend(self, init_new_workspace: bool = False) -> TargetBackend:
        return TargetBackend(STARTUP.topk, _verify_mask(True))


class GraphRunnerRecorder:
    """Stands in for SGLang's DecodeCudaGraphRunner (a capture needs CUDA): records how it was
    built and the top-k the start-up record held then (its `get_spec_info` reads it)."""

    def __init__(self, model_runner: Any, *, attn_backend: Any, speculative_num_steps: int,
                 speculative_num_draft_tokens: int) -> None:
        self.model_runner = model_runner
        self.attn_backend = attn_backend
        self.widths = (speculative_num_steps, speculative_num_draft_tokens)
        self.record_topk = model_runner.server_args.speculative_eagle_topk


def _records(worker: SpecWorker) -> tuple[Record, PlainRecord]:
    runner_record = worker._target_worker.model_runner.server_args
    assert worker._draft_worker.draft_runner.server_args is runner_record
    return worker.server_args, runner_record


def _live(worker: SpecWorker) -> dict[str, Any]:
    """What runs now: numbers as they are, objects by identity."""
    dw, runner = worker._draft_worker, worker._target_worker.model_runner
    return {
        "worker topk": worker.topk, "draft topk": dw.topk,
        "steps": (worker.speculative_num_steps, dw.speculative_num_steps),
        "draft tokens": (worker.speculative_num_draft_tokens, dw.speculative_num_draft_tokens),
        "draft_attn_backend": id(dw.draft_attn_backend),
        "draft_runner.draft_attn_backend": id(dw.draft_runner.draft_attn_backend),
        "cuda_graph_runner": id(dw.cuda_graph_runner),
        "draft_extend_attn_backend": id(dw.draft_extend_attn_backend),
        "draft_runner.attn_backend": id(dw.draft_runner.attn_backend),
        "cuda_graph_runner_for_draft_extend": id(dw.cuda_graph_runner_for_draft_extend),
        "chain buffers": (id(dw.__dict__.get("_topk1_parents_prealloc")),
                          id(dw.__dict__.get("_topk1_score_indices_prealloc"))),
        "model_runner.attn_backend": id(runner.attn_backend),
        "model_runner.decode_cuda_graph_runner": id(runner.decode_cuda_graph_runner),
    }


def _expected(state: ShapeState, draft_topk: int, runner_extend: Any,
              buffers: tuple[Any, Any]) -> dict[str, Any]:
    """`_live` of a worker running `state` (the draft worker's top-k, the draft runner's
    extend backend and the chain buffers are not all the state's: given)."""
    s = state.shape
    return {
        "worker topk": s.topk, "draft topk": draft_topk,
        "steps": (s.steps, s.steps), "draft tokens": (s.draft_tokens, s.draft_tokens),
        "draft_attn_backend": id(state.draft_attn_backend),
        "draft_runner.draft_attn_backend": id(state.draft_attn_backend),
        "cuda_graph_runner": id(state.cuda_graph_runner),
        "draft_extend_attn_backend": id(state.draft_extend_attn_backend),
        "draft_runner.attn_backend": id(runner_extend),
        "cuda_graph_runner_for_draft_extend": id(state.cuda_graph_runner_for_draft_extend),
        "chain buffers": (id(buffers[0]), id(buffers[1])),
        "model_runner.attn_backend": id(state.target_attn_backend),
        "model_runner.decode_cuda_graph_runner": id(state.target_graph_runner),
    }


def _state(shape: DraftShape, extend: bool = True) -> ShapeState:
    """A captured state built by hand: fresh objects for every field."""
    def built(what: str) -> Built:
        return Built(what, shape.steps, shape.topk, shape.draft_tokens)

    buffers: tuple[Any, Any] | None = None
    if shape.topk == 1:
        buffers = (torch.arange(-1, shape.steps - 1).repeat(MAX_RUNNING, 1),
                   torch.arange(shape.steps).repeat(MAX_RUNNING, 1))
    return ShapeState(
        shape=shape, draft_attn_backend=built("draft decode"),
        cuda_graph_runner=built("draft graphs"),
        draft_extend_attn_backend=built("draft extend") if extend else None,
        cuda_graph_runner_for_draft_extend=built("draft extend graphs"),
        target_attn_backend=TargetBackend(shape.topk, _verify_mask(shape.topk > 1)),
        target_graph_runner=built("target graphs"), chain_buffers=buffers,
    )


def _buffers(worker: SpecWorker) -> tuple[Any, Any]:
    dw = worker._draft_worker
    return (dw.__dict__.get("_topk1_parents_prealloc"),
            dw.__dict__.get("_topk1_score_indices_prealloc"))


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture
def published(plugin_loaded: bool) -> Iterator[Any]:
    """A published ServerArgs at the start-up shape: the bags SGLang's methods read."""
    from sglang.srt.runtime_context import get_context
    from sglang.srt.speculative import eagle_worker_v2

    assert plugin_loaded and eagle_worker_v2.__name__ == WORKER_MODULE  # a capture looks it up
    ctx = get_context()
    with ctx.override_server_args(speculative_eagle_topk=STARTUP.topk,
                                  speculative_num_steps=STARTUP.steps,
                                  speculative_num_draft_tokens=STARTUP.draft_tokens,
                                  max_running_requests=MAX_RUNNING):
        yield ctx


def _spec() -> tuple[Any, Any, Any]:
    from sglang.srt.runtime_context import get_spec

    bag = get_spec()
    return (bag.speculative_eagle_topk, bag.speculative_num_steps,
            bag.speculative_num_draft_tokens)




@pytest.fixture
def graph_recorder(monkeypatch: pytest.MonkeyPatch) -> type[GraphRunnerRecorder]:
    from sglang.srt.speculative import eagle_worker_v2

    monkeypatch.setattr(eagle_worker_v2, "DecodeCudaGraphRunner", GraphRunnerRecorder)
    return GraphRunnerRecorder


# ----------------------------------------------------------------------------- SGLang's bodies


def _body(root: Path, rel: str, cls: str | None, name: str) -> str:
    body = ast.parse((root / rel).read_text(encoding="utf-8")).body
    if cls is not None:
        body = next(n for n in body if isinstance(n, ast.ClassDef) and n.name == cls).body
    fn = next(n for n in body if isinstance(n, ast.FunctionDef) and n.name == name)
    return ast.dump(fn, include_attributes=False)


@pytest.mark.parametrize(("rel", "cls", "name"), [
    ("srt/speculative/eagle_worker_v2.py", "EAGLEWorkerV2", "_override_worker_state"),
    ("srt/speculative/base_spec_worker.py", "EagleDraftWorkerBase",
     "_rebuild_topk1_chain_buffers"),
    ("srt/utils/common.py", None, "fast_topk"),
])
def test_the_sglang_bodies_these_tests_run_are_0_5_17s(
    rel: str, cls: str | None, name: str, sglang17_root: Path,
) -> None:
    """Shapes run on 0.5.17; the tests call 0.5.23's classes, whose bodies must be the same."""
    import sglang

    installed = Path(sglang.__file__).parent
    assert _body(sglang17_root, rel, cls, name) == _body(installed, rel, cls, name)


# ----------------------------------------------------------------------------- to_capture


def test_a_dominating_startup_captures_the_other_listed_shapes_in_order() -> None:
    listed: list[Shape] = [CHAIN, STARTUP, NARROW, DraftShape(2, 4, 8)]
    assert shapes.to_capture(listed, STARTUP) == [CHAIN, NARROW, DraftShape(2, 4, 8)]
    assert shapes.to_capture([STARTUP], STARTUP) == []
    unlisted: list[Shape] = [NARROW, CHAIN]  # the start-up shape need not be listed
    assert shapes.to_capture(unlisted, STARTUP) == [NARROW, CHAIN]


def test_a_startup_that_does_not_dominate_is_refused_naming_the_shape_that_does() -> None:
    with pytest.raises(ShapeSetupError) as err:
        shapes.to_capture([CHAIN, STARTUP], DraftShape(3, 4, 8))
    assert "3x4x8" in str(err.value) and "start it at 3x4x16" in str(err.value)
    with pytest.raises(ShapeSetupError) as err:  # a chain start: the tree dominates
        shapes.to_capture([STARTUP], CHAIN)
    assert "start it at 3x4x16" in str(err.value)
    with pytest.raises(ShapeSetupError) as err:  # nothing dominates: the shape to add
        shapes.to_capture([DraftShape(5, 2, 12)], DraftShape(3, 4, 8))
    assert "add 3x4x12" in str(err.value)


def test_plain_in_the_list_is_captured_as_sglangs_depth_0() -> None:
    assert shapes.to_capture([None, CHAIN, STARTUP], STARTUP) == [shapes.OFF, CHAIN]
    assert DraftShape(0, 1, 1) == shapes.OFF
    assert shapes.shape_label(shapes.OFF) == "plain" and shapes.shape_label(CHAIN) == "3x1x4"


@pytest.mark.parametrize("value", ["1", "true", " True "])
def test_plain_is_refused_while_sglangs_own_skip_of_the_extend_is_on(value: str) -> None:
    """SGLang's stub writes the live top-k's width, 1 at off: the draft input would not cross
    iterations at the tree's width."""
    with pytest.raises(ShapeSetupError, match="unset it"):
        shapes.to_capture([None, STARTUP], STARTUP, value)
    assert shapes.to_capture([CHAIN, STARTUP], STARTUP, value) == [CHAIN]  # no off: no stub
    assert shapes.to_capture([None, STARTUP], STARTUP, "0") == [shapes.OFF]


# ----------------------------------------------------------------------------- topk_for_capture


@pytest.mark.parametrize("body_raises", [False, True])
def test_topk_for_capture_sets_the_captures_topk_everywhere_and_restores_it(
    published: Any, body_raises: bool,
) -> None:
    """Nested in SGLang's real `_override_worker_state` as a capture nests it: inside, both
    workers, both start-up records and the spec bag read the chain's top-k 1 and the real
    rebuild made the chain's buffers; after, all read 4 again, also when the capture raised,
    and SGLang's exit (which rebuilds again) did not trip its `topk=1` assertion."""
    worker = SpecWorker()
    dw = worker._draft_worker
    record, runner_record = _records(worker)
    before = _live(worker)
    with contextlib.ExitStack() as outer:
        if body_raises:
            outer.enter_context(pytest.raises(RuntimeError, match="capture failed"))
        with (worker._override_worker_state(CHAIN.steps, CHAIN.draft_tokens),
              shapes.topk_for_capture(worker, CHAIN.topk, BUILD)):
            assert (worker.topk, dw.topk) == (1, 1)
            assert record.speculative_eagle_topk == runner_record.speculative_eagle_topk == 1
            assert _spec() == (1, 3, 4)
            parents, scores = _buffers(worker)
            assert parents.tolist() == [[-1, 0, 1]] * MAX_RUNNING
            assert scores.tolist() == [[0, 1, 2]] * MAX_RUNNING
            if body_raises:
                raise RuntimeError("capture failed")
    assert (worker.topk, dw.topk) == (4, 4)
    assert record.speculative_eagle_topk == runner_record.speculative_eagle_topk == 4
    assert _spec() == (4, 3, 16)
    source = SHAPE_CAPTURE_SOURCE
    assert record.calls == [(source, {TOPK_FIELD: 1}), (source, {TOPK_FIELD: 4})]
    after = _live(worker)
    after["chain buffers"] = before["chain buffers"]  # left built; top-k 4 never reads them
    assert after == before


def test_a_tree_capture_builds_no_chain_buffers(published: Any) -> None:
    worker = SpecWorker()
    with (worker._override_worker_state(NARROW.steps, NARROW.draft_tokens),
          shapes.topk_for_capture(worker, NARROW.topk, BUILD)):
        assert (worker.topk, worker._draft_worker.topk, _spec()) == (2, 2, (2, 3, 8))
        assert _buffers(worker) == (None, None)
    assert (worker.topk, worker._draft_worker.topk, _spec()) == (4, 4, (4, 3, 16))


def test_sglangs_exit_asserts_when_topk_1_outlives_the_capture(published: Any) -> None:
    """Why top-k is undone inside `_override_worker_state`: SGLang's own exit restores 3
    steps and 16 draft tokens and rebuilds the chain buffers, which asserts at top-k 1."""
    worker = SpecWorker()
    with (pytest.raises(AssertionError, match="got 16 and 3"),
          worker._override_worker_state(CHAIN.steps, CHAIN.draft_tokens)):
        worker._draft_worker.topk = 1


def test_topk_for_capture_restores_when_its_own_rebuild_raises(published: Any) -> None:
    """A chain's top-k without its steps (SGLang's override not entered): the real rebuild
    asserts inside `topk_for_capture`'s set-up. The server must be left at its top-k."""
    worker = SpecWorker()
    record, runner_record = _records(worker)
    with pytest.raises(AssertionError), shapes.topk_for_capture(worker, 1, BUILD):
        pass
    assert (worker.topk, worker._draft_worker.topk) == (4, 4)
    assert record.speculative_eagle_topk == runner_record.speculative_eagle_topk == 4


# ----------------------------------------------------------------------------- capture


def test_a_chain_capture_builds_every_object_at_the_chains_topk(
    published: Any, graph_recorder: type[GraphRunnerRecorder],
) -> None:
    worker = SpecWorker()
    dw, runner = worker._draft_worker, worker._target_worker.model_runner
    before = _live(worker)
    free = iter([10.0, 9.5])
    state = shapes.capture(worker, CHAIN, build=BUILD, graphs=True,
                           gpu_free_gb=lambda: next(free))
    assert state.shape == CHAIN
    for obj, what in ((state.draft_attn_backend, "draft decode"),
                      (state.draft_extend_attn_backend, "draft extend"),
                      (state.cuda_graph_runner, "draft graphs")):
        assert (obj.what, obj.steps, obj.topk, obj.draft_tokens) == (what, 3, 1, 4)
    assert state.cuda_graph_runner_for_draft_extend is None
    backend = state.target_attn_backend
    assert backend.topk == 1 and backend.verify_mask.is_read is False
    graphs = state.target_graph_runner
    assert isinstance(graphs, GraphRunnerRecorder)
    assert graphs.model_runner is runner and graphs.attn_backend is backend
    assert graphs.widths == (3, 4) and graphs.record_topk == 1
    assert state.chain_buffers is not None
    assert state.chain_buffers[0].tolist() == [[-1, 0, 1]] * MAX_RUNNING
    assert shapes.capture_reason(state) is None
    assert state.memory_gb == pytest.approx(0.5) and state.capture_s >= 0.0
    assert dw.tp_contexts == [dw.draft_runner.tp_group]
    # the worker is back at its start-up objects and numbers
    after = _live(worker)
    after["chain buffers"] = before["chain buffers"]
    assert after == before
    assert runner.workspaces[-1] is True and runner.init_new_workspace is False
    assert (worker.server_args.speculative_eagle_topk, _spec()) == (4, (4, 3, 16))


def test_a_capture_without_graphs_keeps_no_target_graphs(published: Any) -> None:
    worker = SpecWorker()
    state = shapes.capture(worker, NARROW, build=BUILD, graphs=False)
    assert state.target_graph_runner is None and state.memory_gb is None
    assert state.chain_buffers is None
    assert (state.target_attn_backend.topk, state.cuda_graph_runner.topk) == (2, 2)
    assert state.target_attn_backend.verify_mask.is_read is True


def test_a_capture_whose_target_backend_ignores_the_override_is_refused(published: Any) -> None:
    worker = SpecWorker(runner=StartupTopkRunner)
    registry = ShapeRegistry.start(worker)
    registry.add(shapes.capture(worker, CHAIN, build=BUILD, graphs=False))
    assert CHAIN not in registry.states and registry.chains == frozenset()
    assert registry.refused == {"3x1x4": "its target backend was built for top-k 4"}


# ----------------------------------------------------------------------------- capture_reason


def test_a_state_runs_only_in_its_shapes_verify_mode() -> None:
    def with_backend(shape: DraftShape, topk: int, read: bool) -> ShapeState:
        state = _state(shape)
        state.target_attn_backend = TargetBackend(topk, _verify_mask(read))
        return state

    tree_causal = with_backend(STARTUP, 1, False)
    tree_unread = with_backend(NARROW, 2, False)
    chain_tree = with_backend(CHAIN, 4, True)
    chain_read = with_backend(CHAIN, 1, True)
    assert shapes.capture_reason(tree_causal) == "its target backend was built for top-k 1"
    assert "verify mask mode" in str(shapes.capture_reason(tree_unread))
    assert shapes.capture_reason(chain_tree) == "its target backend was built for top-k 4"
    assert "verify mask mode" in str(shapes.capture_reason(chain_read))
    good_chain, good_tree = with_backend(CHAIN, 1, False), with_backend(NARROW, 2, True)
    assert shapes.capture_reason(good_chain) is None
    assert shapes.capture_reason(good_tree) is None
    registry = ShapeRegistry.start(SpecWorker())
    for state in (tree_unread, good_chain):
        registry.add(state)
    assert set(registry.states) == {STARTUP, CHAIN}
    assert registry.states[CHAIN] is good_chain
    assert set(registry.refused) == {"3x2x8"}
    assert registry.chains == frozenset({3}) and registry.trees == frozenset({STARTUP})


# ----------------------------------------------------------------------------- switch


def test_a_switch_assigns_every_per_shape_object_but_not_the_draft_workers_topk() -> None:
    worker = SpecWorker()
    registry = ShapeRegistry.start(worker)
    start = registry.states[STARTUP]
    chain_state, narrow = _state(CHAIN), _state(NARROW, extend=False)
    registry.add(chain_state)
    registry.add(narrow)
    assert _live(worker) == _expected(start, 4, start.draft_extend_attn_backend, (None, None))

    registry.switch(worker, CHAIN)
    assert chain_state.chain_buffers is not None
    assert _live(worker) == _expected(chain_state, 4, chain_state.draft_extend_attn_backend,
                                      chain_state.chain_buffers)
    assert (registry.live, registry.switches) == (CHAIN, 1)

    # no draft-extend backend: the draft runner keeps its own, the chain buffers stay
    registry.switch(worker, NARROW)
    assert _live(worker) == _expected(narrow, 4, chain_state.draft_extend_attn_backend,
                                      chain_state.chain_buffers)
    registry.switch(worker, STARTUP)
    assert _live(worker) == _expected(start, 4, start.draft_extend_attn_backend,
                                      chain_state.chain_buffers)
    assert (registry.live, registry.switches) == (STARTUP, 3)


def test_switching_to_the_live_shape_assigns_nothing() -> None:
    worker = SpecWorker()
    registry = ShapeRegistry.start(worker)
    registry.add(_state(CHAIN))
    registry.switch(worker, CHAIN)
    worker.topk = 7  # an assignment would put 1 back
    registry.switch(worker, CHAIN)
    assert (worker.topk, registry.switches, registry.live) == (7, 1, CHAIN)


class _PickyRunner(ModelRunner):
    """Its graph-runner setter refuses one object (the last assignment of a switch)."""

    refuse: Any = None

    @property
    def decode_cuda_graph_runner(self) -> Any:
        return self._graphs

    @decode_cuda_graph_runner.setter
    def decode_cuda_graph_runner(self, value: Any) -> None:
        if value is not None and value is self.refuse:
            raise RuntimeError("graph runner refused")
        self._graphs = value


def test_a_switch_that_fails_part_way_puts_the_previous_shape_back() -> None:
    worker = SpecWorker(runner=_PickyRunner)
    registry = ShapeRegistry.start(worker)
    chain_state, narrow = _state(CHAIN), _state(NARROW)
    registry.add(chain_state)
    registry.add(narrow)
    registry.switch(worker, CHAIN)
    assert chain_state.chain_buffers is not None
    runner = worker._target_worker.model_runner
    assert isinstance(runner, _PickyRunner)
    runner.refuse = narrow.target_graph_runner
    with pytest.raises(RuntimeError, match="graph runner refused"):
        registry.switch(worker, NARROW)
    assert _live(worker) == _expected(chain_state, 4, chain_state.draft_extend_attn_backend,
                                      chain_state.chain_buffers)
    assert (registry.live, registry.switches) == (CHAIN, 1)


# ----------------------------------------------------------------------------- the draft


def _draft_input(width: int = 4, rows: int = 5) -> tuple[Any, torch.Tensor]:
    from sglang.srt.speculative.eagle_info import EagleDraftInput
    from sglang.srt.utils.common import fast_topk

    probs = torch.softmax(torch.randn(rows, 32, generator=torch.Generator().manual_seed(3)),
                          dim=-1)
    topk_p, topk_index = fast_topk(probs, width, dim=-1)
    return EagleDraftInput(topk_p=topk_p, topk_index=topk_index), probs


@pytest.mark.parametrize("body_raises", [False, True])
@pytest.mark.parametrize("k", [1, 2])
def test_a_narrower_draft_reads_the_first_k_columns_and_the_wide_input_comes_back(
    k: int, body_raises: bool,
) -> None:
    from sglang.srt.utils.common import fast_topk

    draft_input, probs = _draft_input()
    wide_p, wide_index = draft_input.topk_p, draft_input.topk_index
    draft_worker = NS(topk=4)
    with contextlib.ExitStack() as outer:
        if body_raises:
            outer.enter_context(pytest.raises(RuntimeError, match="draft failed"))
        with shapes.narrowed_draft(draft_worker, draft_input, k):
            assert draft_worker.topk == k
            assert draft_input.topk_p.shape == draft_input.topk_index.shape == (5, k)
            assert torch.equal(draft_input.topk_p, wide_p[:, :k])
            narrow_p, narrow_index = fast_topk(probs, k, dim=-1)  # what a k-wide extend writes
            assert torch.equal(draft_input.topk_index, narrow_index)
            assert torch.equal(draft_input.topk_p, narrow_p)
            if body_raises:
                raise RuntimeError("draft failed")
    assert draft_worker.topk == 4
    assert draft_input.topk_p is wide_p and draft_input.topk_index is wide_index


def test_a_draft_at_full_width_or_on_an_idle_input_replaces_no_tensor() -> None:
    draft_input, _ = _draft_input()
    wide_p = draft_input.topk_p
    worker = NS(topk=4)
    with shapes.narrowed_draft(worker, draft_input, 4):
        assert draft_input.topk_p is wide_p
    idle = NS(topk_p=None, topk_index=None)
    with shapes.narrowed_draft(worker, idle, 1):
        assert worker.topk == 1 and idle.topk_p is None
    assert worker.topk == 4


def test_fast_topks_first_k_columns_are_its_k_wide_result() -> None:
    """The width rule's premise: a k-wide extend would write the first k of K columns."""
    from sglang.srt.speculative import eagle_worker_v2
    from sglang.srt.utils.common import fast_topk

    assert eagle_worker_v2.fast_topk is fast_topk  # what the worker's extends call
    probs = torch.softmax(torch.randn(64, 1000, generator=torch.Generator().manual_seed(11)),
                          dim=-1)
    wide_p, wide_index = fast_topk(probs, 4, dim=-1)
    for k in (1, 2, 3):
        p, index = fast_topk(probs, k, dim=-1)
        assert torch.equal(index, wide_index[:, :k]) and torch.equal(p, wide_p[:, :k]), k


# ----------------------------------------------------------------------------- registry


def test_by_width_names_the_one_shape_of_a_verify_width() -> None:
    registry = ShapeRegistry.start(SpecWorker())
    for shape in (CHAIN, NARROW, DraftShape(2, 4, 8)):
        registry.add(_state(shape))
    assert registry.by_width(4) == CHAIN
    assert registry.by_width(16) == STARTUP
    assert registry.by_width(8) is None  # two shapes verify 8 tokens
    assert registry.by_width(5) is None


def test_the_report_names_each_shape_its_cost_and_its_verify_mode(published: Any) -> None:
    worker = SpecWorker(runner=StartupTopkRunner)
    registry = ShapeRegistry.start(worker)
    registry.add(shapes.capture(worker, CHAIN, build=BUILD, graphs=False))  # refused: top-k 4
    narrow = _state(NARROW)
    narrow.capture_s, narrow.memory_gb = 1.23456, 0.12345
    registry.add(narrow)
    registry.switch(worker, NARROW)
    assert registry.report() == {
        "startup": "3x4x16",
        "live": "3x2x8",
        "switches": 1,
        "captured": {
            "3x4x16": {"capture_s": 0.0, "memory_gb": None, "target_topk": 4,
                       "mask_read": True},
            "3x2x8": {"capture_s": 1.23, "memory_gb": 0.123, "target_topk": 2,
                      "mask_read": True},
        },
        "refused": {"3x1x4": "its target backend was built for top-k 4"},
    }


# ----------------------------------------------------------------------------- selection


def test_a_chain_table_selects_the_shapes_of_the_depths_select_draws() -> None:
    table = PolicyTable.build([
        Tier(1, 3, explore_share=0.5, explore_depths=(0, 1, 2)),
        Tier(8, 1, hysteresis=2, explore_share=0.25, explore_depths=(2, 3)),
        Tier(32, 0),
    ], version=7)
    depths, by_shape = (TierSelector(table, exploration_rng(7)) for _ in range(2))
    sizes = random.Random(1)
    probes = 0
    for _ in range(3000):
        batch = sizes.randint(1, 48)
        depth, probe = depths.select(batch)
        shape, shape_probe = by_shape.select_shape(batch)
        assert (shape, shape_probe) == (chain(depth), probe)
        assert by_shape.tier == depths.tier
        probes += probe
    assert 300 < probes < 1500  # both kinds were drawn


def test_a_tree_tier_probes_its_trees_and_chains() -> None:
    tier = shape_tier(1, STARTUP)
    tier = Tier(tier.min_batch, tier.depth, topk=tier.topk, draft_tokens=tier.draft_tokens,
                explore_share=0.5, explore_depths=(2,),
                explore_trees=(NARROW, DraftShape(2, 4, 8)))
    selector = TierSelector(PolicyTable.build([tier], version=1), random.Random(4))
    seen: dict[Any, int] = {}
    for _ in range(4000):
        shape, probe = selector.select_shape(3)
        assert probe == (shape != STARTUP)
        seen[shape] = seen.get(shape, 0) + 1
    assert set(seen) == {STARTUP, NARROW, DraftShape(2, 4, 8), chain(2)}
    assert 1800 < seen[STARTUP] < 2200  # half the launches probe
    assert all(400 < n < 900 for s, n in seen.items() if s != STARTUP)


def test_choose_shape_follows_a_pushed_table_on_the_captured_trees() -> None:
    rt = SchedulerRuntime(timer=HostIntervalTimer())
    assert rt.choose_shape(4) == (False, None)
    rt.activate({CHAIN.steps}, None, captured_trees={STARTUP, NARROW})
    assert rt.choose_shape(4) == (False, None)  # no table yet: the start-up shape stays
    assert rt.launched and rt.iteration == 2 and rt.last_batch_size == 4
    table = PolicyTable.build([shape_tier(1, NARROW), shape_tier(4, CHAIN),
                               shape_tier(16, STARTUP)], version=3)
    rt.commit(rt.apply_request(encode_table(table)))
    assert [rt.choose_shape(b) for b in (1, 3, 4, 15, 16, 64)] == [
        (True, NARROW), (True, NARROW), (True, CHAIN), (True, CHAIN), (True, STARTUP),
        (True, STARTUP)]
    assert rt.launch_explore is False and rt.launch_skips_extend is False
    report = rt.report()
    assert report["captured_trees"] == ["3x2x8", "3x4x16"]
    assert report["captured_depths"] == [3] and report["tree_results"] == 0
    # exploring: the draws are a selector's seeded by the table's version, probes flagged
    tree = shape_tier(1, NARROW)
    exploring = PolicyTable.build([Tier(1, tree.depth, topk=tree.topk,
                                        draft_tokens=tree.draft_tokens, explore_share=0.5,
                                        explore_depths=(3,), explore_trees=(STARTUP,))],
                                  version=5)
    rt.commit(rt.apply_request(encode_table(exploring)))
    reference = TierSelector(exploring, exploration_rng(5))
    draws = []
    for _ in range(400):
        drawn = rt.choose_shape(2)
        assert drawn == (True, reference.select_shape(2)[0])
        draws.append((drawn[1], rt.launch_explore))
    assert {d for d in draws if d[1]} == {(CHAIN, True), (STARTUP, True)}
    assert {d for d in draws if not d[1]} == {(NARROW, False)}
    uncaptured = PolicyTable.build([shape_tier(1, DraftShape(2, 4, 8))], version=4)
    with pytest.raises(PolicyError, match="not captured"):
        rt.apply_request(encode_table(uncaptured))
    rt.commit(None)
    assert rt.choose_shape(4) == (False, None)


# ----------------------------------------------------------------------------- adapters


def test_the_shape_hooks_register_only_on_a_server_given_shapes(
    fresh_settings: pytest.MonkeyPatch,
) -> None:
    adapter = v0_5_17.ADAPTER
    features = adapter.off_path
    assert {h.hook for h in adapter.hooks if h.shapes} == SHAPE_HOOKS
    assert not {h.hook for h in adapter.hooks_for(features)} & SHAPE_HOOKS
    with_shapes = {h.hook for h in adapter.hooks_for(features, shapes=True)}
    assert with_shapes == {h.hook for h in adapter.hooks_for(features)} | SHAPE_HOOKS
    assert adapter.switches_shapes and v0_5_23.ADAPTER.switches_shapes
    assert {h.hook for h in v0_5_23.ADAPTER.hooks_for(features, shapes=True)} >= SHAPE_HOOKS

    def wanted(a: Any) -> set[str]:
        return {spec.hook for spec in plugin.wanted_hooks(a)}

    assert not wanted(adapter) & SHAPE_HOOKS
    fresh_settings.setenv("SPECCTL_SHAPES", "3x1x4,3x4x16")
    assert wanted(adapter) & SHAPE_HOOKS == SHAPE_HOOKS
    assert wanted(v0_5_23.ADAPTER) & SHAPE_HOOKS == SHAPE_HOOKS
    fresh_settings.setenv("SPECCTL_SHAPES", "3x4x")  # a typo: no shapes, no shape hooks
    assert not wanted(adapter) & SHAPE_HOOKS


def test_the_shape_hooks_wrap_the_methods_the_design_names() -> None:
    targets = {h.hook: h.target.rsplit(".", 2)[1:] for h in v0_5_17.ADAPTER.hooks if h.shapes}
    assert targets == {"shapes_build": ["EAGLEWorkerV2", "init_cuda_graphs"],
                       "shape_switch": ["EAGLEWorkerV2", "activate_step_by_batch"],
                       "shape_draft": ["EagleDraftWorker", "draft"]}


# ----------------------------------------------------------------------------- settings


def test_the_shapes_setting_parses_a_list_and_a_typo_logs_one_error(
    fresh_settings: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    assert settings.SHAPES.name == "SPECCTL_SHAPES" and settings.SHAPES.get() == ()
    fresh_settings.setenv("SPECCTL_SHAPES", " 3x1x4,3x4x16 ")
    assert settings.SHAPES.get() == (CHAIN, STARTUP)
    fresh_settings.setenv("SPECCTL_SHAPES", "3x1x4,3x4x")
    with caplog.at_level(logging.ERROR, logger="specctl"):
        assert settings.SHAPES.get() == () and settings.SHAPES.get() == ()
    [line] = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert "SPECCTL_SHAPES='3x1x4,3x4x'" in line and "is not a shape list" in line


def test_shape_config_reason_reads_the_servers_arguments(monkeypatch: pytest.MonkeyPatch,
                                                        fresh_settings: pytest.MonkeyPatch
                                                        ) -> None:
    monkeypatch.setattr(hooks, "ADAPTER", v0_5_17.ADAPTER)

    def args(**fields: Any) -> Any:
        return NS(**{"speculative_adaptive": False, "speculative_eagle_topk": 4, "tp_size": 1,
                     "pp_size": 1, **fields})

    assert hooks.shape_config_reason(args()) is None
    assert "drop --speculative-adaptive" in str(
        hooks.shape_config_reason(args(speculative_adaptive=True)))
    assert "--speculative-eagle-topk above 1" in str(
        hooks.shape_config_reason(args(speculative_eagle_topk=1)))
    # tensor parallelism passes: the ranks agree before the capture (the TP tests below)
    assert hooks.shape_config_reason(args(tp_size=2)) is None
    assert "pipeline parallelism" in str(hooks.shape_config_reason(args(pp_size=2)))
    fresh_settings.setenv("SPECCTL_SHAPES", "3x1x4,3x4x16")  # the plugin's check routes here
    assert "pipeline parallelism" in str(hooks.unsupported_config_reason(args(pp_size=2)))
    monkeypatch.setattr(hooks, "ADAPTER", v0_5_23.ADAPTER)
    assert hooks.shape_config_reason(args()) is None
    # an SGLang whose adapter does not say how it builds a shape: one line, nothing captured
    monkeypatch.setattr(hooks, "ADAPTER", dataclasses.replace(v0_5_23.ADAPTER, shape_build=None))
    assert hooks.shape_config_reason(args()) == \
        "SPECCTL_SHAPES is not supported on this SGLang (sglang-0.5.23)"


# ----------------------------------------------------------------------------- the hooks


@pytest.fixture
def shape_server(runtime: SchedulerRuntime, published: Any, fresh_settings: pytest.MonkeyPatch,
                 graph_recorder: type[GraphRunnerRecorder]) -> Iterator[SchedulerRuntime]:
    """A scheduler of a 0.5.17 server given SPECCTL_SHAPES (its adapter builds the shapes);
    hooks.SHAPES and the logged failures are this test's."""
    fresh_settings.setattr(hooks, "ADAPTER", v0_5_17.ADAPTER)
    fresh_settings.setattr(hooks, "SHAPES", None)
    fresh_settings.setattr(hooks, "_failed", set())
    fresh_settings.setenv("SPECCTL_SHAPES", "3x1x4,3x2x8,3x4x16")
    yield runtime
    assert hooks._failed == set()


def test_the_hooks_capture_switch_and_narrow_the_listed_shapes(
    shape_server: SchedulerRuntime,
) -> None:
    rt = shape_server
    worker = SpecWorker()
    dw = worker._draft_worker
    assert hooks.shapes_build("ret", worker) == "ret"
    registry = hooks.SHAPES
    assert registry is not None and set(registry.states) == {STARTUP, CHAIN, NARROW}
    assert registry.refused == {} and registry.live == STARTUP
    assert rt.active and rt.captured_depths == {3} and rt.captured_trees == {STARTUP, NARROW}
    assert rt.report()["tp_ranks_checked"] is None  # one rank: nothing to agree with
    assert _live(worker)["worker topk"] == 4 and worker.server_args.speculative_eagle_topk == 4
    assert hooks.shapes_build("again", worker) == "again" and hooks.SHAPES is registry

    activated: list[int] = []

    def activate(w: Any, batch_size: int) -> None:
        activated.append(batch_size)

    drafts: list[tuple[int, int, int]] = []

    def draft(w: Any, batch: Any) -> str:
        drafts.append((w.topk, *batch.spec_info.topk_p.shape))
        return "drafted"

    buffers = registry.states[CHAIN].chain_buffers  # a tree's switch leaves the chain's
    assert buffers is not None
    batch = NS(spec_info=_draft_input()[0])
    wide = batch.spec_info.topk_p
    hooks.shape_switch(activate, worker, 2)  # no table: the start-up shape
    assert registry.live == STARTUP and registry.switches == 0
    table = PolicyTable.build([shape_tier(1, NARROW), shape_tier(4, CHAIN),
                               shape_tier(16, STARTUP)], version=1)
    rt.commit(rt.apply_request(encode_table(table)))
    for batch_size, shape, width in ((2, NARROW, 2), (8, CHAIN, 1), (32, STARTUP, 4)):
        assert hooks.shape_switch(activate, worker, batch_size) is None
        assert registry.live == shape
        state = registry.states[shape]
        assert _live(worker) == _expected(state, 4, state.draft_extend_attn_backend, buffers)
        assert hooks.shape_draft(draft, dw, batch) == "drafted"
        assert drafts[-1] == (width, 5, width)
        assert dw.topk == 4 and batch.spec_info.topk_p is wide
    assert worker.topk == 4 and registry.switches == 3 and activated == []
    rt.commit(None)  # control released: back to the start-up shape
    hooks.shape_switch(activate, worker, 2)
    assert registry.live == STARTUP and activated == []


def test_a_listed_shape_the_startup_does_not_dominate_leaves_the_server_static(
    shape_server: SchedulerRuntime, fresh_settings: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    rt = shape_server
    fresh_settings.setenv("SPECCTL_SHAPES", "3x1x4,5x4x20")
    worker = SpecWorker()
    before = _live(worker)
    with caplog.at_level(logging.ERROR, logger="specctl"):
        hooks.shapes_build(None, worker)
    assert hooks.SHAPES is None and not rt.active
    assert "start it at 5x4x20" in str(rt.inactive_reason)
    assert any("start it at 5x4x20" in r.getMessage() for r in caplog.records)
    assert _live(worker) == before
    calls: list[int] = []
    hooks.shape_switch(lambda w, b: calls.append(b), worker, 3)  # SGLang's own, unchanged
    assert calls == [3]


def _count(rt: SchedulerRuntime, width: int, accepted: list[int],
           shape: DraftShape | None = None) -> None:
    """One decode result through SGLang's real `_resolve_spec_v2_tokens` and the plugin's
    count hook on it; `shape` is what the launch hook attached (None: untimed)."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.managers.scheduler_components.batch_result_processor import (
        SchedulerBatchResultProcessor,
    )
    from sglang.srt.managers.utils import GenerationBatchResult
    from sglang.srt.sampling.sampling_params import SamplingParams

    processor = NS(metrics_reporter=NS(snapshot_spec_decode_metrics=lambda batch, result: None),
                   model_worker=NS(on_verify_complete_cpu=lambda *a, **k: None))
    processor.advance_grammar_fsm = lambda result, batch: \
        SchedulerBatchResultProcessor.advance_grammar_fsm(processor, result, batch)

    def req(rid: str) -> Any:
        r = Req(rid, "hi", [1, 2, 3], SamplingParams(max_new_tokens=64))
        if getattr(r, "kv", None) is None:
            r.kv = NS(kv_committed_len=3, kv_allocated_len=8)
        return r

    result = GenerationBatchResult(
        next_token_ids=torch.arange(100, 100 + width * len(accepted)),
        accept_lens=torch.tensor(accepted), speculative_num_draft_tokens=width)
    result.specctl_launch = (False, None)
    if shape is not None:
        result.specctl_shape = shape
    reqs = [req(f"r{i}") for i in range(len(accepted))]
    SchedulerBatchResultProcessor._resolve_spec_v2_tokens(
        processor, result, NS(reqs=reqs, has_grammar=False))


def test_a_shape_server_counts_a_chain_at_its_steps_and_a_tree_apart(
    shape_server: SchedulerRuntime,
) -> None:
    rt = shape_server
    hooks.shapes_build(None, SpecWorker())
    assert rt.active
    _count(rt, CHAIN.draft_tokens, [2, 4])
    [(key, cell)] = rt.counters.pending.items()
    assert key[0] == CHAIN.steps and cell[:3] == [1, 2, 6]
    _count(rt, STARTUP.draft_tokens, [5, 1, 3])  # a tree: no depth of its own
    _count(rt, NARROW.draft_tokens, [2])
    assert list(rt.counters.pending) == [key] and rt.tree_results == 2
    assert rt.report()["tree_results"] == 2


class _Event:
    """A stand-in CUDA timing event (no GPU here): complete once recorded."""

    def __init__(self) -> None:
        self.recorded = False

    def record(self) -> None:
        self.recorded = True

    def query(self) -> bool:
        return self.recorded

    def elapsed_time(self, other: _Event) -> float:
        return 2.0


def test_a_tree_result_hands_its_timing_events_back_whole(
    shape_server: SchedulerRuntime,
) -> None:
    """A tree's result is not counted per depth, but its launch's pair of events goes back to
    the pool as two events, so the next launch's timing starts from events, not a pair."""
    from sglang_hooks.gpu_timer import CudaEventTimer

    rt = shape_server
    hooks.shapes_build(None, SpecWorker())
    timer = CudaEventTimer(_Event, pool_size=1)
    rt.timer = timer
    pair = timer.end(timer.begin())
    result = NS(speculative_num_draft_tokens=STARTUP.draft_tokens,
                specctl_launch=(False, pair), specctl_shape=STARTUP)
    hooks._count([[1, 2]], result, NS(reqs=[NS(is_retracted=False, finished_reason=None)]))
    assert rt.tree_results == 1
    assert all(isinstance(e, _Event) for e in timer._pool) and len(timer._pool) == 2
    assert timer.seconds(timer.end(timer.begin())) == 0.002


def test_the_kv_reserve_stays_at_the_start_up_shape_across_switches(
    shape_server: SchedulerRuntime, published: Any,
) -> None:
    """SGLang's KV reserve per decode (`get_alloc_len_per_decode`, 0.5.23's, which reads the
    spec bag every decode batch) is sized by the start-up shape and must stay there: a switch
    writes neither the bag nor the start-up record, and a capture puts both back."""
    from sglang.srt.mem_cache.allocation_sizing import get_alloc_len_per_decode

    with published.override_server_args(speculative_algorithm="EAGLE3",
                                        speculative_eagle_topk=STARTUP.topk,
                                        speculative_num_steps=STARTUP.steps,
                                        speculative_num_draft_tokens=STARTUP.draft_tokens,
                                        max_running_requests=MAX_RUNNING, page_size=1):
        reserve = get_alloc_len_per_decode()
        assert reserve == max(STARTUP.steps * STARTUP.topk, STARTUP.draft_tokens)
        worker = SpecWorker()
        hooks.shapes_build(None, worker)  # captures 3x1x4 and 3x2x8 beside 3x4x16
        registry = hooks.SHAPES
        assert registry is not None and len(registry.states) == 3
        assert get_alloc_len_per_decode() == reserve and _spec() == (4, 3, 16)
        order = [CHAIN, NARROW, STARTUP, CHAIN, STARTUP, NARROW] * 200
        for shape in order:
            registry.switch(worker, shape)
            assert get_alloc_len_per_decode() == reserve
        assert registry.switches == len(order)  # no two neighbours alike, the first included
        assert _spec() == (4, 3, 16) and worker.server_args.speculative_eagle_topk == 4


# ----------------------------------------------------------------------------- off (plain)

HIDDEN = 64


def _with_sglangs_stub(worker: SpecWorker) -> SpecWorker:
    """SGLang's real `_stub_skipped_draft_extend` bound to the stand-in, with the draft
    runner's config it reads (the hidden width it zeroes)."""
    import types

    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    runner = worker._draft_worker.draft_runner
    runner.model_config = NS(spec_hidden_size=HIDDEN, dtype=torch.bfloat16)  # type: ignore[attr-defined]
    runner.spec_algorithm = NS(is_standalone=lambda: False)  # type: ignore[attr-defined]
    worker.draft_worker = worker._draft_worker  # type: ignore[attr-defined]
    worker._stub_skipped_draft_extend = types.MethodType(  # type: ignore[attr-defined]
        EAGLEWorkerV2._stub_skipped_draft_extend, worker)
    return worker


def _extend_after_verify(rt: SchedulerRuntime, worker: SpecWorker, batch_size: int) -> Any:
    """The draft extend SGLang calls after a verify, through the plugin's hook on it; the
    stand-in draft worker has nothing, so SGLang's real extend fails at once if it runs."""
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker

    rt.spec_worker = worker
    batch = NS(seq_lens=torch.zeros(batch_size, dtype=torch.int64))
    result = NS(next_draft_input=NS(topk_p=None, topk_index=None, hidden_states=None))
    EagleDraftWorker._draft_extend_for_decode(NS(), batch, result)
    return result.next_draft_input


@pytest.fixture
def off_server(shape_server: SchedulerRuntime, fresh_settings: pytest.MonkeyPatch
               ) -> tuple[SchedulerRuntime, SpecWorker]:
    """A shape server given 3x1x4, plain and 3x4x16, on the plugin's off path of 0.5.17."""
    fresh_settings.setenv("SPECCTL_SHAPES", "3x1x4,plain,3x4x16")
    fresh_settings.setattr(hooks, "OFF_PATH", settings.SPECCTL)
    fresh_settings.setattr(hooks, "FEATURES", v0_5_17.ADAPTER.off_path)
    worker = _with_sglangs_stub(SpecWorker())
    hooks.shapes_build(None, worker)
    return shape_server, worker


def test_plain_is_captured_as_a_one_token_causal_verify_and_reported_as_depth_0(
    off_server: tuple[SchedulerRuntime, SpecWorker],
) -> None:
    from sglang_hooks.contract import OffPathFeature

    rt, worker = off_server
    registry = hooks.SHAPES
    assert registry is not None and registry.off == shapes.OFF
    assert set(registry.states) == {STARTUP, CHAIN, shapes.OFF} and registry.refused == {}
    off = registry.states[shapes.OFF]
    # built inside SGLang's real override at 0 steps and 1 draft token, at top-k 1
    assert (off.draft_attn_backend.steps, off.draft_attn_backend.topk,
            off.draft_attn_backend.draft_tokens) == (0, 1, 1)
    assert off.target_attn_backend.topk == 1 and not off.target_attn_backend.verify_mask.is_read
    assert off.target_graph_runner.widths == (0, 1) and off.target_graph_runner.record_topk == 1
    assert _live(worker)["worker topk"] == 4 and worker.server_args.speculative_eagle_topk == 4
    assert rt.captured_depths == {0, 3} and rt.captured_trees == {STARTUP}
    assert rt.off_path == settings.SPECCTL and rt.features == {OffPathFeature.SKIP_EXTEND}
    assert set(registry.report()["captured"]) == {"3x4x16", "3x1x4", "plain"}
    assert rt.report()["captured_depths"] == [0, 3]


def test_an_off_tier_runs_depth_0_and_skips_its_extend_at_the_trees_width(
    off_server: tuple[SchedulerRuntime, SpecWorker],
) -> None:
    rt, worker = off_server
    registry = hooks.SHAPES
    assert registry is not None
    table = PolicyTable.build([shape_tier(1, STARTUP), shape_tier(8, CHAIN),
                               shape_tier(64, None)], version=1)
    rt.commit(rt.apply_request(encode_table(table)))
    buffers = registry.states[CHAIN].chain_buffers
    assert buffers is not None
    for batch_size, shape, skips in ((2, STARTUP, False), (16, CHAIN, False),
                                     (100, shapes.OFF, True), (4, STARTUP, False)):
        hooks.shape_switch(lambda w, b: None, worker, batch_size)
        assert registry.live == shape and rt.launch_skips_extend is skips
        if shape == shapes.OFF:
            state = registry.states[shape]
            assert _live(worker) == _expected(state, 4, state.draft_extend_attn_backend,
                                              state.chain_buffers or buffers)
            stub = _extend_after_verify(rt, worker, 20)
            # SGLang's own zeros, four columns wide as every extend writes them
            assert stub.topk_p.shape == (20, 4) and stub.topk_index.shape == (20, 4)
            assert float(stub.topk_p.abs().sum()) == 0.0
            assert stub.hidden_states.shape == (20, HIDDEN)
            assert worker.topk == 1 and rt.skipped_extends == 1  # the live top-k is back
    assert registry.switches == 3  # the first launch ran the live start-up shape


def test_an_off_tier_that_probes_a_shape_keeps_the_real_extend(
    off_server: tuple[SchedulerRuntime, SpecWorker],
) -> None:
    """Its probes must draft from a current state, as on a chain server."""
    rt, worker = off_server
    probing = PolicyTable.build([Tier(1, 0, explore_share=0.5, explore_trees=(STARTUP,))],
                                version=2)
    rt.commit(rt.apply_request(encode_table(probing)))
    for _ in range(200):
        hooks.shape_switch(lambda w, b: None, worker, 30)
        if hooks.SHAPES is not None and hooks.SHAPES.live == shapes.OFF:
            break
    assert rt.launch_skips_extend is False and worker.speculative_num_steps == 0
    with pytest.raises(AttributeError):  # SGLang's real extend ran on the stand-in
        _extend_after_verify(rt, worker, 20)
    assert rt.skipped_extends == 0


def test_without_plain_an_off_table_is_refused_and_off_runs_nothing(
    shape_server: SchedulerRuntime,
) -> None:
    rt = shape_server
    worker = SpecWorker()
    hooks.shapes_build(None, worker)
    assert hooks.SHAPES is not None and hooks.SHAPES.off is None
    assert rt.off_path == settings.SGLANG and rt.features == frozenset()
    with pytest.raises(PolicyError, match="depth 0 was not captured"):
        rt.apply_request(encode_table(PolicyTable.build(
            [shape_tier(1, STARTUP), shape_tier(64, None)], version=3)))


def test_on_sglangs_own_depth_0_path_off_keeps_the_extend(
    shape_server: SchedulerRuntime, fresh_settings: pytest.MonkeyPatch,
) -> None:
    """SPECCTL_OFF_PATH=sglang: the plugin registers no off-path piece, so off runs SGLang's
    depth 0 unchanged, the extend included."""
    rt = shape_server
    fresh_settings.setenv("SPECCTL_SHAPES", "plain,3x4x16")
    fresh_settings.setattr(hooks, "OFF_PATH", settings.SGLANG)
    worker = SpecWorker()
    hooks.shapes_build(None, worker)
    assert hooks.SHAPES is not None and hooks.SHAPES.off == shapes.OFF
    assert rt.off_path == settings.SGLANG and rt.captured_depths == {0}
    rt.commit(rt.apply_request(encode_table(PolicyTable.build(
        [shape_tier(1, STARTUP), shape_tier(64, None)], version=4))))
    hooks.shape_switch(lambda w, b: None, worker, 100)
    assert hooks.SHAPES.live == shapes.OFF and rt.launch_skips_extend is False


def test_a_shape_server_counts_off_at_depth_0(off_server: tuple[SchedulerRuntime, SpecWorker],
                                              ) -> None:
    """Timed or not: a one-token verify is off's alone on this server."""
    rt, _ = off_server
    assert hooks.SHAPES is not None and hooks.SHAPES.by_width(1) == shapes.OFF
    _count(rt, 1, [1, 1, 1], shape=shapes.OFF)
    _count(rt, 1, [1, 1])  # untimed: found by its width
    pending = rt.counters.pending  # (depth, batch-size bucket) -> iterations, steps, tokens
    assert {key[0] for key in pending} == {0} and rt.tree_results == 0
    assert [sum(cell[i] for cell in pending.values()) for i in range(3)] == [2, 5, 5]


# ----------------------------------------------------------------------------- TP ranks
#
# Real: `torch.distributed.TCPStore` (a master and one client per rank, each wrapped in a
# `PrefixStore` as `init_process_group` wraps its own), the plugin's `PeerCheck` on it, and
# `hooks.build_shapes`, the part of `shapes_build` each scheduler runs, capturing through the
# stand-in workers above. Stand-ins: each TP rank is a thread of this process with its own
# runtime, worker and store client, where a server runs one process per rank (the two ranks'
# `shapes_build` would share this process's hooks.RUNTIME and hooks.SHAPES); their captures
# run one at a time, since each overrides SGLang's process-wide RuntimeContext. No capture
# runs TP collectives here, so a mismatch shows as a refusal, not as the hang it prevents.

LISTED = "3x1x4,3x2x8,3x4x16"


@pytest.fixture
def captures(tp_store: Any, fresh_settings: pytest.MonkeyPatch) -> list[bool]:
    """Every capture any rank runs, one at a time: whether the ranks' verdict was in the store
    when it began."""
    from sglang_hooks.peers import VERDICT_KEY

    capture, lock, store, began = hooks._capture_shapes, threading.Lock(), tp_store(), []

    def one_at_a_time(worker: Any, registry: ShapeRegistry, wanted: list[DraftShape]) -> None:
        with lock:
            began.append(store.check([VERDICT_KEY]))
            capture(worker, registry, wanted)

    fresh_settings.setattr(hooks, "_capture_shapes", one_at_a_time)
    return began


@dataclass
class Rank:
    rt: SchedulerRuntime
    worker: SpecWorker
    before: dict[str, Any]  # the worker's live objects before the build
    registry: ShapeRegistry | None = None


def _tp_build(tp_store: Any, lists: list[str], world: int, wait_s: float = 5.0) -> list[Rank]:
    """Ranks 0.. of a `world`-rank server, rank r given SPECCTL_SHAPES=lists[r], each through
    `build_shapes` in its own thread; ranks beyond the lists run without the plugin."""
    ranks = [Rank(SchedulerRuntime(timer=HostIntervalTimer()), w, _live(w))
             for w in (SpecWorker() for _ in lists)]

    def build(r: int) -> None:
        def check(**wording: Any) -> PeerCheck:
            return PeerCheck(tp_store(), r, world, wait_s=wait_s, **wording)

        listed = parse_shapes(lists[r])
        ranks[r].registry = hooks.build_shapes(ranks[r].rt, ranks[r].worker, listed, check)

    threads = [threading.Thread(target=build, args=(r,)) for r in range(len(lists))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads), "a rank blocked beyond the check's bound"
    return ranks


def test_tp_ranks_given_the_same_list_agree_then_each_captures_it(
    shape_server: SchedulerRuntime, captures: list[bool], tp_store: Any, tmp_path: Path,
    fresh_settings: pytest.MonkeyPatch,
) -> None:
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"table": {"version": 2, "tiers": [
        {"min_batch": 1, "depth": 3, "topk": 2, "draft_tokens": 8},
        {"min_batch": 8, "depth": 3}]}}))
    fresh_settings.setenv("SPECCTL_POLICY_FILE", str(policy))
    ranks = _tp_build(tp_store, [LISTED, LISTED], world=2)
    for rank in ranks:
        assert rank.registry is not None
        assert set(rank.registry.states) == {STARTUP, CHAIN, NARROW}
        assert rank.registry.refused == {}
        report = rank.rt.report()
        assert report["active"] and report["tp_ranks_checked"] == 2
        # agreed before the capture: the start-up table runs from the first launch
        assert rank.rt.source == "startup" and rank.rt.choose_shape(2) == (True, NARROW)
    assert captures == [True, True]  # each rank's capture began after the verdict


@pytest.mark.parametrize("other", ["3x1x4,3x4x16", "3x2x8,3x1x4,3x4x16"],
                         ids=["another list", "another order"])
def test_tp_ranks_given_other_lists_capture_nothing_and_say_one_reason(
    shape_server: SchedulerRuntime, captures: list[bool], tp_store: Any, other: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.ERROR, logger="specctl"):
        ranks = _tp_build(tp_store, [LISTED, other], world=2)
    assert captures == []
    reasons = {rank.rt.inactive_reason for rank in ranks}
    assert len(reasons) == 1  # the verdict of the rank that decided first, on both
    [reason] = reasons
    assert reason is not None and reason.startswith(
        "SPECCTL_SHAPES: no TP rank captures the listed shapes: TP ranks disagree: rank 0 has")
    assert '"shapes":["3x1x4","3x2x8","3x4x16"]' in reason and reason.endswith(SHAPES_FIX)
    for rank in ranks:
        assert rank.registry is None and _live(rank.worker) == rank.before
        report = rank.rt.report()
        assert not report["active"] and report["inactive_reason"] == reason
        assert report["tp_ranks_checked"] == 2
        assert rank.rt.choose_shape(2) == (False, None)  # the start-up shape, as SGLang's
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(lines) == 2 and all(line.startswith(
        "specctl: not steering, the server runs its start-up shape: no TP rank captures")
        and line.endswith(SHAPES_FIX) for line in lines)


def test_a_tp_rank_without_the_plugin_leaves_the_others_uncaptured_after_the_wait(
    shape_server: SchedulerRuntime, captures: list[bool], tp_store: Any,
) -> None:
    start = time.monotonic()
    [rank] = _tp_build(tp_store, [LISTED], world=2, wait_s=0.3)  # rank 1 publishes nothing
    assert 0.3 <= time.monotonic() - start < 10
    assert captures == [] and rank.registry is None and _live(rank.worker) == rank.before
    report = rank.rt.report()
    assert not report["active"] and report["tp_ranks_checked"] == 2
    assert "TP rank(s) [1] of 2 published no specctl state within 0.3 s" in \
        report["inactive_reason"]
    assert report["inactive_reason"].endswith(f"{SHAPES_STAKE}; {SHAPES_FIX}")


def test_the_ranks_compare_a_chain_servers_fields_the_list_and_the_start_up_shape(
    monkeypatch: pytest.MonkeyPatch, fresh_settings: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(hooks, "ADAPTER", v0_5_17.ADAPTER)
    fields = hooks.shape_peer_fields(parse_shapes("3x1x4,plain,3x4x16"), STARTUP)
    assert fields == {
        "shapes": ["3x1x4", "plain", "3x4x16"], "startup_shape": "3x4x16",
        "sglang": v0_5_17.ADAPTER.name, "startup": "none", "off_path": hooks.OFF_PATH,
        "off_path_features": sorted(hooks.FEATURES),
        "SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND": "",
    }
