"""Register hooks with SGLang's HookRegistry only once their target module is imported.

SGLang's `HookRegistry.apply_hooks()` (0.5.17 to 0.5.23) resolves every registered target
right away, importing its module: registering the plugin's targets eagerly would make every
SGLang process (launcher, detokenizer, DP controller, schedulers) import the scheduler, the
speculative worker and their dependencies, about a thousand modules, whether it uses them
or not. Instead, a target whose module is already imported is registered at once; the others
wait for their module's import to finish (a finder on `sys.meta_path` wraps that module's
loader), then are registered and applied through HookRegistry as usual, so SGLang's own
patching (wrapper chain, propagation to `from X import Y` bindings) does the work.

Standard library only, on purpose: this module runs in every SGLang process, and a post-import
hook library would be a new dependency on machines that install SGLang offline.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

logger = logging.getLogger("specctl")


@dataclass(frozen=True)
class PendingHook:
    target: str  # "package.module.Class.method" or "package.module.function"
    hook: Callable[..., Any]
    kind: str  # a HookType member name: "AROUND", "AFTER", ...
    in_module: str = ""  # the target's module where it is not everything before Class.method

    @property
    def module(self) -> str:
        """The module the target lives in: everything before `Class.method` unless given."""
        return self.in_module or self.target.rsplit(".", 2)[0]


class _Apply:
    """Registers hooks through SGLang's HookRegistry and applies them."""

    def __init__(self, source: Any = None) -> None:
        self.source = source

    def __call__(self, hooks: Sequence[PendingHook]) -> None:
        from sglang.srt.plugins.hook_registry import HookRegistry, HookType

        for h in hooks:
            HookRegistry.register(h.target, h.hook, HookType[h.kind], source=self.source)
        HookRegistry.apply_hooks()  # idempotent: targets already patched are skipped


class _LoaderWithCallback(importlib.abc.Loader):
    """Runs the real loader, then the callback, for one module."""

    def __init__(self, loader: Any, callback: Callable[[ModuleType], None]) -> None:
        self._loader = loader
        self._callback = callback

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        create = getattr(self._loader, "create_module", None)
        return None if create is None else create(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        self._callback(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, is_package, ...
        return getattr(self._loader, name)


class DeferredHooks(importlib.abc.MetaPathFinder):
    """Holds hooks until their module is imported. One instance per process."""

    def __init__(self, apply: Callable[[Sequence[PendingHook]], None]) -> None:
        self._apply = apply
        self._pending: dict[str, list[PendingHook]] = {}
        self._lock = threading.Lock()
        self._finding = threading.local()
        self.applied: list[str] = []  # modules whose hooks went to HookRegistry, in order
        self.failed: list[str] = []

    def add(self, hooks: Sequence[PendingHook]) -> None:
        """Register the hooks of imported modules now; hold the rest for their import."""
        ready: list[PendingHook] = []
        with self._lock:
            for h in hooks:
                if h.module in sys.modules:
                    ready.append(h)
                else:
                    self._pending.setdefault(h.module, []).append(h)
            if self._pending and self not in sys.meta_path:
                sys.meta_path.insert(0, self)
        if ready:
            self._run({h.module for h in ready}, ready)

    @property
    def pending_modules(self) -> list[str]:
        with self._lock:
            return sorted(self._pending)

    def find_spec(self, fullname: str, path: Any = None, target: Any = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self._pending or getattr(self._finding, "active", False):
            return None
        self._finding.active = True
        try:
            spec = self._real_spec(fullname, path, target)
        finally:
            self._finding.active = False
        if spec is None:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            # Nothing to wrap (namespace package, unusual loader): import as usual, unhooked.
            logger.warning("specctl: cannot hook %s (its loader %r runs no exec_module); SGLang "
                           "runs it unmodified", fullname, spec.loader)
            return spec
        spec.loader = _LoaderWithCallback(spec.loader, self._imported)
        return spec

    def _real_spec(self, fullname: str, path: Any, target: Any
                   ) -> importlib.machinery.ModuleSpec | None:
        for finder in sys.meta_path:
            if finder is self:
                continue
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                return spec
        return None

    def _imported(self, module: ModuleType) -> None:
        with self._lock:
            hooks = self._pending.pop(module.__name__, [])
            if not self._pending and self in sys.meta_path:
                sys.meta_path.remove(self)
        if hooks:
            self._run({module.__name__}, hooks)

    def _run(self, modules: set[str], hooks: Sequence[PendingHook]) -> None:
        # Never let a patching failure break SGLang's import: the module stays unpatched
        # and the plugin's hooks simply never run there.
        try:
            self._apply(hooks)
            self.applied.extend(sorted(modules))
        except Exception:
            self.failed.extend(sorted(modules))
            logger.exception("specctl: could not hook %s; SGLang runs it unmodified",
                             ", ".join(sorted(modules)))


def install(hooks: Sequence[PendingHook], source: Any = None) -> DeferredHooks:
    deferred = DeferredHooks(_Apply(source))
    deferred.add(hooks)
    return deferred
