"""What `specctl bench` settles before its first push: the prompts it will send, and whether
the servers it was given can be compared at all.

Every problem is one `error:` line naming the option and the fix, exit 2 (`fail`), before
anything is pushed or written.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.bench.prompts import (
    DatasetError,
    Prompt,
    SharedPrefix,
    random_id_prompts,
    read_dataset,
    shared_prefix_prompts,
    synthetic_prompts,
)
from controller.bench.server_client import ServerClient, ServerError
from controller.bench.tokenizer import Tokenizer, TokenizerError, load_tokenizer
from controller.cli.args import fail

# Synthetic prompts made for a sweep: more than any level sends, so none comes round (a
# repeated prompt would find its prefix cached and prefill for almost nothing).
SYNTHETIC_PROMPTS = 4096
WORDS, RANDOM_IDS, SHARED_PREFIX = "random-words", "random-ids", "generated-shared-prefix"


@dataclass(frozen=True)
class PromptChoice:
    """The prompt options as given."""

    dataset: str | None  # a file, or one of the synthetic datasets' names
    prompt_tokens: int
    output_tokens: int | None
    default_output_tokens: int
    tokenizer: str | None
    seed: int
    shared: SharedPrefix
    endpoint: str

    @property
    def kind(self) -> str:
        if self.dataset is None:
            return WORDS
        return self.dataset if self.dataset in (WORDS, RANDOM_IDS, SHARED_PREFIX) else "file"


def _tokenizer(path: str | None) -> Tokenizer | None:
    if path is None:
        return None
    try:
        return load_tokenizer(path)
    except TokenizerError as err:
        raise fail(str(err)) from None


@dataclass(frozen=True)
class Prompts:
    prompts: list[Prompt]
    source: str  # how to describe them
    asked_tokens: float | None = None  # the prompt size asked for (None: a file's own)
    exact: bool = False  # cut to that size in the model's tokens


def build_prompts(choice: PromptChoice) -> Prompts:
    """The prompts to send and how to describe them."""
    prompts, source = _build(choice)
    if choice.kind == "file":
        return Prompts(prompts, source)
    exact = choice.kind == RANDOM_IDS or choice.tokenizer is not None
    if choice.kind == SHARED_PREFIX:
        shape = choice.shared
        return Prompts(prompts, source, float(shape.system_tokens + shape.question_tokens), exact)
    return Prompts(prompts, source, float(choice.prompt_tokens), exact)


def _build(choice: PromptChoice) -> tuple[list[Prompt], str]:
    kind = choice.kind
    if kind == "file":
        assert choice.dataset is not None
        return _file_prompts(Path(choice.dataset), choice)
    tok = _tokenizer(choice.tokenizer)
    out = choice.output_tokens or choice.default_output_tokens
    seed = f", seed {choice.seed}"
    if kind == RANDOM_IDS:
        if tok is None and choice.endpoint == "chat":
            raise fail(
                "--dataset random-ids: the chat endpoint takes text, and random ids become text "
                "only through the model's tokenizer: give --tokenizer, or use --endpoint "
                "completions (which takes the ids as they are)"
            )
        prompts = random_id_prompts(SYNTHETIC_PROMPTS, choice.prompt_tokens, out, choice.seed,
                                    tok)  # fmt: skip
        vocab = (
            f"of {tok.source}'s vocabulary"
            if tok is not None
            else "below 32000 (no --tokenizer: give it to draw from the model's vocabulary)"
        )
        sent = "as text" if choice.endpoint == "chat" else "as token ids"
        return prompts, (
            f"random token ids {vocab}, {choice.prompt_tokens} prompt tokens (sent {sent}), "
            f"{out} output tokens{seed}"
        )
    if kind == SHARED_PREFIX:
        shape = choice.shared
        if choice.output_tokens is not None:
            shape = SharedPrefix(shape.groups, shape.prompts_per_group, shape.system_tokens,
                                 shape.question_tokens, choice.output_tokens)  # fmt: skip
        return shared_prefix_prompts(shape, choice.seed, tok), shape.describe() + _sized(tok) + seed
    prompts = synthetic_prompts(SYNTHETIC_PROMPTS, choice.prompt_tokens, out, choice.seed, tok)
    size = (
        f"{choice.prompt_tokens} prompt tokens{_sized(tok)}"
        if tok is not None
        else f"~{choice.prompt_tokens} prompt tokens{_sized(tok)}"
    )
    return prompts, f"synthetic (random words), {size}, {out} output tokens{seed}"


def _sized(tok: Tokenizer | None) -> str:
    if tok is not None:
        return f" of {tok.source}"
    return " (a word per token, approximate without --tokenizer; the server's count is reported)"


def _file_prompts(path: Path, choice: PromptChoice) -> tuple[list[Prompt], str]:
    try:
        data = read_dataset(path, choice.default_output_tokens,
                            fixed_output_tokens=choice.output_tokens)  # fmt: skip
    except DatasetError as err:
        raise fail(f"--dataset: {err}") from None
    source = data.describe()
    if choice.output_tokens is not None:
        source += f", every output fixed at {choice.output_tokens} tokens (--output-tokens)"
    return data.prompts, source


# ----------------------------------------------------------------------------- servers


@dataclass(frozen=True)
class Keys:
    admin_key: str | None
    api_key: str | None
    headers: dict[str, str]

    def client(self, url: str) -> ServerClient:
        return ServerClient(url, self.admin_key, api_key=self.api_key, headers=self.headers)


def _info(url: str, keys: Keys, option: str) -> tuple[dict[str, Any], tuple[int, ...] | None]:
    """`/server_info` of `url` and, for the speculative server, its captured depths."""
    try:
        with keys.client(url) as server:
            info = server.server_info()
            captured = server.state().captured_depths if option == "--url" else None
    except ServerError as err:
        raise fail(f"{option}: {err}" if option != "--url" else str(err)) from None
    return info, captured


def _same_server(a: str, b: str) -> bool:
    def norm(u: str) -> str:
        return u.rstrip("/").lower().replace("://localhost", "://127.0.0.1")

    return norm(a) == norm(b)


def check_servers(url: str, no_spec_url: str | None, keys: Keys) -> tuple[int, ...]:
    """The speculative server's captured depths, once both servers are known to fit their
    roles: --url speculates (else there is nothing to sweep), --no-spec-url does not (else
    the comparison is one speculative server against another)."""
    info, captured = _info(url, keys, "--url")
    algorithm = info.get("speculative_algorithm")
    if ("speculative_algorithm" in info and not algorithm) or not captured:
        reported = (
            "no speculative algorithm (speculative_algorithm is null)"
            if "speculative_algorithm" in info and not algorithm
            else "no captured depths"
        )
        raise fail(
            f"--url {url}: the server reports {reported}, so there are no depths to sweep; "
            "bench a server without speculation as --no-spec-url beside a speculative --url, or "
            "start a speculative one with `specctl serve`"
        )
    if no_spec_url is None:
        return tuple(captured)
    if _same_server(url, no_spec_url):
        raise fail(
            f"--no-spec-url {no_spec_url} is --url itself: give a second server, started "
            "without speculative decoding, to compare against"
        )
    other, _ = _info(no_spec_url, keys, "--no-spec-url")
    if other.get("speculative_algorithm"):
        raise fail(
            f"--no-spec-url {no_spec_url}: that server runs speculative decoding "
            f"(speculative_algorithm {other['speculative_algorithm']}), so the comparison would "
            "be speculation against speculation; give a server started without "
            "--speculative-algorithm (or `specctl sim serve --no-speculative`)"
        )
    return tuple(captured)
