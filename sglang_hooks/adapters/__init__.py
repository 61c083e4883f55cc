"""One small module per SGLang layout. The guard (sglang_hooks/guard.py) picks the one whose
every hooked symbol and signature is present in the installed SGLang; nothing else in the
plugin asks which version it runs on.
"""

from __future__ import annotations

from sglang_hooks.adapters import v0_5_17, v0_5_23
from sglang_hooks.adapters.base import Adapter, HookSpec, SymbolSpec

# Newest first: the first adapter whose symbols all check out is used.
ADAPTERS: tuple[Adapter, ...] = (v0_5_23.ADAPTER, v0_5_17.ADAPTER)

__all__ = ["ADAPTERS", "Adapter", "HookSpec", "SymbolSpec"]
