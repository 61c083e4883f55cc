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
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from sglang_hooks import guard

if TYPE_CHECKING:
    from sglang_hooks.adapters.base import Adapter, HookSpec
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

    hooks.bind(result.adapter, result.version)
    wanted = wanted_hooks(result.adapter)
    DEFERRED = deferred.install(
        [deferred.PendingHook(spec.target, getattr(hooks, spec.hook), spec.kind,
                              in_module="" if spec.symbol.cls else spec.symbol.module)
         for spec in wanted],
        source=_plugin_source(),
    )
    logger.info("specctl: %d hooks for SGLang %s (%s), applied as their modules are imported",
                len(wanted), result.version, result.adapter.name)
    return True


def wanted_hooks(adapter: Adapter) -> list[HookSpec]:
    """The adapter's hooks, less those of switches the server's environment leaves off."""
    from sglang_hooks import lean_host, plain_decode, verify_schedule

    return [spec for spec in adapter.hooks
            if (verify_schedule.ENABLED or spec.hook not in verify_schedule.HOOKS)
            and (plain_decode.ENABLED or spec.hook not in plain_decode.HOOKS)
            and (lean_host.PREPARE_ENABLED or spec.hook not in lean_host.PREPARE_HOOKS)]


def _plugin_source() -> object:
    """The source SGLang's loader set for this plugin, kept for hooks registered later (the
    loader's context variable is reset once register() returns)."""
    try:
        from sglang.srt.plugins.hook_registry import _current_plugin_source

        return _current_plugin_source.get()
    except Exception:
        return None
