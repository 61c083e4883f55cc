"""Processes of a server, read from /proc (Linux): alive or not, its session, its memory.

A server started with setsid leads its own session, so every process it spawns (SGLang's
scheduler, detokenizer, ...) carries its pid as session id unless it starts a session itself.
"""

from __future__ import annotations

import os
from pathlib import Path

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _stat_fields(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    head, _, rest = raw.rpartition(")")
    return [head.split(" (", 1)[0], *rest.split()]


def pid_alive(pid: int) -> bool:
    """Running (a zombie waiting to be reaped counts as gone)."""
    fields = _stat_fields(pid)
    return fields is not None and fields[1] != "Z"


def session_pids(sid: int) -> set[int]:
    """Live processes whose session id is `sid` (the leader included)."""
    out = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        # fields: pid, state, ppid, pgrp, session, ...
        if fields is not None and fields[1] != "Z" and int(fields[4]) == sid:
            out.add(int(entry.name))
    return out


def rss_bytes(pid: int) -> int | None:
    try:
        pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return pages * _PAGE


def command_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def session_rss(sid: int) -> dict[int, tuple[str, int]]:
    """pid -> (command name, resident bytes) for every live process of the session."""
    out = {}
    for pid in sorted(session_pids(sid)):
        rss = rss_bytes(pid)
        if rss is not None:
            out[pid] = (command_name(pid), rss)
    return out
