"""SGLang plugin entry point (`sglang.srt.plugins` group, name `specctl`).

SGLang calls `register()` wherever it runs `load_plugins()`, when `SGLANG_PLUGINS` is unset or
lists `specctl`: in 0.5.17 the launcher (which also runs the tokenizer and HTTP server), the
`Engine` entry point and each scheduler process; 0.5.23 also the detokenizer and the DP
controller. Those cover both sides the hooks need (tokenizer: push validation; scheduler:
the rest). It checks the installed SGLang first (guard.py) and registers hooks only if every
hooked symbol is as expected; otherwise it logs one line and SGLang runs unmodified.
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
