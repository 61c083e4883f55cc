"""The speculative server's log: which parts were written while a table held control, the
SGLang lines counted there, and a trimmed copy small enough to ship.

`ControlMonitor` polls `/server_info` a few times a second and records the log's size at each
poll; a stretch between two polls that both saw a specctl table live is a control window.
SGLang's own depth choice logs "Adaptive spec params updated" when it changes depth: under a
table that must never happen (the plugin owns the choice). "Switch adaptive runtime state" is
logged at every depth change, forced ones included: it shows the pushes took effect.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx

from sglang_hooks.contract import PolicyError, read_server_state

SGLANG_OWN_CHOICE = "Adaptive spec params updated"
RUNTIME_SWITCH = "Switch adaptive runtime state"
COUNTED_LINES = (SGLANG_OWN_CHOICE, RUNTIME_SWITCH)


def log_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


class ControlMonitor:
    """Background poller: byte windows of `log` written while `url` had a table live."""

    def __init__(self, url: str, log: Path, headers: dict[str, str] | None = None,
                 interval_s: float = 0.25) -> None:
        self.url = url
        self.log = log
        self.headers = headers or {}
        self.interval_s = interval_s
        self.windows: list[tuple[int, int]] = []
        self.polls = 0
        self.failed_polls = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _table_live(self, client: httpx.Client) -> bool | None:
        try:
            ranks = read_server_state(client.get("/server_info").json())
        except (httpx.HTTPError, ValueError, PolicyError):
            return None
        return all(r.get("table") is not None for r in ranks)

    def _run(self) -> None:
        last: tuple[bool, int] | None = None
        with httpx.Client(base_url=self.url, headers=self.headers, timeout=5.0) as client:
            while not self._stop.is_set():
                live = self._table_live(client)
                size = log_size(self.log)
                self.polls += 1
                if live is None:
                    self.failed_polls += 1
                    last = None
                else:
                    if last is not None and last[0] and live and size > last[1]:
                        self.windows.append((last[1], size))
                    last = (live, size)
                self._stop.wait(self.interval_s)

    def start(self) -> ControlMonitor:
        self._thread = threading.Thread(target=self._run, name="control-monitor", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> list[tuple[int, int]]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        return self.windows


def count_lines(log: Path, windows: Iterable[Iterable[int]],
                patterns: tuple[str, ...] = COUNTED_LINES) -> dict[str, dict[str, int]]:
    """{pattern: {"total": n, "under_table": m}} over the whole log and inside the windows."""
    spans = sorted((int(a), int(b)) for a, b in (tuple(w) for w in windows))
    out = {p: {"total": 0, "under_table": 0} for p in patterns}
    try:
        fh = log.open("rb")
    except OSError:
        return out
    with fh:
        offset = 0
        i = 0
        for raw in fh:
            start, offset = offset, offset + len(raw)
            line = raw.decode(errors="replace")
            hits = [p for p in patterns if p in line]
            if not hits:
                continue
            while i < len(spans) and spans[i][1] <= start:
                i += 1
            inside = i < len(spans) and spans[i][0] <= start < spans[i][1]
            for p in hits:
                out[p]["total"] += 1
                out[p]["under_table"] += int(inside)
    return out


_PREFILL = re.compile(r"Prefill batch\b.*?#new-token: (\d+),.*?cuda graph: (True|False)")


def prefill_graph_counts(log: Path) -> dict[str, int]:
    """SGLang's "Prefill batch" lines: how many ran on the prefill CUDA graph, how many eager,
    and how many of those had one new token. A prompt the prefix cache holds whole leaves one
    token, and one token pads to a graph bucket of four, more than twice the batch: SGLang
    then runs the prefill eager, on a server without speculation (an EAGLE server's cache
    leaves two). On a trimmed log only the head and tail lines are counted."""
    out = {"graphed": 0, "eager": 0, "eager_one_token": 0}
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return out
    for match in _PREFILL.finditer(text):
        if match.group(2) == "True":
            out["graphed"] += 1
        else:
            out["eager"] += 1
            out["eager_one_token"] += int(match.group(1) == "1")
    return out


_VARYING = re.compile(r"\d+(\.\d+)?")


def template(line: str) -> str:
    """A log line with its numbers replaced, so repeats of one message count together."""
    return _VARYING.sub("#", line.strip())[:200]


def trim_log(src: Path, dst: Path, head: int = 300, tail: int = 600,
             top: int = 40) -> dict[str, Any]:
    """Write head and tail of `src` to `dst`, with counts of the repeated lines in between."""
    lines = src.read_text(errors="replace").splitlines()
    middle = lines[head:-tail] if len(lines) > head + tail else []
    counts = Counter(template(line) for line in middle)
    with dst.open("w") as out:
        if not middle:
            out.write("\n".join(lines) + "\n")
        else:
            out.write("\n".join(lines[:head]) + "\n")
            out.write(f"\n===== {len(middle)} lines left out; the most repeated (numbers as #):\n")
            for text, n in counts.most_common(top):
                out.write(f"{n:8d}  {text}\n")
            out.write(f"===== end of the left-out part; last {tail} lines:\n\n")
            out.write("\n".join(lines[-tail:]) + "\n")
    return {"lines": len(lines), "left_out": len(middle), "bytes": log_size(src)}


def main(argv: list[str] | None = None) -> int:
    """`python -m benchmarks.gpu.server_log LOG...`: each log's prefill batches by graph."""
    import sys

    paths = sys.argv[1:] if argv is None else argv
    if not paths:
        print("usage: python -m benchmarks.gpu.server_log LOG [LOG...]", file=sys.stderr)
        return 2
    for path in paths:
        if not Path(path).is_file():
            print(f"error: {path}: no such log", file=sys.stderr)
            return 2
        c = prefill_graph_counts(Path(path))
        print(f"{path}: {c['graphed']} prefill batches on the CUDA graph, {c['eager']} eager "
              f"({c['eager_one_token']} of them with one new token)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
