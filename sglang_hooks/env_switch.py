"""An on/off plugin setting read from the server's environment at start-up."""

from __future__ import annotations

import os


def read_switch(env: str, what: str) -> tuple[bool, str | None]:
    """(on, error): `env` as 0 or 1 (absent or empty: off), and why it was ignored if it was."""
    raw = os.environ.get(env, "").strip()
    if raw in ("", "0"):
        return False, None
    if raw == "1":
        return True, None
    return False, f"{env}={raw!r} is not 0 or 1; {what} stay off"
