"""What every step of a command works with: the options, the run's state, the time budget,
the servers' URLs and the prompts (built-in word prompts, or the dataset's)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.gpu import servers
from benchmarks.gpu.greedy import GreedyPrompt, dataset_prompts
from benchmarks.gpu.greedy import word_prompts as make_word_prompts
from benchmarks.gpu.model_folders import ModelFolders
from benchmarks.gpu.options import Options
from benchmarks.gpu.state import RunState
from controller.bench.prompts import Prompt, load_dataset, synthetic_prompts


class StepError(RuntimeError):
    """A step could not do its job; the message says why and what to do. `result` keeps what
    it measured before it failed."""

    def __init__(self, message: str, result: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.result = result


# Kept back from a command's --budget for the summary, the archive and stopping the servers.
BUDGET_RESERVE_S = 40.0


@dataclass
class Run:
    opts: Options
    state: RunState
    deadline: float | None = None  # time.monotonic() by which this command must be done
    # Writes the summary and packs --out-tar; a long step calls it after each part it
    # finishes, so a command cut short still brings back what it measured.
    on_checkpoint: Callable[[], None] | None = None

    def time_left(self) -> float:
        """Seconds this command may still spend on steps (inf without --budget)."""
        if self.deadline is None:
            return float("inf")
        return self.deadline - BUDGET_RESERVE_S - time.monotonic()

    def cap(self, timeout_s: float) -> float:
        """A subprocess timeout shortened to what the budget leaves."""
        return max(5.0, min(timeout_s, self.time_left()))

    def checkpoint(self) -> None:
        if self.on_checkpoint is not None:
            self.on_checkpoint()

    @property
    def dir(self) -> Path:
        return self.state.run_dir

    def say(self, text: str) -> None:
        print(text, flush=True)

    @property
    def admin_key(self) -> str:
        return str(self.state.data["admin_key"])

    def url(self, role: str) -> str:
        url = self.state.url(role)
        if url is None:
            fix = " with --start-order spec,plain (the default; spec starts no plain server)" \
                if role == servers.PLAIN else ""
            raise StepError(f"no {role} server in {self.state.path}: this step needs it; run "
                            f"the `setup` step{fix}")
        return url

    def require_servers(self, *roles: str) -> None:
        """Each of `roles` (default: both servers) answers /health, or StepError."""
        for role in roles or (servers.SPEC, servers.PLAIN):
            url = self.url(role)
            if not servers.healthy(url):
                raise StepError(f"the {role} server at {url} does not answer /health: "
                                 f"run the `setup` step (log: {self.dir / 'logs'})")

    def models(self) -> ModelFolders | None:
        data = self.state.data.get("models")
        return None if data is None else ModelFolders.from_json(data)

    def families(self) -> dict[str, Path]:
        """The seeded build's prompt families by name ("a" for family_a.jsonl, ...)."""
        models = self.models()
        paths = [Path(p) for p in models.datasets] if models is not None else []
        return {p.stem.removeprefix("family_"): p for p in paths}

    def dataset(self) -> Path | None:
        if self.opts.dataset is not None:
            return Path(self.opts.dataset)
        models = self.models()
        return Path(models.datasets[0]) if models is not None and models.datasets else None

    def prompt_file(self) -> Path:
        """The run's prompts as a file: its dataset, or synthetic prompts written once (for
        steps that hand a file to another tool)."""
        dataset = self.dataset()
        if dataset is not None:
            return dataset
        path = self.dir / "prompts" / f"synthetic_{self.opts.prompt_tokens}.jsonl"
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("".join(
                json.dumps({"prompt": p.text, "output_tokens": p.output_tokens}) + "\n"
                for p in synthetic_prompts(512, self.opts.prompt_tokens,
                                           self.opts.output_tokens)))
        return path

    def greedy_prompts(self) -> list[GreedyPrompt]:
        dataset = self.dataset()
        if dataset is not None:
            return dataset_prompts(dataset, self.opts.greedy_prompts)
        return make_word_prompts(self.opts.greedy_prompts)

    def load_prompts(self) -> list[Prompt]:
        dataset = self.dataset()
        if dataset is not None:
            return load_dataset(dataset, self.opts.output_tokens)
        return synthetic_prompts(512, self.opts.prompt_tokens, self.opts.output_tokens)
