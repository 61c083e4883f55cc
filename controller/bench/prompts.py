"""The prompts `specctl bench` sends: a dataset of real prompts, or synthetic ones.

Datasets, one JSON object per record, either as JSONL (one per line, blank lines skipped) or as
one JSON array (how the ShareGPT dump is distributed):

- `{"prompt": "...", "output_tokens": N}`: `output_tokens` optional;
- ShareGPT conversations, `{"conversations": [{"from": "human", "value": "..."},
  {"from": "gpt", "value": "..."}, ...]}`: the first human turn is the prompt and the reply
  after it sets the output length (as `sglang.bench_serving` and `vllm bench serve` do with
  ShareGPT); records without a human turn followed by a reply are skipped and counted.

Without a tokenizer, a reply's length in tokens is estimated at 4 characters per token (the
simulator's estimate too); pass a fixed output length to override it.

Synthetic prompts, all drawn from a seeded generator (the same seed, the same prompts):

- `synthetic_prompts` (the default, "random words"): common English words behind a unique
  prefix, so no two requests share a prompt-cache prefix beyond a few tokens. With the model's
  tokenizer each is cut to exactly the size asked for in its tokens; without one a word is
  taken for a token, which BPE vocabularies roughly follow (the server's count, from its usage,
  is reported beside it).
- `random_id_prompts` ("random-ids", as `sglang.bench_serving` has it): uniformly random token
  ids, sent as ids on the completions endpoint (exactly the size asked for), decoded to text
  for the chat endpoint (which needs the tokenizer). Without a tokenizer the ids are drawn
  below `FALLBACK_VOCAB`, which every common vocabulary exceeds.
- `shared_prefix_prompts` ("generated-shared-prefix", modelled on SGLang's): groups of prompts
  that share a system prompt (a prefix the server's cache holds once per group), each with its
  own question, in a seeded shuffled order.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from controller.bench.tokenizer import Tokenizer


class DatasetError(ValueError):
    """A dataset file is missing or malformed; the message names the file and line."""


@dataclass(frozen=True)
class Prompt:
    """One request's input. `text` is the user's turn; `system` (optional) a system prompt
    before it (shared by a group of prompts in the generated-shared-prefix dataset); `ids`
    (optional) the whole prompt as token ids, sent as such on the completions endpoint."""

    text: str
    output_tokens: int
    ids: tuple[int, ...] | None = None
    system: str | None = None

    def completion_prompt(self) -> str | list[int]:
        """What `/v1/completions` gets: the token ids, or the system prompt and the text."""
        if self.ids is not None:
            return list(self.ids)
        return self.text if self.system is None else f"{self.system}\n\n{self.text}"

    def messages(self) -> list[dict[str, str]]:
        """What `/v1/chat/completions` gets: a system message (if any) and the user's."""
        if not self.text and self.ids is not None:
            raise ValueError("a prompt of token ids alone cannot go to the chat endpoint")
        system = [] if self.system is None else [{"role": "system", "content": self.system}]
        return [*system, {"role": "user", "content": self.text}]


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


def sized_text(
    rng: random.Random, tokens: int, tokenizer: Tokenizer | None = None, prefix: str = ""
) -> str:
    """`prefix` and random words: `tokens` tokens of `tokenizer` (to the token where its
    decode and encode agree), or, without one, a word or a prefix word per token."""
    if tokenizer is None:
        head = prefix.split()
        return " ".join([*head, *rng.choices(WORDS, k=max(tokens - len(head), 1))])
    words = [*([prefix] if prefix else []), *rng.choices(WORDS, k=tokens + 8)]
    ids = tokenizer.encode(" ".join(words))
    while len(ids) < tokens:  # a vocabulary of long tokens: more words
        words += rng.choices(WORDS, k=tokens)
        ids = tokenizer.encode(" ".join(words))
    text = tokenizer.decode(ids[:tokens])
    # A cut inside a word may re-encode to a token more or less: trim until it fits.
    for _ in range(4):
        again = tokenizer.encode(text)
        if len(again) == tokens:
            break
        text = tokenizer.decode(again[:tokens]) if len(again) > tokens else text + " the"
    return text


def synthetic_prompts(
    count: int,
    prompt_tokens: int,
    output_tokens: int,
    seed: int = 0,
    tokenizer: Tokenizer | None = None,
) -> list[Prompt]:
    """`count` distinct prompts of `prompt_tokens` tokens each (about that, with no tokenizer)."""
    if prompt_tokens < 1 or output_tokens < 1:
        raise ValueError("prompt and output lengths must be >= 1 token")
    rng = random.Random(seed)
    if tokenizer is None:
        words = max(prompt_tokens - 3, 1)
        return [
            Prompt(" ".join([f"Request {i}:", *rng.choices(WORDS, k=words)]), output_tokens)
            for i in range(count)
        ]
    return [
        Prompt(sized_text(rng, prompt_tokens, tokenizer, f"Request {i}:"), output_tokens)
        for i in range(count)
    ]


# Random ids without a tokenizer are drawn below this: every common vocabulary is larger, and
# the lowest ids are mostly control and byte tokens.
FALLBACK_VOCAB = 32000
FALLBACK_FIRST_ID = 1000


def random_id_prompts(
    count: int,
    prompt_tokens: int,
    output_tokens: int,
    seed: int = 0,
    tokenizer: Tokenizer | None = None,
) -> list[Prompt]:
    """`count` prompts of `prompt_tokens` uniformly random token ids each (no special tokens);
    with a tokenizer they also carry their decoded text (for the chat endpoint)."""
    if prompt_tokens < 1 or output_tokens < 1:
        raise ValueError("prompt and output lengths must be >= 1 token")
    rng = random.Random(seed)
    pool: Sequence[int] = (
        range(FALLBACK_FIRST_ID, FALLBACK_VOCAB) if tokenizer is None else tokenizer.plain_ids()
    )
    prompts = []
    for _ in range(count):
        ids = tuple(rng.choices(pool, k=prompt_tokens))
        text = "" if tokenizer is None else tokenizer.decode(ids)
        prompts.append(Prompt(text, output_tokens, ids=ids))
    return prompts


@dataclass(frozen=True)
class SharedPrefix:
    """The generated-shared-prefix dataset's shape (SGLang's --gsp-* options)."""

    groups: int = 64
    prompts_per_group: int = 16
    system_tokens: int = 2048
    question_tokens: int = 128
    output_tokens: int = 256

    def describe(self) -> str:
        return (
            f"generated-shared-prefix, {self.groups} groups x {self.prompts_per_group} prompts, "
            f"{self.system_tokens}-token system prompt + {self.question_tokens}-token question, "
            f"{self.output_tokens} output tokens"
        )


def shared_prefix_prompts(
    shape: SharedPrefix, seed: int = 0, tokenizer: Tokenizer | None = None
) -> list[Prompt]:
    """Every group's prompts (a system prompt per group, a question per prompt), shuffled."""
    rng = random.Random(seed)
    prompts = []
    for g in range(shape.groups):
        system = sized_text(rng, shape.system_tokens, tokenizer, f"System {g}:")
        for q in range(shape.prompts_per_group):
            question = sized_text(rng, shape.question_tokens, tokenizer, f"Question {q}:")
            prompts.append(Prompt(question, shape.output_tokens, system=system))
    rng.shuffle(prompts)
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
