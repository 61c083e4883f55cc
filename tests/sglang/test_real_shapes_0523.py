"""Draft shapes on SGLang 0.5.23 (sglang_hooks/shapes.py through the 0.5.23 adapter's
`ShapeBuild`), on the CPU.

Real: the guard on the installed 0.5.23 sources (and on copies of them with one read moved);
SGLang's `EAGLEWorkerV2._override_worker_state` and `EagleDraftWorkerBase.
_rebuild_topk1_chain_buffers`, called through the 0.5.23 classes on stand-in workers; the real
`RuntimeContext` with a published `ServerArgs` (its spec bag, which 0.5.23's builders and KV
reserve read, and its sealed start-up record); `spec_utils.resolve_num_tokens_per_req` (the
widths the draft graph runners are sized by), `DecodeCudaGraphRunner.get_spec_info` (the top-k a
verify graph is captured with), `_select_spec_graph_runner_cls` and `draft_tp_context` as
`eagle_worker_v2` holds them; `maybe_create_verify_mask`; the KV reserve's readers
(`get_alloc_len_per_decode`, `get_alloc_reserve_per_decode`,
`ScheduleBatch._new_tokens_required_next_decode_spec_v2`, `compute_num_reserved_tokens`);
`apply_runtime_state` with a real `SpecRuntimeState`; `_stub_skipped_draft_extend` and the
plugin's hook on `_draft_extend_for_decode` as this session registered it; SGLang's hook
wrapper (`hook_registry._wrap_fn`, what `HookRegistry.apply_hooks` installs); the plugin's
adapters, contract, runtime, settings and hooks.

Stand-ins, because no attention backend, CUDA graph or model can be built on a CPU
(FlashAttention 3 needs sgl_kernel): the speculative worker, its draft worker and their model
runners, carrying the attributes shapes.py and the 0.5.23 adapter read and write. Their
builders make marker objects that record what 0.5.23's builders read from the spec bag when
built (FlashAttention 3 and `EAGLEDraftCudaGraphRunner`: `get_spec().speculative_eagle_topk`,
which the guard checks in their source; the draft graphs' widths through the real
`resolve_num_tokens_per_req`; a draft-extend graph per shape, which 0.5.23 captures on FA3),
and the target backend a real `VerifyMask`, read only at top-k > 1 as FA3 builds it. SGLang's
`DecodeCudaGraphRunner` is replaced by a recorder that calls the real `get_spec_info` as a
capture would.
"""

from __future__ import annotations

import contextlib
import inspect
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any

import pytest
import torch

from sglang_hooks import guard, hooks, settings, shapes
from sglang_hooks.adapters import v0_5_23
from sglang_hooks.adapters.base import SHAPE_CAPTURE_SOURCE, TOPK_FIELD
from sglang_hooks.contract import PolicyTable, shape_tier
from sglang_hooks.draft_shape import DraftShape
from sglang_hooks.runtime import SchedulerRuntime
from sglang_hooks.shapes import ShapeRegistry

STARTUP = DraftShape(3, 4, 16)  # the dominating tree the server starts at
CHAIN = DraftShape(3, 1, 4)
NARROW = DraftShape(3, 2, 8)
MAX_RUNNING = 8
HIDDEN = 64
WORKER_MODULE = "sglang.srt.speculative.eagle_worker_v2"
BUILD = v0_5_23.SHAPE_BUILD
SHAPE_HOOKS = {"shapes_build": ("EAGLEWorkerV2", "init_cuda_graphs"),
               "shape_switch": ("EAGLEWorkerV2", "activate_step_by_batch"),
               "shape_draft": ("EagleDraftWorker", "draft")}


# ----------------------------------------------------------------------------- stand-ins


@dataclass(eq=False)
class Built:
    """A backend or graph runner: what it is, the steps it was built for, and the top-k and
    per-request width it read from the spec bag when built."""

    what: str
    steps: int
    topk: int
    width: int


@dataclass(eq=False)
class TargetBackend:
    topk: int
    verify_mask: Any
    fa_impl_ver: int = 3


def _bag() -> tuple[int, int, int]:
    """The spec bag's (top-k, steps, draft tokens)."""
    from sglang.srt.runtime_context import get_spec

    spec = get_spec()
    return (spec.speculative_eagle_topk, spec.speculative_num_steps,
            spec.speculative_num_draft_tokens)


def _target_backend() -> TargetBackend:
    """As FA3 builds it: top-k and the verify width from the bag, its mask read at top-k > 1."""
    from sglang.srt.layers.attention.verify_mask import maybe_create_verify_mask

    topk, _, draft = _bag()
    mask = maybe_create_verify_mask(is_draft_runner=False, skip_prefill=False, max_bs=2,
                                    max_context_len=8, num_draft_tokens=draft, device="cpu",
                                    is_read=topk > 1)
    return TargetBackend(topk, mask)


class DraftRunner:
    def __init__(self) -> None:
        self.draft_attn_backend: Any = None
        self.attn_backend: Any = None
        self.model_config = NS(spec_hidden_size=HIDDEN, dtype=torch.bfloat16)
        self.spec_algorithm = NS(is_standalone=lambda: False)


class DraftWorker:
    """EagleDraftWorker's attributes on 0.5.23; its builders read the spec bag."""

    def __init__(self, shape: DraftShape, record: Any) -> None:
        from sglang.srt.speculative.draft_parallel import DraftParallelLayout

        self.topk = shape.topk
        self.speculative_num_steps = shape.steps
        self.speculative_num_draft_tokens = shape.draft_tokens
        self.server_args = record
        self.device = "cpu"
        self.draft_runner = DraftRunner()
        self.parallel_layout = DraftParallelLayout(tp_group=None, attn_tp_size=1,
                                                   disable_cp=False)
        self.draft_attn_backend: Any = None
        self.draft_extend_attn_backend: Any = None
        self.cuda_graph_runner: Any = None
        self.cuda_graph_runner_for_draft_extend: Any = None
        self.init_attention_backend()
        self._capture_cuda_graphs()
        self._rebuild_topk1_chain_buffers()

    def _built(self, what: str, phase: str) -> Built:
        from sglang.srt.speculative.spec_utils import resolve_num_tokens_per_req

        return Built(what, self.speculative_num_steps, _bag()[0],
                     resolve_num_tokens_per_req(phase=phase))  # type: ignore[arg-type]

    def init_attention_backend(self) -> None:
        runner = self.draft_runner
        self.draft_attn_backend = runner.draft_attn_backend = self._built(
            "draft decode", "draft_decode")
        self.draft_extend_attn_backend = runner.attn_backend = self._built(
            "draft extend", "draft_extend")

    def _capture_cuda_graphs(self) -> None:
        # 0.5.23: draft decode graphs above one step; FA3's draft-extend graphs per shape
        self.cuda_graph_runner = (self._built("draft graphs", "draft_decode")
                                  if self.speculative_num_steps > 1 else None)
        self.cuda_graph_runner_for_draft_extend = self._built("draft extend graphs",
                                                              "draft_extend")

    def _rebuild_topk1_chain_buffers(self) -> None:
        from sglang.srt.speculative.base_spec_worker import EagleDraftWorkerBase

        EagleDraftWorkerBase._rebuild_topk1_chain_buffers(self)


class ModelRunner:
    """The target's model runner: its backend reads the bag when built."""

    def __init__(self, shape: DraftShape) -> None:
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        self.init_new_workspace = False
        self.workspaces: list[bool] = []
        self.spec_algorithm = SpeculativeAlgorithm.from_string("EAGLE3")
        self.is_draft_worker = False
        self.model_config = NS(hidden_size=8)
        self.dtype, self.device = torch.float32, "cpu"
        self.attn_backend: Any = self._get_attention_backend()
        self.decode_cuda_graph_runner: Any = Built("target graphs", shape.steps, shape.topk,
                                                   shape.draft_tokens)

    def _get_attention_backend(self, init_new_workspace: bool = False) -> TargetBackend:
        self.workspaces.append(init_new_workspace)
        self.init_new_workspace = init_new_workspace  # left set, as SGLang's builder leaves it
        return _target_backend()


class SpecWorker:
    """EAGLEWorkerV2's attributes on 0.5.23. Its module is SGLang's, where a capture finds
    `draft_tp_context`, the MoE contexts and the graph runner selection."""

    __module__ = WORKER_MODULE

    def __init__(self, shape: DraftShape = STARTUP) -> None:
        from sglang.srt.runtime_context import get_context, get_schedule

        record = get_context().server_args  # the real one: sealed once resolved
        self.page_size = get_schedule().page_size  # as 0.5.23's __init__ reads it
        self.topk = shape.topk
        self.speculative_num_steps = shape.steps
        self.speculative_num_draft_tokens = shape.draft_tokens
        self.server_args = record
        self.adaptive_controller = None
        self.device = "cpu"
        self.gpu_id = 0
        self._draft_worker = DraftWorker(shape, record)
        self.draft_worker = self._draft_worker
        self._target_worker = NS(model_runner=ModelRunner(shape))

    def _override_worker_state(self, steps: int, draft_tokens: int,
                               cuda_graph_bs: list[int] | None = None
                               ) -> contextlib.AbstractContextManager[None]:
        from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

        return EAGLEWorkerV2._override_worker_state(  # type: ignore[no-any-return]
            self, steps, draft_tokens, cuda_graph_bs)

    def _stub_skipped_draft_extend(self, batch: Any, batch_output: Any) -> None:
        from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

        EAGLEWorkerV2._stub_skipped_draft_extend(self, batch, batch_output)  # type: ignore[arg-type]


class GraphRunnerRecorder:
    """Stands in for SGLang's DecodeCudaGraphRunner (a capture needs CUDA): records how it was
    built, and the top-k of the verify input its capture would build (the real
    `get_spec_info`, which reads the bag)."""

    def __init__(self, model_runner: Any, *, attn_backend: Any, speculative_num_steps: int,
                 speculative_num_draft_tokens: int) -> None:
        from sglang.srt.model_executor.runner.decode_cuda_graph_runner import (
            DecodeCudaGraphRunner,
        )

        self.model_runner = model_runner
        self.attn_backend = attn_backend
        self.speculative_num_steps = speculative_num_steps
        self.speculative_num_draft_tokens = speculative_num_draft_tokens
        self.widths = (speculative_num_steps, speculative_num_draft_tokens)
        self.buffers = NS(custom_mask=torch.ones(4, dtype=torch.bool))
        spec_info = DecodeCudaGraphRunner.get_spec_info(self, 4)  # type: ignore[arg-type]
        self.verify_topk = spec_info.topk


def _live(worker: SpecWorker) -> dict[str, Any]:
    """What runs now: numbers as they are, objects by identity."""
    dw, runner = worker._draft_worker, worker._target_worker.model_runner
    return {
        "topk": (worker.topk, dw.topk),
        "steps": (worker.speculative_num_steps, dw.speculative_num_steps),
        "draft tokens": (worker.speculative_num_draft_tokens, dw.speculative_num_draft_tokens),
        "draft": (id(dw.draft_attn_backend), id(dw.draft_runner.draft_attn_backend),
                  id(dw.cuda_graph_runner)),
        "extend": (id(dw.draft_extend_attn_backend), id(dw.draft_runner.attn_backend),
                   id(dw.cuda_graph_runner_for_draft_extend)),
        "target": (id(runner.attn_backend), id(runner.decode_cuda_graph_runner)),
    }


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture
def published(plugin_loaded: bool) -> Iterator[Any]:
    """A published ServerArgs at the start-up shape: the bags 0.5.23's methods read."""
    from sglang.srt.runtime_context import get_context
    from sglang.srt.speculative import eagle_worker_v2

    assert plugin_loaded and eagle_worker_v2.__name__ == WORKER_MODULE
    ctx = get_context()
    with ctx.override_server_args(speculative_algorithm="EAGLE3",
                                  speculative_eagle_topk=STARTUP.topk,
                                  speculative_num_steps=STARTUP.steps,
                                  speculative_num_draft_tokens=STARTUP.draft_tokens,
                                  max_running_requests=MAX_RUNNING, page_size=1):
        yield ctx


@pytest.fixture
def graph_recorder(monkeypatch: pytest.MonkeyPatch) -> type[GraphRunnerRecorder]:
    from sglang.srt.speculative import eagle_worker_v2

    monkeypatch.setattr(eagle_worker_v2, "DecodeCudaGraphRunner", GraphRunnerRecorder)
    return GraphRunnerRecorder


@pytest.fixture
def tp_layouts(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The layouts a capture entered SGLang's real `draft_tp_context` with."""
    from sglang.srt.speculative import eagle_worker_v2

    real, entered = eagle_worker_v2.draft_tp_context, []

    def recording(layout: Any) -> Any:
        entered.append(layout)
        return real(layout)

    monkeypatch.setattr(eagle_worker_v2, "draft_tp_context", recording)
    return entered


@pytest.fixture
def shape_server(runtime: SchedulerRuntime, published: Any, fresh_settings: pytest.MonkeyPatch,
                 graph_recorder: type[GraphRunnerRecorder]) -> Iterator[SchedulerRuntime]:
    """A scheduler of a 0.5.23 server given SPECCTL_SHAPES; hooks.SHAPES and the logged
    failures are this test's."""
    fresh_settings.setattr(hooks, "ADAPTER", v0_5_23.ADAPTER)
    fresh_settings.setattr(hooks, "SHAPES", None)
    fresh_settings.setattr(hooks, "_failed", set())
    fresh_settings.setenv("SPECCTL_SHAPES", "3x1x4,3x2x8,3x4x16")
    yield runtime
    assert hooks._failed == set()


# ----------------------------------------------------------------------------- the guard


def test_the_guard_accepts_0_5_23_whose_adapter_builds_shapes() -> None:
    result = guard.evaluate(shapes=True)
    assert result.version == "0.5.23" and result.adapter is v0_5_23.ADAPTER, result.reason
    adapter = result.adapter
    assert adapter.switches_shapes and adapter.shape_build is BUILD
    targets = {h.hook: tuple(h.target.rsplit(".", 2)[1:]) for h in adapter.hooks if h.shapes}
    assert targets == SHAPE_HOOKS
    root = guard.sglang_root()
    assert root is not None
    for sym in adapter.symbols():
        assert guard.check_symbol(root, sym) is None, sym.where
    assert {s.where.rsplit(".", 2)[-2] for s in adapter.shape_reads if s.reads} >= {
        "FlashAttentionBackend", "EAGLEDraftCudaGraphRunner", "DecodeCudaGraphRunner"}


def test_the_wrapped_methods_keep_their_0_5_23_keywords_on_the_live_classes() -> None:
    """`draft(batch, *, with_topology)` and `_draft_extend_for_decode(batch, batch_result, *,
    kv_loc_plan)`: the hooks take the leading positions and pass the rest on as they came."""
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker

    def keyword_only(method: Any) -> list[str]:
        params = inspect.signature(inspect.unwrap(method)).parameters.values()
        return [p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY]

    assert keyword_only(EagleDraftWorker.draft) == ["with_topology"]
    assert keyword_only(EagleDraftWorker._draft_extend_for_decode) == ["kv_loc_plan"]


def _copy_adapter_sources(tmp_path: Path) -> Path:
    """The files the 0.5.23 adapter's symbols live in, and the version, copied from the
    installed SGLang: what the guard parses."""
    installed = guard.sglang_root()
    assert installed is not None
    root = tmp_path / "sglang"
    for sym in v0_5_23.ADAPTER.symbols():
        source = guard._module_file(installed, sym.module)
        target = root / source.relative_to(installed)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, target)
    shutil.copy(installed / "_version.py", root / "_version.py")
    return root


@pytest.mark.parametrize(("rel", "old", "new", "named"), [
    ("srt/layers/attention/flashattention_backend.py",
     "self.topk = get_spec().speculative_eagle_topk or 0",
     "self.topk = model_runner.server_args.speculative_eagle_topk or 0",
     "FlashAttentionBackend.__init__ no longer reads get_spec().speculative_eagle_topk"),
    ("srt/speculative/eagle_draft_cuda_graph_runner.py",
     "self.topk = get_spec().speculative_eagle_topk",
     "self.topk = eagle_worker.topk",
     "EAGLEDraftCudaGraphRunner.__init__ no longer reads get_spec().speculative_eagle_topk"),
    ("srt/mem_cache/allocation_sizing.py",
     "return 2 * get_alloc_len_per_decode()",
     "return 2 * get_alloc_len_for_live_shape()",
     "get_alloc_reserve_per_decode no longer reads get_alloc_len_per_decode()"),
    ("srt/speculative/eagle_worker_v2.py",
     "def _select_spec_graph_runner_cls(",
     "def _select_graph_runner_cls(",
     "function sglang.srt.speculative.eagle_worker_v2._select_spec_graph_runner_cls is missing"),
    ("srt/speculative/eagle_worker_v2.py",
     "ret_topk_p, ret_topk_index = fast_topk(probs, self.topk, dim=-1)",
     "ret_topk_p, ret_topk_index = self.cuda_graph_runner_for_draft_extend.topk(probs)",
     "EagleDraftWorker._draft_extend_for_decode no longer reads "
     "fast_topk(probs, self.topk, dim=-1)"),
], ids=["fa3 top-k", "draft graphs top-k", "kv reserve", "graph runner selection",
        "extend top-k"])
def test_the_guard_refuses_a_0_5_23_where_a_read_of_the_shapes_moved(
    tmp_path: Path, rel: str, old: str, new: str, named: str,
) -> None:
    """Where SPECCTL_SHAPES lists shapes the plugin is refused by name; where it does not, the
    same SGLang still runs chains with the plugin (a shape-only read is not theirs)."""
    root = _copy_adapter_sources(tmp_path)
    assert guard.evaluate(root, shapes=True).adapter is v0_5_23.ADAPTER  # the copy as installed
    target = root / rel
    text = target.read_text(encoding="utf-8")
    assert text.count(old) == 1
    target.write_text(text.replace(old, new), encoding="utf-8")
    guard._parse.cache_clear()
    result = guard.evaluate(root, shapes=True)
    assert result.adapter is None and result.reason is not None
    assert named in result.reason and "0.5.17 to 0.5.23" in result.reason
    assert guard.evaluate(root, shapes=False).adapter is v0_5_23.ADAPTER


# ----------------------------------------------------------------------------- top-k for a capture


@pytest.mark.parametrize("body_raises", [False, True])
def test_a_capture_sets_topk_in_the_spec_bag_through_get_context_override_and_restores_it(
    published: Any, body_raises: bool,
) -> None:
    """Nested in SGLang's real `_override_worker_state` as a capture nests it: inside, both
    workers and the bag read the chain's top-k 1 (steps and draft tokens from SGLang's own
    override) and the real rebuild made the chain's buffers; after, all read the start-up
    shape again, also when the capture raised. The start-up record is sealed and untouched."""
    worker = SpecWorker()
    dw = worker._draft_worker
    record = worker.server_args
    recorded = record.speculative_eagle_topk
    log = published._overrides_log
    start = len(log)
    with contextlib.ExitStack() as outer:
        if body_raises:
            outer.enter_context(pytest.raises(RuntimeError, match="capture failed"))
        with (worker._override_worker_state(CHAIN.steps, CHAIN.draft_tokens),
              shapes.topk_for_capture(worker, CHAIN.topk, BUILD)):
            assert (worker.topk, dw.topk) == (1, 1) and _bag() == (1, 3, 4)
            parents = dw.__dict__["_topk1_parents_prealloc"]
            assert parents.tolist() == [[-1, 0, 1]] * MAX_RUNNING
            if body_raises:
                raise RuntimeError("capture failed")
    assert (worker.topk, dw.topk) == (4, 4) and _bag() == (4, 3, 16)
    sources = [(source, fields) for source, fields in log[start:]]
    assert sources[1:3] == [(SHAPE_CAPTURE_SOURCE, {TOPK_FIELD: 1}),
                            (SHAPE_CAPTURE_SOURCE, {TOPK_FIELD: 4})]
    assert [s for s, _ in sources] == ["adaptive_spec.capture_override", SHAPE_CAPTURE_SOURCE,
                                       SHAPE_CAPTURE_SOURCE, "adaptive_spec.capture_restore"]
    assert record is published.server_args and record.speculative_eagle_topk == recorded
    with pytest.raises(AttributeError, match="read-only"):  # why 0.5.23 is changed in the bag
        record.speculative_eagle_topk = 1


def test_the_bag_is_put_back_to_what_it_held_not_to_the_workers_topk(published: Any) -> None:
    """The worker's top-k and the bag's are the same on a server; restoring the bag's own
    value keeps a capture from writing anything it did not change."""
    worker = SpecWorker()
    worker.topk = worker._draft_worker.topk = 2  # a worker out of step with the bag
    with shapes.topk_for_capture(worker, NARROW.topk, BUILD):
        assert _bag()[0] == 2
    assert _bag()[0] == 4 and (worker.topk, worker._draft_worker.topk) == (2, 2)


# ----------------------------------------------------------------------------- capture


@pytest.mark.parametrize(("shape", "draft_graphs", "mask_read"), [
    (CHAIN, True, False), (NARROW, True, True), (shapes.OFF, False, False),
], ids=["chain", "narrower tree", "off"])
def test_a_capture_builds_every_object_at_the_shapes_topk_and_widths(
    published: Any, graph_recorder: type[GraphRunnerRecorder], tp_layouts: list[Any],
    shape: DraftShape, draft_graphs: bool, mask_read: bool,
) -> None:
    worker = SpecWorker()
    dw, runner = worker._draft_worker, worker._target_worker.model_runner
    before = _live(worker)
    free = iter([10.0, 9.5])
    state = shapes.capture(worker, shape, build=BUILD, graphs=True,
                           gpu_free_gb=lambda: next(free))
    s = shape
    assert (state.draft_attn_backend.topk, state.draft_attn_backend.width) == (s.topk, s.topk)
    assert state.draft_attn_backend.steps == s.steps
    extend = state.cuda_graph_runner_for_draft_extend  # per shape: 0.5.23 captures FA3's
    assert (extend.what, extend.width) == ("draft extend graphs", s.draft_tokens)
    if draft_graphs:
        assert (state.cuda_graph_runner.topk, state.cuda_graph_runner.width) == (s.topk, s.topk)
    else:
        assert state.cuda_graph_runner is None
    backend = state.target_attn_backend
    assert backend.topk == s.topk and backend.verify_mask.is_read is mask_read
    graphs = state.target_graph_runner
    assert isinstance(graphs, GraphRunnerRecorder) and graphs.attn_backend is backend
    assert graphs.widths == (s.steps, s.draft_tokens) and graphs.verify_topk == s.topk
    assert shapes.capture_reason(state) is None
    assert state.memory_gb == pytest.approx(0.5)
    assert tp_layouts == [dw.parallel_layout]  # the draft's resolved layout, as SGLang's
    assert _live(worker) == before  # back at the start-up objects and numbers
    assert runner.init_new_workspace is False and runner.workspaces[-1] is True
    assert _bag() == (4, 3, 16)


def test_the_target_graph_runner_is_the_one_sglangs_state_builder_picks(
    published: Any, graph_recorder: type[GraphRunnerRecorder], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Through SGLang's real `_select_spec_graph_runner_cls`: the built-in runner here; an
    out-of-tree platform's own runner; none where that platform captures no graphs."""
    from sglang.srt.speculative import eagle_worker_v2

    worker = SpecWorker()
    assert BUILD.target_graph_runner(worker) is GraphRunnerRecorder

    class PlatformRunner(GraphRunnerRecorder):
        pass

    for capable, expected in ((True, PlatformRunner), (False, None)):
        platform = NS(is_out_of_tree=lambda: True, capabilities=NS(graph_capture=capable),
                      get_graph_runner_cls=lambda: PlatformRunner)
        monkeypatch.setattr(eagle_worker_v2, "current_platform", platform)
        assert BUILD.target_graph_runner(worker) is expected
        graphs = shapes.capture(worker, CHAIN, build=BUILD, graphs=True).target_graph_runner
        assert (graphs is None) if expected is None else (type(graphs) is expected)


def test_a_capture_without_graphs_asks_for_no_graph_runner(published: Any) -> None:
    worker = SpecWorker()
    state = shapes.capture(worker, NARROW, build=BUILD, graphs=False)
    assert state.target_graph_runner is None and state.memory_gb is None
    assert state.target_attn_backend.topk == 2 and state.chain_buffers is None


# ----------------------------------------------------------------------------- through the hooks


def test_the_hooks_capture_on_0_5_23_and_a_switch_sets_the_live_topk_on_the_worker(
    shape_server: SchedulerRuntime,
) -> None:
    """Captured through `shapes_build`; each switch assigns the shape's objects and top-k to
    the speculative worker (the verify reads it), while the draft worker stays at the start-up
    top-k (the extend's own `fast_topk(probs, self.topk)` then writes four columns, whichever
    shape's draft-extend graph ran) and its draft reads the first k columns."""
    rt = shape_server
    worker = SpecWorker()
    dw = worker._draft_worker
    hooks.shapes_build(None, worker)
    registry = hooks.SHAPES
    assert registry is not None and set(registry.states) == {STARTUP, CHAIN, NARROW}
    assert registry.refused == {} and rt.active
    assert rt.captured_depths == {3} and rt.captured_trees == {STARTUP, NARROW}
    assert _bag() == (4, 3, 16)

    from sglang.srt.speculative.eagle_info import EagleDraftInput
    from sglang.srt.utils.common import fast_topk

    probs = torch.softmax(torch.randn(5, 32, generator=torch.Generator().manual_seed(3)), -1)
    wide_p, wide_index = fast_topk(probs, 4, dim=-1)
    batch = NS(spec_info=EagleDraftInput(topk_p=wide_p, topk_index=wide_index))
    drafts: list[tuple[int, int, bool]] = []

    def draft(w: Any, b: Any, *, with_topology: bool = False) -> str:
        drafts.append((w.topk, b.spec_info.topk_p.shape[1], with_topology))
        assert torch.equal(b.spec_info.topk_index, wide_index[:, :w.topk])
        return "drafted"

    table = PolicyTable.build([shape_tier(1, NARROW), shape_tier(4, CHAIN),
                               shape_tier(16, STARTUP)], version=1)
    rt.commit(rt.apply_request(encode(table)))
    for batch_size, shape in ((2, NARROW), (8, CHAIN), (32, STARTUP), (3, NARROW)):
        assert hooks.shape_switch(lambda w, b: None, worker, batch_size) is None
        state = registry.states[shape]
        assert registry.live == shape and worker.topk == shape.topk and dw.topk == 4
        assert (worker.speculative_num_steps, worker.speculative_num_draft_tokens) == \
            (shape.steps, shape.draft_tokens)
        assert dw.cuda_graph_runner_for_draft_extend is state.cuda_graph_runner_for_draft_extend
        assert worker._target_worker.model_runner.decode_cuda_graph_runner is \
            state.target_graph_runner
        assert hooks.shape_draft(draft, dw, batch, with_topology=True) == "drafted"
        assert drafts[-1] == (shape.topk, shape.topk, True)
        assert dw.topk == 4 and batch.spec_info.topk_p is wide_p
    assert registry.switches == 4 and _bag() == (4, 3, 16)


def test_a_paged_0_5_23_server_stays_at_its_start_up_shape_and_says_why_in_one_line(
    shape_server: SchedulerRuntime, published: Any, caplog: pytest.LogCaptureFixture,
) -> None:
    """The page size 0.5.23 resolved (the worker's, from the schedule bag): paged trees reserve
    whole pages per branch, so nothing is captured and the server runs its start-up shape."""
    import logging

    rt = shape_server
    with published.override_server_args(speculative_algorithm="EAGLE3",
                                        speculative_eagle_topk=STARTUP.topk,
                                        speculative_num_steps=STARTUP.steps,
                                        speculative_num_draft_tokens=STARTUP.draft_tokens,
                                        max_running_requests=MAX_RUNNING, page_size=16):
        worker = SpecWorker()
        before = _live(worker)
        with caplog.at_level(logging.ERROR, logger="specctl"):
            hooks.shapes_build(None, worker)
    assert hooks.SHAPES is None and not rt.active and _live(worker) == before
    [line] = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert line == ("specctl: not steering, the server runs its start-up shape: paged trees "
                    "reserve whole pages per branch; drop --page-size")


def encode(table: PolicyTable) -> dict[str, Any]:
    from sglang_hooks.contract import encode_table

    return encode_table(table)


def test_the_kv_reserve_stays_at_the_dominating_shape_across_switches(
    shape_server: SchedulerRuntime, published: Any,
) -> None:
    """0.5.23 reads the reserve from the spec bag at every decode batch; a switch writes no bag
    (a capture puts back what it changed), so every reader keeps the start-up tree's
    2 * max(3 x 4, 16) = 32 slots per request through the switches."""
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.managers.utils import compute_num_reserved_tokens
    from sglang.srt.mem_cache.allocation_sizing import (
        get_alloc_len_per_decode,
        get_alloc_reserve_per_decode,
    )

    requests = [NS(kv=NS(kv_committed_len=100, kv_allocated_len=100)) for _ in range(3)]

    def reserves() -> tuple[int, int, int, int]:
        return (get_alloc_len_per_decode(), get_alloc_reserve_per_decode(),
                ScheduleBatch._new_tokens_required_next_decode_spec_v2(NS(), requests, 1),
                compute_num_reserved_tokens())

    assert reserves() == (16, 32, 96, 16)
    worker = SpecWorker()
    hooks.shapes_build(None, worker)
    registry = hooks.SHAPES
    assert registry is not None and reserves() == (16, 32, 96, 16)
    order = [CHAIN, NARROW, STARTUP, CHAIN, STARTUP, NARROW] * 300
    for shape in order:
        registry.switch(worker, shape)
        assert get_alloc_reserve_per_decode() == 32
    assert registry.switches == len(order) and reserves() == (16, 32, 96, 16)


def test_sglangs_own_state_apply_would_move_the_reserve_which_is_why_a_switch_does_not_call_it(
    published: Any,
) -> None:
    """`apply_runtime_state` ends by writing its state's steps and draft tokens to the bag
    (`adaptive_spec.restore`): a 5-step chain applied that way would move the reserve."""
    from sglang.srt.mem_cache.allocation_sizing import get_alloc_reserve_per_decode
    from sglang.srt.speculative.adaptive_runtime_state import SpecRuntimeState
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    worker = SpecWorker()
    state = SpecRuntimeState(speculative_num_steps=5, speculative_num_draft_tokens=20,
                             draft_attn_backend=None, cuda_graph_runner=None,
                             target_attn_backend=None, target_graph_runner=None,
                             draft_extend_attn_backend=None,
                             cuda_graph_runner_for_draft_extend=None)
    assert get_alloc_reserve_per_decode() == 32
    EAGLEWorkerV2.apply_runtime_state(worker, state)  # type: ignore[arg-type]
    assert _bag() == (4, 5, 20) and get_alloc_reserve_per_decode() == 2 * max(5 * 4, 20)


# ----------------------------------------------------------------------------- signatures, off


class _RealSignatures:
    """The two wrapped methods with 0.5.23's signatures (compared below), recording calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.topk = 4

    def draft(self, batch: Any, *, with_topology: bool = False) -> str:
        self.calls.append(("draft", {"with_topology": with_topology,
                                     "width": batch.spec_info.topk_p.shape[1]}))
        return "verify input"

    def _draft_extend_for_decode(self, batch: Any, batch_result: Any, *,
                                 kv_loc_plan: Any = None) -> None:
        self.calls.append(("extend", {"kv_loc_plan": kv_loc_plan}))


def _parameters(method: Any) -> list[tuple[str, Any, Any]]:
    params = inspect.signature(inspect.unwrap(method)).parameters.values()
    return [(p.name, p.kind, p.default) for p in params]


def test_the_keywords_pass_through_sglangs_hook_wrapper_and_the_plugins_hooks(
    shape_server: SchedulerRuntime,
) -> None:
    """Each hook wrapped the way `HookRegistry.apply_hooks` wraps it (`_wrap_fn`, AROUND),
    around methods with the real signatures: `with_topology` and `kv_loc_plan` reach them."""
    from sglang.srt.plugins.hook_registry import HookType, _wrap_fn
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker

    for name in ("draft", "_draft_extend_for_decode"):
        assert _parameters(getattr(_RealSignatures, name)) == \
            _parameters(getattr(EagleDraftWorker, name)), name
    rt = shape_server
    worker = SpecWorker()
    hooks.shapes_build(None, worker)
    registry = hooks.SHAPES
    assert registry is not None
    registry.switch(worker, NARROW)
    draft = _wrap_fn(_RealSignatures.draft, hooks.shape_draft, HookType.AROUND)
    extend = _wrap_fn(_RealSignatures._draft_extend_for_decode, hooks.skip_extend,
                      HookType.AROUND)
    target = _RealSignatures()
    wide = torch.zeros(2, 4)
    batch = NS(spec_info=NS(topk_p=wide, topk_index=wide.long()), seq_lens=torch.zeros(2))
    assert draft(target, batch, with_topology=True) == "verify input"
    rt.spec_worker = worker  # as the launch hook sets it
    plan = object()
    assert extend(target, batch, NS(accept_lens=None), kv_loc_plan=plan) is None
    assert target.calls == [("draft", {"with_topology": True, "width": 2}),
                            ("extend", {"kv_loc_plan": plan})]
    assert target.topk == 4 and batch.spec_info.topk_p is wide


def test_off_on_0_5_23_skips_the_extend_through_the_wrapped_method_at_full_width(
    shape_server: SchedulerRuntime, fresh_settings: pytest.MonkeyPatch,
) -> None:
    """`plain` listed: an off tier runs SGLang's depth 0 and the plugin's skip of the extend,
    reached through the real `_draft_extend_for_decode` as this session wrapped it (its
    `kv_loc_plan` keyword accepted); SGLang's own stub writes four columns."""
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker

    rt = shape_server
    fresh_settings.setenv("SPECCTL_SHAPES", "3x1x4,plain,3x4x16")
    fresh_settings.setattr(hooks, "OFF_PATH", settings.SPECCTL)
    fresh_settings.setattr(hooks, "FEATURES", v0_5_23.ADAPTER.off_path)
    worker = SpecWorker()
    hooks.shapes_build(None, worker)
    registry = hooks.SHAPES
    assert registry is not None and registry.off == shapes.OFF
    assert rt.captured_depths == {0, 3} and rt.off_path == settings.SPECCTL
    rt.commit(rt.apply_request(encode(PolicyTable.build(
        [shape_tier(1, STARTUP), shape_tier(64, None)], version=2))))
    hooks.shape_switch(lambda w, b: None, worker, 100)
    assert registry.live == shapes.OFF and rt.launch_skips_extend
    assert worker.topk == 1 and worker.speculative_num_steps == 0
    rt.spec_worker = worker
    batch = NS(seq_lens=torch.zeros(20, dtype=torch.int64))
    result = NS(next_draft_input=NS(topk_p=None, topk_index=None, hidden_states=None))
    EagleDraftWorker._draft_extend_for_decode(NS(), batch, result, kv_loc_plan=None)  # type: ignore[arg-type]
    stub = result.next_draft_input
    assert stub.topk_p.shape == stub.topk_index.shape == (20, 4)
    assert stub.hidden_states.shape == (20, HIDDEN)
    assert worker.topk == 1 and rt.skipped_extends == 1


def test_shape_registry_starts_from_the_0_5_23_workers_live_objects(published: Any) -> None:
    worker = SpecWorker()
    registry = ShapeRegistry.start(worker)
    start = registry.states[STARTUP]
    dw = worker._draft_worker
    assert start.cuda_graph_runner_for_draft_extend is dw.cuda_graph_runner_for_draft_extend
    assert start.target_attn_backend is worker._target_worker.model_runner.attn_backend
    assert start.cuda_graph_runner_for_draft_extend.width == STARTUP.draft_tokens
