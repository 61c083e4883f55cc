"""Every variable the plugin reads from the server's environment, declared once.

One registry (`Environment`), one parser per kind of value, each declaration with its type,
its default and why it exists: plugin code reads the declared object (`OFF_PATH.get()`),
never `os.environ` itself. A value that does not parse gets one logged error line naming the
variable and what it accepts, and the default is used: a typo must not stop a server.
"""

from __future__ import annotations

import logging
import os
from typing import Generic, TypeVar

from sglang_hooks import contract
from sglang_hooks.draft_shape import Shape, ShapeError, parse_shapes

logger = logging.getLogger("specctl")

T = TypeVar("T")

# What the plugin runs at depth 0 ("off"): its own path (the pieces the SGLang version's
# adapter declares, sglang_hooks/adapters/) or SGLang's own depth 0, unchanged.
SPECCTL, SGLANG = contract.OFF_PATH_SPECCTL, contract.OFF_PATH_SGLANG

_reported: set[tuple[str, str]] = set()  # (variable, bad value) already logged


class Setting(Generic[T]):
    """One environment variable: its name (the attribute's in `Environment`), its default
    and why it exists. `get` reads it now (the server's environment does not change)."""

    def __init__(self, default: T, why: str) -> None:
        self.default = default
        self.why = why
        self.name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def parse(self, raw: str) -> T:
        """The value of a set, non-blank variable. Raises ValueError saying what it accepts."""
        raise NotImplementedError

    def get(self) -> T:
        raw = os.environ.get(self.name, "").strip()
        if not raw:
            return self.default
        try:
            return self.parse(raw)
        except ValueError as err:
            if (self.name, raw) not in _reported:  # one line per process, not one per read
                _reported.add((self.name, raw))
                logger.error("specctl: %s=%r %s; using %r", self.name, raw, err, self.default)
            return self.default


class Choice(Setting[str]):
    """One of a few words."""

    def __init__(self, default: str, accepted: tuple[str, ...], why: str) -> None:
        super().__init__(default, why)
        self.accepted = accepted

    def parse(self, raw: str) -> str:
        if raw not in self.accepted:
            raise ValueError(f"is not one of {', '.join(self.accepted)}")
        return raw


class Text(Setting[str | None]):
    """Free text such as a path; unset or blank is None."""

    def __init__(self, why: str) -> None:
        super().__init__(None, why)

    def parse(self, raw: str) -> str | None:
        return raw


class ShapeList(Setting[tuple[Shape, ...]]):
    """Draft shapes like `3x1x4,3x4x16`; unset or blank is none."""

    def __init__(self, why: str) -> None:
        super().__init__((), why)

    def parse(self, raw: str) -> tuple[Shape, ...]:
        try:
            return tuple(parse_shapes(raw))
        except ShapeError as err:
            raise ValueError(f"is not a shape list ({err})") from None


class Environment:
    """The registry: every variable the plugin reads."""

    SPECCTL_OFF_PATH = Choice(
        SPECCTL, (SPECCTL, SGLANG),
        # The default is what was measured: depth 0 at 0.98-1.00 of a plain server's tok/s at
        # 1-128 streams on an H100 and an H200, greedy outputs identical to a plain server's
        # over 1,000 depth switches (docs/sglang.md, "Off"). The fallback is for a user who
        # suspects the plugin's depth 0 (an SGLang patch of their own, say): SGLang's own
        # depth 0 then runs unchanged, at the cost of the draft extend every depth-0
        # iteration (depth 0 then measured 0.89-0.91 of a plain server's tok/s).
        why="what depth 0 runs: `specctl` (default), the plugin's measured depth-0 path for "
            "this SGLang version; `sglang`, SGLang's own depth 0 unchanged (the draft extend "
            "every iteration, no off-path hook registered)",
    )
    SPECCTL_POLICY_FILE = Text(
        why="a frozen start-up table (YAML or JSON with a `table:`), applied once the adaptive "
            "states are built (policy_file.py); `specctl serve --policy-file` sets it",
    )
    SPECCTL_SHAPES = ShapeList(
        why="the draft shapes a tree server captures beside its start-up shape, which must "
            "dominate them (shapes.py); unset, a server runs SGLang's adaptive chains only",
    )
    SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND = Text(
        why="SGLang's own switch for skipping the draft extend at depth 0: not the plugin's, "
            "read only so that the TP ranks compare it before a table steers (peers.py)",
    )


ENVIRONMENT = Environment()
OFF_PATH = ENVIRONMENT.SPECCTL_OFF_PATH
POLICY_FILE = ENVIRONMENT.SPECCTL_POLICY_FILE
SHAPES = ENVIRONMENT.SPECCTL_SHAPES
SGLANG_SKIP_EXTEND = ENVIRONMENT.SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND
