"""Greedy lossless check: at temperature 0 the speculative server must emit the tokens the
plain server emits, also while pushes switch its depth in the middle of a request.

Requests go one at a time (batch 1) to SGLang's native `/generate` with `input_ids` (prompts
made of vocabulary word ids) or `text` (dataset prompts), `ignore_eos`, and `output_ids` are
compared. With random weights the logit margins are small, so a numerically different kernel
(verify vs. decode) can flip an argmax: divergences are counted and reported per prompt, with
the plain server run twice to show its own run-to-run agreement, rather than failing hard.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from benchmarks.gpu.tokenizer import bench_words, encode_words
from controller.bench.prompts import load_dataset
from controller.bench.server_client import ServerClient
from sglang_hooks.contract import push_body, single_depth_table


class GreedyError(RuntimeError):
    """A server did not answer a generation in the expected form."""


@dataclass(frozen=True)
class GreedyPrompt:
    name: str
    input_ids: tuple[int, ...] | None = None
    text: str | None = None

    def body(self, max_new_tokens: int) -> dict[str, Any]:
        body: dict[str, Any] = {"sampling_params": {
            "temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True}}
        if self.input_ids is not None:
            body["input_ids"] = list(self.input_ids)
        else:
            body["text"] = self.text
        return body

    @property
    def length(self) -> int | None:
        return None if self.input_ids is None else len(self.input_ids)


def word_prompts(count: int, words: int = 48, seed: int = 0) -> list[GreedyPrompt]:
    """`count` prompts of `words` vocabulary words each, as token ids (deterministic)."""
    rng = random.Random(seed)
    vocab = bench_words()
    return [GreedyPrompt(f"words-{i}", input_ids=tuple(encode_words(rng.choices(vocab, k=words))))
            for i in range(count)]


def dataset_prompts(path: Path, count: int) -> list[GreedyPrompt]:
    rows = load_dataset(path, 1)[:count]
    return [GreedyPrompt(f"{path.stem}-{i}", text=r.text) for i, r in enumerate(rows)]


def generate_ids(client: httpx.Client, prompt: GreedyPrompt, max_new_tokens: int,
                 timeout_s: float = 120.0) -> list[int]:
    resp = client.post("/generate", json=prompt.body(max_new_tokens), timeout=timeout_s)
    if resp.status_code != 200:
        raise GreedyError(f"{client.base_url}/generate answered {resp.status_code}: "
                          f"{resp.text[:300]}")
    data = resp.json()
    if isinstance(data, list):  # a batch answer; batch 1 here
        data = data[0]
    ids = data.get("output_ids") if isinstance(data, dict) else None
    if not isinstance(ids, list):
        raise GreedyError(f"{client.base_url}/generate answered without output_ids: "
                          f"{str(data)[:300]}")
    return [int(i) for i in ids]


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first position where the sequences differ (a length difference counts); None if equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


class TablePusher:
    """A thread pushing single-depth tables in a cycle (e.g. d0, d3, d1) every `interval_s`."""

    def __init__(self, url: str, admin_key: str | None, depths: Sequence[int],
                 interval_s: float, first_version: int) -> None:
        self.url = url
        self.headers = {"Authorization": f"Bearer {admin_key}"} if admin_key else {}
        self.depths = list(depths)
        self.interval_s = interval_s
        self.version = first_version
        self.times: list[float] = []  # monotonic time of each applied push
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="table-pusher", daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, headers=self.headers, timeout=10.0) as client:
            i = 0
            while not self._stop.is_set():
                depth = self.depths[i % len(self.depths)]
                i += 1
                try:
                    r = client.post("/set_internal_state", json=push_body(
                        single_depth_table(depth, version=self.version)))
                    if r.status_code == 200 and all(r.json()):
                        self.times.append(time.monotonic())
                        self.version += 1
                    else:
                        self.failures.append(f"push d{depth}: {r.status_code} {r.text[:200]}")
                except (httpx.HTTPError, ValueError) as err:
                    self.failures.append(f"push d{depth}: {type(err).__name__}: {err}")
                self._stop.wait(self.interval_s)

    def start(self) -> TablePusher:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)

    def pushes_between(self, start: float, end: float) -> int:
        return sum(1 for t in self.times if start <= t <= end)


@dataclass
class RunResult:
    """One pass over the prompts on one server, in one mode."""

    mode: str
    outputs: list[list[int]] = field(default_factory=list)
    pushes_during: list[int] = field(default_factory=list)
    seconds: float = 0.0


def run_prompts(url: str, prompts: Iterable[GreedyPrompt], max_new_tokens: int, mode: str,
                pusher: TablePusher | None = None, deadline: float | None = None) -> RunResult:
    result = RunResult(mode)
    t_start = time.monotonic()
    with httpx.Client(base_url=url, timeout=120.0) as client:
        for prompt in prompts:
            t0 = time.monotonic()
            if deadline is not None and t0 > deadline:
                raise GreedyError(f"out of time (--budget) before prompt {prompt.name} of "
                                  f"{mode}: give the greedy check a command of its own")
            result.outputs.append(generate_ids(client, prompt, max_new_tokens))
            result.pushes_during.append(pusher.pushes_between(t0, time.monotonic())
                                        if pusher else 0)
    result.seconds = time.monotonic() - t_start
    return result


def compare(reference: RunResult, other: RunResult,
            prompts: Sequence[GreedyPrompt]) -> dict[str, Any]:
    rows = []
    for i, prompt in enumerate(prompts):
        ref, got = reference.outputs[i], other.outputs[i]
        k = first_divergence(ref, got)
        row: dict[str, Any] = {"prompt": prompt.name, "tokens": len(got),
                               "first_divergence": k, "pushes_during": other.pushes_during[i]}
        if k is not None:
            row["reference_ids_from_divergence"] = ref[k:k + 8]
            row["ids_from_divergence"] = got[k:k + 8]
        rows.append(row)
    flips = [r for r in rows if r["first_divergence"] is not None]
    return {
        "mode": other.mode,
        "against": reference.mode,
        "prompts": len(rows),
        "identical": len(rows) - len(flips),
        "flips": len(flips),
        "first_divergences": [r["first_divergence"] for r in flips],
        "pushes_during_requests": sum(other.pushes_during),
        "seconds": round(other.seconds, 2),
        "per_prompt": rows,
    }


def greedy_check(spec_url: str, plain_url: str, admin_key: str | None,
                 prompts: Sequence[GreedyPrompt], max_new_tokens: int,
                 switch_depths: Sequence[int] = (0, 3, 1), interval_s: float = 0.1,
                 fixed_depths: Sequence[int] = (), plain_repeat: bool = True,
                 plain_reference: RunResult | None = None,
                 deadline: float | None = None) -> tuple[dict[str, Any], RunResult]:
    """Plain outputs (reference) against the speculative server switching depth under pushes,
    and optionally at fixed depths; the table live before is put back at the end. Returns the
    report and the plain server's outputs (a later check can reuse them)."""
    plain = plain_reference or run_prompts(plain_url, prompts, max_new_tokens, "plain",
                                           deadline=deadline)
    report: dict[str, Any] = {"max_new_tokens": max_new_tokens, "batch": 1,
                              "prompt_lengths": [p.length for p in prompts],
                              "switch_depths": list(switch_depths), "interval_s": interval_s,
                              "comparisons": []}
    if plain_repeat:
        again = run_prompts(plain_url, prompts, max_new_tokens, "plain-again",
                            deadline=deadline)
        report["comparisons"].append(compare(plain, again, prompts))
    with ServerClient(spec_url, admin_key) as server:
        before = server.state()
        try:
            version = before.version + 1
            pusher = TablePusher(spec_url, admin_key, switch_depths, interval_s, version).start()
            try:
                switching = run_prompts(spec_url, prompts, max_new_tokens, "spec-switching",
                                        pusher, deadline)
            finally:
                pusher.stop()
            report["comparisons"].append(compare(plain, switching, prompts))
            report["pusher"] = {"pushes": len(pusher.times), "failures": len(pusher.failures),
                                "first_failures": pusher.failures[:5]}
            version = pusher.version
            for depth in fixed_depths:
                server.push(single_depth_table(depth, version=version))
                version += 1
                fixed = run_prompts(spec_url, prompts, max_new_tokens, f"spec-d{depth}",
                                    deadline=deadline)
                report["comparisons"].append(compare(plain, fixed, prompts))
        finally:
            server.push(before.table)
            report["restored"] = before.describe()
    return report, plain


def headline(report: dict[str, Any]) -> str:
    parts = []
    for c in report.get("comparisons", []):
        parts.append(f"{c['mode']}: {c['identical']}/{c['prompts']} identical"
                     + (f", first divergences at {c['first_divergences']}" if c["flips"] else ""))
    return "; ".join(parts)
