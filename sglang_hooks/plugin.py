"""SGLang plugin entry point (`sglang.srt.plugins` group, name `specctl`).

SGLang calls `register()` wherever it runs `load_plugins()`, when `SGLANG_PLUGINS` is unset or
lists `specctl`: in 0.5.17 the launcher (which also runs the tokenizer and HTTP server), the
`Engine` entry point and each scheduler process; 0.5.23 also the detokenizer and the DP
controller. Those cover both sides the hooks need (tokenizer: push validation; scheduler:
the rest). It checks the installed SGLang first (guard.py, which parses sources and imports
nothing) and registers hooks only if every hooked symbol is as expected; otherwise it logs
one line and SGLang runs unmodified.

Registering imports no SGLang module beyond the hook registry: each hook goes to SGLang's
HookRegistry when the module it patches is imported (deferred.py), so a process that never
imports the scheduler or the speculative worker never pays for them.

Which hooks: the same wherever the plugin loads (through SGLANG_PLUGINS alone or started by
`specctl serve`), chosen by the adapter of the installed SGLang and by SPECCTL_OFF_PATH alone
(settings.py): the default runs the depth-0 pieces the adapter declares, `sglang` none; and
by SPECCTL_SHAPES, which adds the hooks that capture and switch draft shapes (shapes.py).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from sglang_hooks import guard, settings

if TYPE_CHECKING:
    from sglang_hooks.adapters.base import Adapter, HookSpec, OffPathFeature
    from sglang_hooks.deferred import DeferredHooks

logger = logging.getLogger("specctl")
DEFERRED: DeferredHooks | None = None  # this process's held hooks, once registered


def register() -> bool:
    """Register the hooks for this SGLang; False (and nothing registered) when unsupported."""
    global DEFERRED
    result = guard.evaluate()
    if result.adapter is None:
        logger.warning("specctl: plugin disabled, SGLang left unmodified: %s", result.reason)
        return False
    from sglang_hooks import deferred, hooks

    path = settings.OFF_PATH.get()
    features = off_path_features(result.adapter, path)
    hooks.bind(result.adapter, result.version, path, features)
    wanted = wanted_hooks(result.adapter, path)
    DEFERRED = deferred.install(
        [deferred.PendingHook(spec.target, getattr(hooks, spec.hook), spec.kind,
                              in_module="" if spec.symbol.cls else spec.symbol.module)
         for spec in wanted],
        source=_plugin_source(),
    )
    logger.info("specctl: %d hooks for SGLang %s (%s), applied as their modules are imported; "
                "depth 0 on the %s path (%s)", len(wanted), result.version, result.adapter.name,
                path, ", ".join(sorted(features)) or "SGLang's own depth 0")
    return True


def off_path_features(adapter: Adapter, path: str) -> frozenset[OffPathFeature]:
    """The depth-0 pieces this server runs: its adapter's, none on SGLang's own path."""
    return adapter.off_path if path == settings.SPECCTL else frozenset()


def wanted_hooks(adapter: Adapter, path: str | None = None) -> list[HookSpec]:
    """The adapter's hooks for depth 0 on `path` (default: SPECCTL_OFF_PATH's), and the
    shape hooks where SPECCTL_SHAPES lists shapes."""
    path = settings.OFF_PATH.get() if path is None else path
    return list(adapter.hooks_for(off_path_features(adapter, path),
                                  shapes=bool(settings.SHAPES.get())))


def _plugin_source() -> object:
    """The source SGLang's loader set for this plugin, kept for hooks registered later (the
    loader's context variable is reset once register() returns)."""
    try:
        from sglang.srt.plugins.hook_registry import _current_plugin_source

        return _current_plugin_source.get()
    except Exception:
        return None
