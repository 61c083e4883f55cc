"""A small, deterministic word-level tokenizer for model folders that have no tokenizer.

SGLang's text routes (`/generate` with `text`, `/v1/completions`) need a tokenizer in the
target's folder. This one is built in code, never downloaded: every word of the vocabulary
below is exactly one token wherever it stands in a text (no leading-space variants), so a
prompt can be written as word ids and read back as words. Text is lower-cased, split on
whitespace, punctuation marks stand alone and digits are one token each; anything else is
`[UNK]`. Ids the model emits beyond the vocabulary decode to nothing.

    build_tokenizer(folder)       writes tokenizer.json + tokenizer_config.json, returns it
    word_id("server") -> int      the id of a word (same in every build)
    encode_words("the model") -> [ids]
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import Any

from controller.bench.prompts import WORDS as BENCH_WORDS

UNK, BOS, EOS = "[UNK]", "<s>", "</s>"
# Ids 1 and 2 are the bos/eos ids of the model configs (benchmarks/gpu/model_folders.py).
SPECIAL_TOKENS = (UNK, BOS, EOS)
DIGITS = tuple("0123456789")
PUNCTUATION = tuple(".,:;!?'\"-()/")
# Words the project's own prompts use besides the bench's (the smoke test's load prompt, the
# bench's "Request N:" prefix, the simulator's synthetic text), then common English words.
_EXTRA_WORDS = """
request count slowly from one to two hundred speculates verifies tokens in pass while small
under load stops a i am do does done about above across again all almost along already although
always among answer ask asked away be became become began begin best better big black blue body
book bring brought call called car change child children city close cold country course cut dark
days different does door during early earth end enough even every eye face fact family far fast
father feel few find fire five follow food form found four free friend full gave give given going
gone green group hand hard head hear heard help high home hour house idea important keep kind land
large later learn leave left less let light line live look low main mark mean mind money morning
mother move music name near need new next night nothing number often once open order other paper
part place plan play point power problem put question quick read real red rest road room round run
say school sea second seen set short show side simple since six small so sound start stop story
study sun sure table tell ten than thing think thought together told took town tree true turn until
upon use voice walk want war watch water week went white whole why wind without word write yes
yet young zero
"""


@cache
def vocabulary() -> tuple[str, ...]:
    """Every token, in id order: specials, digits, punctuation, then words (no duplicates)."""
    seen: dict[str, None] = {}
    for token in (*SPECIAL_TOKENS, *DIGITS, *PUNCTUATION, *BENCH_WORDS, *_EXTRA_WORDS.split()):
        seen.setdefault(token.lower() if token not in SPECIAL_TOKENS else token, None)
    return tuple(seen)


@cache
def _ids() -> dict[str, int]:
    return {token: i for i, token in enumerate(vocabulary())}


def word_id(word: str) -> int:
    """The id of one vocabulary word (case-insensitive); KeyError names words it lacks."""
    try:
        return _ids()[word if word in SPECIAL_TOKENS else word.lower()]
    except KeyError:
        raise KeyError(f"{word!r} is not in the harness vocabulary ({len(vocabulary())} "
                       f"tokens, see benchmarks/gpu/tokenizer.py)") from None


def encode_words(text_or_words: str | Iterable[str]) -> list[int]:
    """Ids of whitespace-separated vocabulary words (each word must be in the vocabulary)."""
    words = text_or_words.split() if isinstance(text_or_words, str) else text_or_words
    return [word_id(w) for w in words]


def bench_words() -> tuple[str, ...]:
    """The bench's synthetic-prompt words: each one a single token of this vocabulary."""
    return BENCH_WORDS


def make_tokenizer() -> Any:
    """The `tokenizers.Tokenizer` (imported here: only the model builder needs the package)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    tok = Tokenizer(models.WordLevel(_ids(), unk_token=UNK))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.WhitespaceSplit(),
        pre_tokenizers.Punctuation("isolated"),
        pre_tokenizers.Digits(individual_digits=True),
    ])  # fmt: skip
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return tok


def tokenizer_config(model_max_length: int = 4096) -> dict[str, Any]:
    """tokenizer_config.json: transformers loads tokenizer.json through this class."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "unk_token": UNK,
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
        "add_bos_token": False,
        "add_eos_token": False,
    }


def build_tokenizer(folder: Path | str, model_max_length: int = 4096) -> Any:
    """Write tokenizer.json and tokenizer_config.json into `folder`; return the tokenizer."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer()
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps(tokenizer_config(model_max_length), indent=2) + "\n"
    )
    (folder / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": BOS, "eos_token": EOS, "unk_token": UNK}, indent=2) + "\n"
    )
    return tok
