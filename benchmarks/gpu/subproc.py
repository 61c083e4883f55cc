"""Run a command with a hard timeout, its output in a file (the harness's other tools)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Finished:
    argv: list[str]
    returncode: int | None  # None: killed at the timeout
    seconds: float
    log: Path

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    def describe(self) -> str:
        what = "timed out" if self.timed_out else f"exit status {self.returncode}"
        return f"{Path(self.argv[0]).name} ... {what} after {self.seconds:.0f} s (log {self.log})"


def run_logged(argv: Sequence[str], log: Path, timeout_s: float,
               env: dict[str, str] | None = None) -> Finished:
    """Run `argv` in its own process group, stdout and stderr to `log`; on timeout SIGTERM the
    group, then SIGKILL it 10 s later."""
    log.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, env={**os.environ, "COLUMNS": "160", **(env or {})},
        )  # fmt: skip
        try:
            code: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            code = None
            for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
    return Finished(list(argv), code, time.monotonic() - t0, log)
