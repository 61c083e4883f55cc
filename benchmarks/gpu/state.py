"""DIR/state.json: what one harness run knows across commands (servers, models, steps).

Each command of a run loads it, adds what it did and writes it back atomically, so a
later command (possibly minutes later, in another process) continues where the last stopped.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

STATE_FILE = "state.json"


class RunState:
    def __init__(self, run_dir: Path, data: dict[str, Any] | None = None) -> None:
        self.run_dir = run_dir
        self.data: dict[str, Any] = data or {}
        self.data.setdefault("created_at", time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        self.data.setdefault("options", {})
        self.data.setdefault("servers", {})
        self.data.setdefault("steps", {})
        self.data.setdefault("control_windows", [])
        self.data.setdefault("commands", [])

    @property
    def path(self) -> Path:
        return self.run_dir / STATE_FILE

    @staticmethod
    def load(run_dir: Path) -> RunState:
        path = run_dir / STATE_FILE
        if not path.is_file():
            return RunState(run_dir)
        try:
            data = json.loads(path.read_text())
        except ValueError as err:
            raise ValueError(f"{path}: not valid JSON ({err}); move it away to start afresh") \
                from None
        return RunState(run_dir, data)

    def save(self) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(self.data, indent=2, default=str) + "\n")
        os.replace(tmp, self.path)

    # ------------------------------------------------------------------ accessors

    @property
    def servers(self) -> dict[str, dict[str, Any]]:
        servers: dict[str, dict[str, Any]] = self.data["servers"]
        return servers

    def url(self, role: str) -> str | None:
        server = self.servers.get(role)
        return None if server is None else str(server["url"])

    def step(self, name: str) -> dict[str, Any]:
        steps: dict[str, dict[str, Any]] = self.data["steps"]
        return steps.setdefault(name, {})

    def record_step(self, name: str, status: str, elapsed_s: float, result: Any = None,
                    error: str | None = None) -> None:
        entry = self.step(name)
        entry.update(status=status, elapsed_s=round(elapsed_s, 1), error=error,
                     finished_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
        entry["result"] = result
        entry["runs"] = int(entry.get("runs", 0)) + 1
        self.save()

    def add_control_windows(self, windows: list[tuple[int, int]]) -> None:
        """Byte ranges of the speculative server's log written while a table held control."""
        merged = sorted([tuple(w) for w in self.data["control_windows"]] + windows)
        out: list[list[int]] = []
        for start, end in merged:
            if out and start <= out[-1][1]:
                out[-1][1] = max(out[-1][1], end)
            else:
                out.append([start, end])
        self.data["control_windows"] = out
        self.save()
