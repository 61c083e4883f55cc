"""Agreement between the tensor-parallel ranks of one server before any table takes control.

Every TP rank runs its own copy of the plugin. A rank where the plugin is not loaded (not
installed on that node, refused by the version guard) or that started with other settings
would run other work than its peers, and the ranks of one forward pass would hang in their
collectives. What must match (the fingerprint `hooks.py` publishes): the SGLang adapter, the
depths a table may use, the start-up table, what depth 0 runs (the off path and the adapter's
pieces of it) and SGLang's own skip-extend variable. On a shape server (`SPECCTL_SHAPES`,
shapes.py) also the shape list, in its order, and the start-up shape that dominates it; there
the start-up table is the one its file holds, before the capture it is checked against. So,
before a table steers:

1. at start-up (when SGLang has built its adaptive states; on a shape server, once SGLang has
   captured its own graphs and before the plugin captures the listed shapes), every plugin
   rank writes `specctl/rank/<rank>` = its fingerprint into torch.distributed's default store,
   the TCPStore every rank of the process group reaches (SGLang creates it with
   `init_process_group` during model-runner start-up);
2. at the first moment a table could take control on that rank (first decode launch,
   first push, first state report; on a shape server right away, since capturing the target
   runs TP collectives and a rank capturing another list, or none, would hang the others),
   the rank reads every peer's key, waiting at most `WAIT_S` for missing ones (never blocking
   beyond that), and forms its verdict: agree, or refuse with the reason;
3. the verdict goes through one `compare_set` on `specctl/verdict`: the first rank to decide
   writes it, every later rank reads it back and adopts it. All plugin ranks therefore reach
   the same verdict even when one of them was slow, and a refusal leaves every rank on
   SGLang's own choice (a shape server's start-up shape, nothing captured), which is what a
   rank without the plugin runs too.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

KEY_PREFIX = "specctl/rank/"
VERDICT_KEY = "specctl/verdict"
AGREED = "agreed"
# How long a rank waits for a peer's key before it takes that peer to run without the plugin.
WAIT_S = 20.0
_POLL_S = 0.05
# What a refusal says after its cause: what steering would break, then the fix. A shape
# server's check says its own (hooks.build_shapes).
STAKE = "a table would run different depths on different ranks"
FIX = "start every node with the same specctl arguments, policy file and SGLang"
SHAPES_STAKE = "a rank capturing other shapes, or none, would hang the others"
SHAPES_FIX = ("start every node with the same SPECCTL_SHAPES, specctl arguments, policy file "
              "and SGLang")


def fingerprint(fields: Mapping[str, Any]) -> str:
    """What must be equal on every rank, as one comparable string."""
    return json.dumps(dict(fields), sort_keys=True, separators=(",", ":"))


class PeerCheck:
    """One rank's side of the agreement. `store` is a torch.distributed Store."""

    def __init__(self, store: Any, rank: int, world_size: int, wait_s: float = WAIT_S,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, *, stake: str = STAKE,
                 fix: str = FIX) -> None:
        self.store = store
        self.rank = rank
        self.world_size = world_size
        self.wait_s = wait_s
        self._clock = clock
        self._sleep = sleep
        self.stake = stake
        self.fix = fix

    def publish(self, mine: str) -> None:
        self.mine = mine
        self.store.set(f"{KEY_PREFIX}{self.rank}", mine)

    def verdict(self) -> str | None:
        """None when every rank agrees, else the reason to refuse (the same on every rank)."""
        decided = self._decided()
        if decided is None:
            local = self._local_verdict()
            decided = self._as_text(self.store.compare_set(VERDICT_KEY, "", local))
        return None if decided == AGREED else decided

    def _decided(self) -> str | None:
        if self.store.check([VERDICT_KEY]):
            return self._as_text(self.store.get(VERDICT_KEY))
        return None

    def _local_verdict(self) -> str:
        keys = {r: f"{KEY_PREFIX}{r}" for r in range(self.world_size)}
        deadline = self._clock() + self.wait_s
        missing = [r for r, k in keys.items() if not self.store.check([k])]
        while missing and self._clock() < deadline:
            decided = self._decided()  # another rank may have settled it meanwhile
            if decided is not None:
                return decided
            self._sleep(_POLL_S)
            missing = [r for r in missing if not self.store.check([keys[r]])]
        if missing:
            return (f"TP rank(s) {missing} of {self.world_size} published no specctl state "
                    f"within {self.wait_s:g} s (plugin not installed or inactive there); "
                    f"{self.stake}; {self.fix}")
        values = {r: self._as_text(self.store.get(keys[r])) for r in keys}
        differing = sorted(r for r, v in values.items() if v != values[0])
        if differing:
            return (f"TP ranks disagree: rank 0 has {values[0]}, rank {differing[0]} has "
                    f"{values[differing[0]]}; {self.fix}")
        return AGREED

    @staticmethod
    def _as_text(value: Any) -> str:
        return value.decode() if isinstance(value, bytes | bytearray) else str(value)


def default_peer_check(wait_s: float | None = None, *, stake: str = STAKE,
                       fix: str = FIX) -> PeerCheck | None:
    """The check over torch.distributed's default process group, or None when this process
    is its only rank (or runs without torch.distributed: nothing to agree with). `stake` and
    `fix` word its refusal."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized() or dist.get_world_size() <= 1:
        return None
    from torch.distributed import distributed_c10d

    store = distributed_c10d._get_default_store()
    return PeerCheck(store, dist.get_rank(), dist.get_world_size(),
                     WAIT_S if wait_s is None else wait_s, stake=stake, fix=fix)
