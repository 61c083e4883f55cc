"""The prompts `specctl bench` sends: a JSONL dataset, or synthetic text of a chosen length.

Dataset: one JSON object per line with a `prompt` string and, optionally, `output_tokens` (an
integer that overrides `--output-tokens` for that prompt). Blank lines are skipped.
Synthetic: common English words (about one token each in BPE vocabularies) behind a unique
prefix, so no two requests share a prompt-cache prefix beyond a few tokens.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path


class DatasetError(ValueError):
    """A dataset file is missing or malformed; the message names the file and line."""


@dataclass(frozen=True)
class Prompt:
    text: str
    output_tokens: int


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


def load_dataset(path: Path, default_output_tokens: int) -> list[Prompt]:
    """Prompts from a JSONL file; every error names the line and the field."""
    if not path.is_file():
        raise DatasetError(f"dataset not found: {path}")
    prompts = []
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise DatasetError(f"{where}: not valid JSON ({err.msg})") from None
        if not isinstance(row, dict):
            raise DatasetError(f"{where}: expected an object with a 'prompt' field")
        text = row.get("prompt")
        if not isinstance(text, str) or not text:
            raise DatasetError(f"{where}: 'prompt' must be a non-empty string")
        out = row.get("output_tokens", default_output_tokens)
        if not isinstance(out, int) or isinstance(out, bool) or out < 1:
            raise DatasetError(f"{where}: 'output_tokens' must be an integer >= 1, got {out!r}")
        prompts.append(Prompt(text, out))
    if not prompts:
        raise DatasetError(f'{path}: no prompts (expected JSONL lines like {{"prompt": "..."}})')
    return prompts
