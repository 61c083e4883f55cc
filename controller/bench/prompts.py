"""The prompts `specctl bench` sends: a dataset of real prompts, or synthetic text.

Datasets, one JSON object per record, either as JSONL (one per line, blank lines skipped) or as
one JSON array (how the ShareGPT dump is distributed):

- `{"prompt": "...", "output_tokens": N}`: `output_tokens` optional;
- ShareGPT conversations, `{"conversations": [{"from": "human", "value": "..."},
  {"from": "gpt", "value": "..."}, ...]}`: the first human turn is the prompt and the reply
  after it sets the output length (as `sglang.bench_serving` and `vllm bench serve` do with
  ShareGPT); records without a human turn followed by a reply are skipped and counted.

Without a tokenizer, a reply's length in tokens is estimated at 4 characters per token (the
simulator's estimate too); pass a fixed output length to override it. Synthetic prompts are
common English words (about one token each in BPE vocabularies) behind a unique prefix, so no
two requests share a prompt-cache prefix beyond a few tokens.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class DatasetError(ValueError):
    """A dataset file is missing or malformed; the message names the file and line."""


@dataclass(frozen=True)
class Prompt:
    text: str
    output_tokens: int


@dataclass(frozen=True)
class Dataset:
    prompts: list[Prompt]
    skipped: int  # conversations without a prompt and a reply
    path: Path
    conversations: bool  # ShareGPT records (output lengths from the replies)

    def describe(self) -> str:
        n = len(self.prompts)
        mean_out = sum(p.output_tokens for p in self.prompts) / n
        mean_in = sum(estimate_tokens(p.text) for p in self.prompts) / n
        kind = "conversations" if self.conversations else "prompts"
        skipped = f", {self.skipped} skipped (no prompt and reply)" if self.skipped else ""
        return (
            f"{self.path} ({n} {kind}{skipped}; ~{mean_in:.0f} prompt / {mean_out:.0f} output "
            "tokens on average)"
        )


CHARS_PER_TOKEN = 4
_HUMAN = {"human", "user"}
_REPLY = {"gpt", "assistant", "chatgpt", "bard", "model"}


def estimate_tokens(text: str) -> int:
    return max(1, round(len(text) / CHARS_PER_TOKEN))


_COMMON_WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at which "
    "but have an they you were her she there can all their one has would been more will if no "
    "when so what out up into them some could time these two may then do first any my now such "
    "like our over man me even most made after also did many before must through back years "
    "where much your way well down should because each just those people how too little state "
    "good very make world still own see men work long get here between both life being under "
    "never day same another know while last might us great old year off come since against go "
    "came right used take three system model server token speed batch request queue memory"
)
# Public: benchmarks/gpu builds a tokenizer in which each of these words is one token.
WORDS = tuple(_COMMON_WORDS.split())


def synthetic_prompts(
    count: int, prompt_tokens: int, output_tokens: int, seed: int = 0
) -> list[Prompt]:
    """`count` distinct prompts of about `prompt_tokens` tokens each."""
    if prompt_tokens < 1 or output_tokens < 1:
        raise ValueError("prompt and output lengths must be >= 1 token")
    rng = random.Random(seed)
    prompts = []
    for i in range(count):
        words = [f"Request {i}:", *rng.choices(WORDS, k=max(prompt_tokens - 3, 1))]
        prompts.append(Prompt(" ".join(words), output_tokens))
    return prompts


def _records(path: Path, text: str) -> Iterator[tuple[str, Any]]:
    """(where, record) for a JSON array file or a JSONL file."""
    if text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as err:
            raise DatasetError(
                f"{path}:{err.lineno}: not valid JSON ({err.msg}); a dataset is JSONL or one "
                "JSON array of records"
            ) from None
        for i, row in enumerate(rows):
            yield f"{path}: record {i}", row
        return
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield f"{path}:{lineno}", json.loads(line)
        except json.JSONDecodeError as err:
            raise DatasetError(f"{path}:{lineno}: not valid JSON ({err.msg})") from None


def _output_tokens(where: str, row: dict[str, Any], default: int) -> int:
    out = row.get("output_tokens", default)
    if not isinstance(out, int) or isinstance(out, bool) or out < 1:
        raise DatasetError(f"{where}: 'output_tokens' must be an integer >= 1, got {out!r}")
    return out


def _conversation(where: str, turns: Any) -> tuple[str, str] | None:
    """(first human turn, the reply after it), or None when the record has no such pair."""
    if not isinstance(turns, list):
        raise DatasetError(f"{where}: 'conversations' must be a list of turns")
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
            raise DatasetError(
                f"{where}: conversations[{i}] must be an object with 'from' and a 'value' string"
            )
    for first, second in itertools.pairwise(turns):
        if (
            str(first.get("from", "")).lower() in _HUMAN
            and str(second.get("from", "")).lower() in _REPLY
            and first["value"].strip()
            and second["value"].strip()
        ):
            return first["value"], second["value"]
    return None


def read_dataset(
    path: Path, default_output_tokens: int, fixed_output_tokens: int | None = None
) -> Dataset:
    """Prompts from a JSONL or JSON-array file; every error names the line (or record) and the
    field. `fixed_output_tokens` overrides every record's output length."""
    if not path.is_file():
        raise DatasetError(f"dataset not found: {path}")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        raise DatasetError(f"{path}: cannot read it ({err})") from None
    prompts: list[Prompt] = []
    skipped = 0
    conversations = False
    for where, row in _records(path, text):
        if not isinstance(row, dict):
            raise DatasetError(f"{where}: expected an object with 'prompt' or 'conversations'")
        if "conversations" in row:
            conversations = True
            pair = _conversation(where, row["conversations"])
            if pair is None:
                skipped += 1
                continue
            prompt_text, reply = pair
            out = estimate_tokens(reply)
            if "output_tokens" in row:
                out = _output_tokens(where, row, out)
        else:
            given = row.get("prompt")
            if not isinstance(given, str) or not given:
                raise DatasetError(
                    f"{where}: 'prompt' must be a non-empty string (or give ShareGPT "
                    "'conversations')"
                )
            prompt_text = given
            out = _output_tokens(where, row, default_output_tokens)
        prompts.append(Prompt(prompt_text, fixed_output_tokens or out))
    if not prompts:
        raise DatasetError(
            f'{path}: no prompts (expected JSONL lines like {{"prompt": "..."}} or ShareGPT '
            'records with "conversations")'
            + (f"; {skipped} conversations had no human turn with a reply" if skipped else "")
        )
    return Dataset(prompts, skipped, path, conversations)


def load_dataset(path: Path, default_output_tokens: int) -> list[Prompt]:
    """The prompts of `read_dataset`."""
    return read_dataset(path, default_output_tokens).prompts
