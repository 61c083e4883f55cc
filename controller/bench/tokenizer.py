"""The served model's tokenizer, to size prompts in its tokens (`specctl bench --tokenizer`).

`--tokenizer PATH` names a `tokenizer.json` (or a folder holding one: a model folder), read with
the `tokenizers` package, or, where that is not installed or the folder has no tokenizer.json,
anything `transformers.AutoTokenizer.from_pretrained` reads from disk. Encoding adds no special
tokens: the server adds its own (a BOS, a chat template), which its usage counts and bench
reports beside the size asked for.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class TokenizerError(ValueError):
    """The tokenizer cannot be loaded; the message says what to install or pass instead."""


@dataclass(frozen=True)
class Tokenizer:
    source: str  # the path given
    encode: Callable[[str], list[int]]
    decode: Callable[[Sequence[int]], str]
    vocab_size: int
    special_ids: frozenset[int]

    def count(self, text: str) -> int:
        return len(self.encode(text))

    def plain_ids(self) -> list[int]:
        """Every id that is not a special token (random prompts are drawn from these)."""
        return [i for i in range(self.vocab_size) if i not in self.special_ids]


def _from_tokenizers(file: Path) -> Tokenizer:
    from tokenizers import Tokenizer as HFTokenizer

    try:
        tok = HFTokenizer.from_file(str(file))
    except Exception as err:  # the library raises its own exception types
        raise TokenizerError(f"--tokenizer {file}: cannot read it ({err})") from None
    special = {
        tid for added in tok.get_added_tokens_decoder().values() if added.special
        if (tid := tok.token_to_id(added.content)) is not None
    }  # fmt: skip
    return Tokenizer(
        source=str(file),
        encode=lambda text: tok.encode(text, add_special_tokens=False).ids,
        decode=lambda ids: tok.decode(list(ids), skip_special_tokens=False),
        vocab_size=tok.get_vocab_size(with_added_tokens=True),
        special_ids=frozenset(special),
    )


def _from_transformers(path: str) -> Tokenizer:
    from transformers import AutoTokenizer

    try:
        tok: Any = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as err:  # OSError, ValueError and the library's own
        raise TokenizerError(f"--tokenizer {path}: transformers cannot load it ({err})") from None
    return Tokenizer(
        source=path,
        encode=lambda text: list(tok.encode(text, add_special_tokens=False)),
        decode=lambda ids: str(tok.decode(list(ids))),
        vocab_size=len(tok),
        special_ids=frozenset(int(i) for i in tok.all_special_ids),
    )


def load_tokenizer(path: str) -> Tokenizer:
    """The tokenizer at `path` (a tokenizer.json, or a folder with one or with what
    transformers reads); TokenizerError names the problem and the fix."""
    given = Path(path)
    if not given.exists():
        raise TokenizerError(
            f"--tokenizer {path}: no such file or folder; give the model folder or its "
            "tokenizer.json"
        )
    file = given / "tokenizer.json" if given.is_dir() else given
    has_tokenizers = importlib.util.find_spec("tokenizers") is not None
    has_transformers = importlib.util.find_spec("transformers") is not None
    if file.is_file() and file.suffix == ".json" and has_tokenizers:
        return _from_tokenizers(file)
    if has_transformers:
        return _from_transformers(path)
    if not has_tokenizers:
        raise TokenizerError(
            f"--tokenizer {path}: neither the tokenizers nor the transformers package is "
            "installed; install one (pip install tokenizers), or drop --tokenizer to size "
            "prompts approximately"
        )
    raise TokenizerError(
        f"--tokenizer {path}: no tokenizer.json there (and transformers, which reads other "
        "formats, is not installed); give the model folder that holds tokenizer.json"
    )
