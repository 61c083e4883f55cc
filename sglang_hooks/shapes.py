"""Draft shapes captured inside one server and switched by pointer between iterations.

SGLang's adaptive mode switches chains only: a server with top-k above 1 runs one static
shape. Started at the shape that dominates a list (`draft_shape.dominating`: largest top-k,
draft tokens and steps x top-k, so every buffer and the KV reserve SGLang sizes once fit every
shape), the plugin captures each other listed shape the way SGLang builds an adaptive state,
with top-k set to the shape's for the capture (the attention backends and graph runners read
it from SGLang's configuration when built, not from the worker), and switches the live shape
by assigning the worker's per-shape objects (docs/decisions/draft-shapes.md).

Width rule: the draft input (`topk_p`, `topk_index`) crosses iterations at the start-up
top-k K, because SGLang's stash of it and its batch merges are sized by the first write. The
draft worker therefore keeps top-k K outside its draft, so its extends write K columns, and
the draft of a narrower shape reads the first k of them (`fast_topk` sorts them).

Version-neutral: what differs between SGLang releases in building a shape (where the builders
read top-k, the contexts they run under, the target graph runner class) is the adapter's
`ShapeBuild` (adapters/v0_5_17.py, v0_5_23.py), and the names it reaches are read by the guard
through the adapter. FlashAttention 3 only (`server_reason`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sglang_hooks.draft_shape import DraftShape, Shape, dominating, label

if TYPE_CHECKING:
    from sglang_hooks.adapters.base import ShapeBuild

logger = logging.getLogger("specctl")
# Off (`plain` in the list) on a shape server: SGLang's own depth 0, captured as the state of 0
# steps and 1 draft token at top-k 1 (no draft; a one-token verify whose target backend attends
# causally). Its draft extend is skipped at off tiers on the plugin's off path (hooks.py), the
# stub written at the start-up width like every other producer of the draft input.
OFF = DraftShape(0, 1, 1)
_TRUE = ("1", "true", "yes", "y", "on")


class ShapeSetupError(RuntimeError):
    """This server cannot capture the listed shapes; the message names why and the fix."""


@dataclass
class ShapeState:
    """One captured shape: what a switch assigns, and what its capture cost."""

    shape: DraftShape
    draft_attn_backend: Any
    cuda_graph_runner: Any
    draft_extend_attn_backend: Any
    cuda_graph_runner_for_draft_extend: Any
    target_attn_backend: Any
    target_graph_runner: Any
    # A chain's fixed parent and score indices (the draft reads them at top-k 1); None for a
    # tree. Kept per state so a switch assigns them instead of allocating new ones.
    chain_buffers: tuple[Any, Any] | None = None
    capture_s: float = 0.0
    memory_gb: float | None = None

    def report(self) -> dict[str, Any]:
        backend = self.target_attn_backend
        mask = getattr(backend, "verify_mask", None)
        return {
            "capture_s": round(self.capture_s, 2),
            "memory_gb": None if self.memory_gb is None else round(self.memory_gb, 3),
            # what the target verify runs: the tree's cascade and mask, or a chain's causal path
            "target_topk": getattr(backend, "topk", None),
            "mask_read": None if mask is None else bool(getattr(mask, "is_read", False)),
        }


def server_reason(worker: Any, server_args: Any) -> str | None:
    """Why this speculative worker cannot switch shapes, or None (`server_args` as resolved)."""
    if getattr(worker, "adaptive_controller", None) is not None:
        return "--speculative-adaptive is on; a shape server runs its own states: drop it"
    if (getattr(worker, "topk", 1) or 1) <= 1:
        return ("the server starts at a chain; start it at the tree that dominates the list "
                "(`specctl serve --shapes` does)")
    backend = getattr(worker._target_worker.model_runner, "attn_backend", None)
    if getattr(backend, "fa_impl_ver", None) != 3:
        return "tree shapes run on FlashAttention 3 only; pass --attention-backend fa3"
    # the worker holds the resolved page size (0.5.23's record keeps only what was passed)
    page_size = getattr(worker, "page_size", None) or getattr(server_args, "page_size", 1)
    if (page_size or 1) != 1:
        return "paged trees reserve whole pages per branch; drop --page-size"
    for flag, what in (("enable_dp_attention", "DP attention"),
                       ("enable_two_batch_overlap", "two-batch overlap"),
                       ("enable_pdmux", "PD multiplexing")):
        if getattr(server_args, flag, False):
            return f"{what} is not supported with shapes; drop it"
    if (getattr(server_args, "pp_size", 1) or 1) > 1:
        return "pipeline parallelism is not supported with shapes"
    # Tensor parallelism passes: the ranks agree on the list before any capture (hooks.py).
    return None


def startup_shape(worker: Any) -> DraftShape:
    return DraftShape(int(worker.speculative_num_steps), int(worker.topk),
                      int(worker.speculative_num_draft_tokens))


def to_capture(listed: list[Shape], startup: DraftShape,
               sglang_skips_extend: str | None = None) -> list[DraftShape]:
    """The listed shapes beyond the start-up one, in order, plain as OFF. Raises
    ShapeSetupError when the start-up shape does not dominate them, or when plain is listed
    and SGLang's own skip of the depth-0 extend is on (`sglang_skips_extend`, its variable's
    value): its stub is as wide as the live top-k, 1 at off, and the draft input must cross
    iterations at the start-up width."""
    shapes = [s for s in listed if s is not None]
    try:
        top = dominating([startup, *shapes])
    except ValueError as err:
        raise ShapeSetupError(str(err)) from None
    if top != startup:
        raise ShapeSetupError(f"the server starts at {startup.label} but {label(top)} dominates "
                              f"the list; start it at {label(top)}")
    off = any(s is None for s in listed)
    if off and (sglang_skips_extend or "").strip().lower() in _TRUE:
        raise ShapeSetupError("SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND writes a one-column draft "
                              "input at off on a tree server; unset it (the plugin skips the "
                              "draft extend at off itself)")
    return [OFF if s is None else s for s in listed if s != startup]


def shape_label(shape: DraftShape) -> str:
    """A captured shape as the user listed it: `plain` for OFF."""
    return label(None) if shape == OFF else shape.label


# ----------------------------------------------------------------------------- capture


@contextlib.contextmanager
def topk_for_capture(worker: Any, topk: int, build: ShapeBuild) -> Iterator[None]:
    """Top-k at `topk` on both workers and wherever this SGLang's builders read it
    (`build.topk`), restored on exit. Entered inside SGLang's `_override_worker_state` and left
    before it restores the steps, so its rebuild of the chain buffers sees the start-up top-k
    again."""
    dw = worker._draft_worker
    saved = worker.topk, dw.topk
    with contextlib.ExitStack() as stack:
        try:  # the set-up inside too: a failed rebuild must not leave the capture's top-k behind
            worker.topk = dw.topk = topk
            stack.enter_context(build.topk(worker, topk))
            dw._rebuild_topk1_chain_buffers()  # a chain's buffers at its steps; none for a tree
            yield
        finally:
            worker.topk, dw.topk = saved


def state_of(worker: Any, shape: DraftShape) -> ShapeState:
    """The worker's live objects as a state (the start-up shape's, after SGLang's graphs)."""
    dw, runner = worker._draft_worker, worker._target_worker.model_runner
    chain = None
    if shape.topk == 1 and hasattr(dw, "_topk1_parents_prealloc"):
        chain = (dw._topk1_parents_prealloc, dw._topk1_score_indices_prealloc)
    return ShapeState(
        shape=shape,
        draft_attn_backend=dw.draft_attn_backend,
        cuda_graph_runner=dw.cuda_graph_runner,
        draft_extend_attn_backend=dw.draft_extend_attn_backend,
        cuda_graph_runner_for_draft_extend=dw.cuda_graph_runner_for_draft_extend,
        target_attn_backend=runner.attn_backend,
        target_graph_runner=runner.decode_cuda_graph_runner,
        chain_buffers=chain,
    )


def capture(worker: Any, shape: DraftShape, *, build: ShapeBuild, graphs: bool,
            gpu_free_gb: Callable[[], float] | None = None) -> ShapeState:
    """Build `shape`'s backends and graphs as SGLang builds an adaptive state, at its top-k
    (`build`: this SGLang's adapter's way). The worker is back at its start-up objects
    afterwards."""
    dw, runner = worker._draft_worker, worker._target_worker.model_runner
    tic = time.perf_counter()
    before = gpu_free_gb() if gpu_free_gb else None
    saved_target = runner.attn_backend, runner.decode_cuda_graph_runner
    with contextlib.ExitStack() as stack:
        stack.enter_context(build.contexts(worker))  # as SGLang's init_cuda_graphs enters them
        stack.enter_context(worker._override_worker_state(shape.steps, shape.draft_tokens))
        stack.enter_context(topk_for_capture(worker, shape.topk, build))
        dw.init_attention_backend()
        dw._capture_cuda_graphs()
        saved_workspace = runner.init_new_workspace
        try:
            target_backend = runner._get_attention_backend(init_new_workspace=True)
        finally:
            runner.init_new_workspace = saved_workspace
        target_graphs = None
        runner_cls = build.target_graph_runner(worker) if graphs else None
        if runner_cls is not None:
            target_graphs = runner_cls(
                runner, attn_backend=target_backend, speculative_num_steps=shape.steps,
                speculative_num_draft_tokens=shape.draft_tokens)
        state = state_of(worker, shape)
        state.target_attn_backend, state.target_graph_runner = target_backend, target_graphs
    runner.attn_backend, runner.decode_cuda_graph_runner = saved_target
    state.capture_s = time.perf_counter() - tic
    if before is not None and gpu_free_gb is not None:
        state.memory_gb = before - gpu_free_gb()
    return state


def capture_reason(state: ShapeState) -> str | None:
    """Why a captured state must not run, or None: its target verify must run the shape's
    mode (a tree verified causally would accept tokens its mask forbids)."""
    backend = state.target_attn_backend
    topk = getattr(backend, "topk", None)
    if topk is not None and (topk > 1) != (state.shape.topk > 1):
        return f"its target backend was built for top-k {topk}"
    mask = getattr(backend, "verify_mask", None)
    if mask is not None and bool(getattr(mask, "is_read", False)) != (state.shape.topk > 1):
        return "its target backend's verify mask mode is not the shape's"
    return None


# ----------------------------------------------------------------------------- switch


def assign(worker: Any, state: ShapeState) -> None:
    """Make `state` the live shape: host-side assignments only, between iterations. The draft
    worker keeps the start-up top-k (its extends write full width; `narrowed_draft`)."""
    s, dw, runner = state.shape, worker._draft_worker, worker._target_worker.model_runner
    worker.topk = s.topk  # the verify reads it: a tree's accepted path is compacted at top-k > 1
    worker.speculative_num_steps = dw.speculative_num_steps = s.steps
    worker.speculative_num_draft_tokens = dw.speculative_num_draft_tokens = s.draft_tokens
    dw.draft_attn_backend = dw.draft_runner.draft_attn_backend = state.draft_attn_backend
    dw.cuda_graph_runner = state.cuda_graph_runner
    dw.draft_extend_attn_backend = state.draft_extend_attn_backend
    if state.draft_extend_attn_backend is not None:
        dw.draft_runner.attn_backend = state.draft_extend_attn_backend
    dw.cuda_graph_runner_for_draft_extend = state.cuda_graph_runner_for_draft_extend
    if state.chain_buffers is not None:
        dw._topk1_parents_prealloc, dw._topk1_score_indices_prealloc = state.chain_buffers
    runner.attn_backend = state.target_attn_backend
    runner.decode_cuda_graph_runner = state.target_graph_runner


@dataclass
class ShapeRegistry:
    """One worker's captured shapes and the live one."""

    startup: DraftShape
    states: dict[DraftShape, ShapeState]
    live: DraftShape
    switches: int = 0
    refused: dict[str, str] = field(default_factory=dict)  # label -> why it is not usable

    @classmethod
    def start(cls, worker: Any) -> ShapeRegistry:
        shape = startup_shape(worker)
        return cls(startup=shape, states={shape: state_of(worker, shape)}, live=shape)

    def add(self, state: ShapeState) -> None:
        reason = capture_reason(state)
        if reason is None:
            self.states[state.shape] = state
        else:
            self.refused[shape_label(state.shape)] = reason

    @property
    def chains(self) -> frozenset[int]:
        return frozenset(s.steps for s in self.states if s.topk == 1)

    @property
    def off(self) -> DraftShape | None:
        """OFF when it was captured (plain listed), else None."""
        return OFF if OFF in self.states else None

    @property
    def trees(self) -> frozenset[DraftShape]:
        return frozenset(s for s in self.states if s.topk > 1)

    def switch(self, worker: Any, shape: DraftShape) -> None:
        """Run `shape` from this iteration on (a no-op when it is live). On a failure part-way
        the previous shape is assigned again and the error raised."""
        if shape == self.live:
            return
        state = self.states[shape]
        previous = self.states[self.live]
        try:
            assign(worker, state)
        except Exception:
            assign(worker, previous)
            raise
        self.live = shape
        self.switches += 1

    def by_width(self, draft_tokens: int) -> DraftShape | None:
        """The captured shape that verifies `draft_tokens` per request, if only one does."""
        found = [s for s in self.states if s.draft_tokens == draft_tokens]
        return found[0] if len(found) == 1 else None

    def report(self) -> dict[str, Any]:
        return {
            "startup": self.startup.label,
            "live": shape_label(self.live),
            "switches": self.switches,
            "captured": {shape_label(s): st.report() for s, st in self.states.items()},
            "refused": dict(self.refused),
        }


@contextlib.contextmanager
def full_width(worker: Any, topk: int) -> Iterator[None]:
    """The speculative worker at the start-up top-k `topk` for SGLang's stub of a skipped
    extend (it sizes the draft input by the worker's top-k, which is 1 while off runs)."""
    live = worker.topk
    worker.topk = topk
    try:
        yield
    finally:
        worker.topk = live


# ----------------------------------------------------------------------------- the draft


@contextlib.contextmanager
def narrowed_draft(draft_worker: Any, draft_input: Any, topk: int) -> Iterator[None]:
    """The draft of a shape of top-k `topk` on a server whose draft input is wider: the draft
    worker at `topk` and the input's first `topk` columns, both restored afterwards."""
    wide = draft_worker.topk
    probs, tokens = getattr(draft_input, "topk_p", None), getattr(draft_input, "topk_index", None)
    draft_worker.topk = topk
    narrowed = False
    if probs is not None and tokens is not None and probs.shape[-1] > topk:
        draft_input.topk_p, draft_input.topk_index = probs[:, :topk], tokens[:, :topk]
        narrowed = True
    try:
        yield
    finally:
        draft_worker.topk = wide
        if narrowed:
            draft_input.topk_p, draft_input.topk_index = probs, tokens
