"""SGLang plugin entry point (`sglang.srt.plugins` group, name `specctl`).

SGLang calls `register()` in every process it starts (launcher, tokenizer/HTTP, schedulers,
detokenizer, DP controller) when `SGLANG_PLUGINS` includes `specctl`. It checks the installed
SGLang first (guard.py) and registers hooks only if every hooked symbol is as expected;
otherwise it logs one line and SGLang runs unmodified.
"""

from __future__ import annotations

import logging

from sglang_hooks import guard

logger = logging.getLogger("specctl")


def register() -> bool:
    """Register the hooks for this SGLang; False (and nothing registered) when unsupported."""
    result = guard.evaluate()
    if result.adapter is None:
        logger.warning("specctl: plugin disabled, SGLang left unmodified: %s", result.reason)
        return False
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sglang_hooks import hooks

    hooks.bind(result.adapter)
    for spec in result.adapter.hooks:
        HookRegistry.register(spec.target, getattr(hooks, spec.hook), HookType[spec.kind])
    logger.info("specctl: %d hooks registered for SGLang %s (%s)", len(result.adapter.hooks),
                result.version, result.adapter.name)
    return True
