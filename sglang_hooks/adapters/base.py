"""What an adapter declares: the symbols it hooks (checked statically by the guard) and the
few accessors whose spelling differs between SGLang versions."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from sglang_hooks.contract import OffPathFeature

# Hook kinds, spelled like sglang.srt.plugins.hook_registry.HookType members.
AROUND, AFTER = "AROUND", "AFTER"
# The source a shape's capture names where it overrides SGLang's configuration (its logs).
SHAPE_CAPTURE_SOURCE = "specctl.shape_capture"
TOPK_FIELD = "speculative_eagle_topk"

__all__ = ["AFTER", "AROUND", "SHAPE_CAPTURE_SOURCE", "TOPK_FIELD", "Adapter", "HookSpec",
           "OffPathFeature", "ShapeBuild", "SymbolSpec"]


@dataclass(frozen=True)
class SymbolSpec:
    """A method (or, with `attribute`, a class field; with `instance`, an attribute that
    `__init__` assigns on `self`) the plugin relies on.

    `module`/`cls` say where it is *defined* (what the guard parses); `params` are the
    leading parameters after `self` that the hook reads, by position and name. An empty
    `cls` names a module-level function; its `params` are parameter names it must have
    (positional or keyword-only), since such a hook reads them by name. `reads`, for a
    function or method: source text its body must hold (as `ast.unparse` writes it), where the
    plugin relies on what SGLang reads there (where a builder takes top-k from).
    """

    module: str
    cls: str
    name: str
    params: tuple[str, ...] = ()
    is_async: bool = False
    attribute: bool = False
    instance: bool = False
    reads: str = ""

    @property
    def where(self) -> str:
        return f"{self.module}.{self.cls}.{self.name}" if self.cls else f"{self.module}.{self.name}"


@dataclass(frozen=True)
class HookSpec:
    """A hook to register: HookRegistry target, kind, the plugin function, its symbol."""

    target: str
    kind: str
    hook: str  # attribute name in sglang_hooks.hooks
    symbol: SymbolSpec
    feature: OffPathFeature | None = None  # the depth-0 piece it belongs to, if any
    shapes: bool = False  # registered only on a server given SPECCTL_SHAPES (shapes.py)


@dataclass(frozen=True)
class ShapeBuild:
    """What differs between releases in building one draft shape the way SGLang builds an
    adaptive state (shapes.capture). Each takes the speculative worker (EAGLEWorkerV2)."""

    # (worker, top-k): a context inside which SGLang's builders read that top-k (the backends
    # and graph runners take it from the configuration, not from the worker); what they read
    # is put back on exit, also when the build raised
    topk: Callable[[Any, int], AbstractContextManager[None]]
    # the contexts SGLang's init_cuda_graphs builds its adaptive states under (draft TP, MoE)
    contexts: Callable[[Any], AbstractContextManager[None]]
    # the class that captures the target verify graphs, as SGLang's state builder picks it;
    # None: this platform captures none
    target_graph_runner: Callable[[Any], Any]


@dataclass(frozen=True)
class Adapter:
    name: str
    min_version: tuple[int, int, int]
    max_version: tuple[int, int, int]
    hooks: tuple[HookSpec, ...]
    # The depth-0 pieces this SGLang runs (OffPathFeature): measured there, chosen here.
    off_path: frozenset[OffPathFeature] = frozenset()
    # Symbols read but not hooked (fields of result objects and the like).
    reads: tuple[SymbolSpec, ...] = ()
    # Symbols only a shape server's build reads (checked where SPECCTL_SHAPES lists shapes).
    shape_reads: tuple[SymbolSpec, ...] = ()
    # self of the set/get_internal_state hook -> the Scheduler.
    scheduler_of: Callable[[Any], Any] = field(default=lambda obj: obj)
    # (result, batch size) -> tokens emitted by that decode iteration, bonus included.
    tokens_of: Callable[[Any, int], int] = field(default=lambda result, bs: 0)
    # How this SGLang builds a draft shape (shapes.py); None where shapes are not supported.
    shape_build: ShapeBuild | None = None

    @property
    def versions(self) -> str:
        lo, hi = self.min_version, self.max_version
        return f"{'.'.join(map(str, lo))} to {'.'.join(map(str, hi))}"

    def symbols(self, shapes: bool = True) -> tuple[SymbolSpec, ...]:
        """What the guard checks; without `shapes` (no SPECCTL_SHAPES) not what only a shape
        server hooks or reads, so a release that moved one of those still runs chains."""
        hooked = tuple(h.symbol for h in self.hooks if shapes or not h.shapes)
        return hooked + self.reads + (self.shape_reads if shapes else ())

    @property
    def switches_shapes(self) -> bool:
        """Whether this SGLang can capture and switch draft shapes: it declares their hooks and
        how a shape is built."""
        return self.shape_build is not None and any(h.shapes for h in self.hooks)

    def hooks_for(self, features: frozenset[OffPathFeature],
                  shapes: bool = False) -> tuple[HookSpec, ...]:
        """The hooks to register when depth 0 runs `features` (of those this adapter
        declares): every hook outside the off path, and those of the pieces that run; the
        shape hooks only on a server that lists shapes."""
        running = features & self.off_path
        return tuple(h for h in self.hooks
                     if (h.feature is None or h.feature in running) and (shapes or not h.shapes))
