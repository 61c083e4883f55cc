"""Processes read from /proc (Linux): alive or not, a server's session, memory, CPU time and
command line.

A server started with setsid leads its own session, so every process it spawns (SGLang's
scheduler, detokenizer, ...) carries its pid as session id unless it starts a session itself.
"""

from __future__ import annotations

import os
from pathlib import Path

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


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


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of `pid` so far (None: gone)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw.rpartition(")")[2].split()
    # After the name: state is field 3 of stat, utime and stime fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / _TICK


def all_cpu_seconds() -> dict[int, float]:
    out = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (s := cpu_seconds(int(entry.name))) is not None:
            out[int(entry.name)] = s
    return out


def cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def label_of(pid: int) -> str:
    line = " ".join(cmdline(pid).split())
    name = command_name(pid)
    return f"{name}: {line[:100]}" if line and not line.startswith(name) else line[:100] or name
