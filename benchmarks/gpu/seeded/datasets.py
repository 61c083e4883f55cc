"""The two prompt families as `specctl bench --dataset` files: {"prompt": ..., "output_tokens": N}.

A family's prompts are random sequences of its own words (harness tokenizer words, one token
each), so the target starts, and stays, on that family's cycle: family A's head is accepted
about 0.8 of the time for the first draft token, family B's about 0.5.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from benchmarks.gpu.seeded.plan import FAMILIES, SeededPlan
from benchmarks.gpu.tokenizer import encode_words


def family_rows(
    plan: SeededPlan, family: str, count: int, words: int, output_tokens: int, seed: int
) -> list[dict[str, object]]:
    rng = np.random.default_rng([seed, FAMILIES.index(family), 0xDA5E])
    own = plan.words[family]
    rows: list[dict[str, object]] = []
    for _ in range(count):
        text = " ".join(own[i] for i in rng.integers(len(own), size=words))
        ids = encode_words(text)
        if any(plan.family[i] != FAMILIES.index(family) for i in ids):
            raise ValueError(f"family {family}: a prompt word lies outside its region: {text!r}")
        rows.append({"prompt": text, "output_tokens": output_tokens})
    return rows


def write_family(path: Path, rows: list[dict[str, object]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def lengthen(rows: list[dict[str, object]], words: int) -> list[dict[str, object]]:
    """Prompts of `words` words each, built by joining a family's prompts in turn.

    A family's prompts are random sequences of its own words, so a join of them is one too:
    the longer prompt keeps the family's acceptance and changes only the context length.
    """
    if not rows:
        raise ValueError("no prompts to lengthen")
    if words < 1:
        raise ValueError(f"words must be >= 1, got {words}")
    if any("prompt" not in row for row in rows):
        raise ValueError('every line needs a "prompt"')
    pool = [w for row in rows for w in str(row["prompt"]).split()]
    if not pool:
        raise ValueError("the prompts have no words")
    out: list[dict[str, object]] = []
    start = 0
    for row in rows:
        taken = [pool[(start + i) % len(pool)] for i in range(words)]
        start = (start + words) % len(pool)
        out.append({**row, "prompt": " ".join(taken)})
    return out


def fresh_prompts(
    rows: list[dict[str, object]], count: int, seed: int = 0
) -> list[dict[str, object]]:
    """`count` new prompts drawn from the words of `rows`' prompts, each as long as the row it
    replaces (the rows taken in turn); output lengths as those rows had them.

    A family's prompts are random sequences of its own words, so a new draw keeps the family's
    acceptance. A bench that cycles through a few hundred prompts sends each one again while
    the server's prefix cache still holds it: the whole prompt then hits, one token is left to
    prefill, and SGLang runs that one-token prefill without its prefill CUDA graph (a bucket of
    4 tokens is more than twice the batch) on a server without speculation, while an EAGLE
    server's cache leaves two tokens and stays on the graph. Thousands of prompts never hit
    whole: the cache has evicted each long before it comes round again.
    """
    if count < 1:
        raise ValueError(f"fresh prompts: give a count >= 1, got {count}")
    if not rows or any("prompt" not in row for row in rows):
        raise ValueError('every line needs a "prompt"')
    pool = sorted({w for row in rows for w in str(row["prompt"]).split()})
    if not pool:
        raise ValueError("the prompts have no words")
    rng = np.random.default_rng([seed, 0xF4E5])
    out: list[dict[str, object]] = []
    for i in range(count):
        row = rows[i % len(rows)]
        words = rng.integers(len(pool), size=len(str(row["prompt"]).split()))
        out.append({**row, "prompt": " ".join(pool[w] for w in words)})
    return out


def spread_outputs(
    rows: list[dict[str, object]], low: int, high: int, seed: int = 0
) -> list[dict[str, object]]:
    """Each row's output length drawn uniformly from [low, high] (seeded).

    Under a closed loop, requests of one length start and end together and the batch moves in
    waves; spread lengths end them one by one, as real traffic does.
    """
    if not 1 <= low <= high:
        raise ValueError(f"output tokens {low}:{high}: give 1 <= LOW <= HIGH")
    rng = np.random.default_rng([seed, 0x0B7])
    lengths = rng.integers(low, high + 1, size=len(rows))
    return [{**row, "output_tokens": int(n)} for row, n in zip(rows, lengths, strict=True)]


def _span(text: str) -> tuple[int, int]:
    low, _, high = text.partition(":")
    try:
        return int(low), int(high or low)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give N or LOW:HIGH, e.g. 64:192") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu.seeded.datasets",
        description="Rewrite a family's dataset for another bench: N fresh prompts of the "
        "family's words (none repeats while a prefix cache holds it), longer prompts (each WORDS "
        "words of the family, so acceptance stays: a second context length) and/or output "
        "lengths spread over LOW:HIGH (requests that do not end together).",
    )
    ap.add_argument("source", type=Path, help="a family's JSONL, e.g. family_a.jsonl")
    ap.add_argument("out", type=Path, help="where to write the new JSONL")
    ap.add_argument("--words", type=int, help="words (tokens) per prompt")
    ap.add_argument("--output-tokens", type=_span, metavar="LOW:HIGH",
                    help="each row's output length, uniform over LOW..HIGH")  # fmt: skip
    ap.add_argument("--fresh", type=int, metavar="N",
                    help="N new prompts drawn from the family's words, so that none repeats "
                         "while a server's prefix cache still holds it")  # fmt: skip
    ap.add_argument("--seed", type=int, default=0, help="seed of the draws (0)")
    args = ap.parse_args(argv)
    if args.words is None and args.output_tokens is None and args.fresh is None:
        ap.error("give --words N, --output-tokens LOW:HIGH, --fresh N, or several")
    try:
        rows = [json.loads(line) for line in args.source.read_text().splitlines() if line.strip()]
        if args.fresh is not None:
            rows = fresh_prompts(rows, args.fresh, seed=args.seed)
        if args.words is not None:
            rows = lengthen(rows, args.words)
        if args.output_tokens is not None:
            low, high = args.output_tokens
            rows = spread_outputs(rows, low, high, seed=args.seed)
    except (OSError, ValueError) as err:  # json.JSONDecodeError is a ValueError
        print(f"error: {args.source}: {err}", file=sys.stderr)
        return 2
    write_family(args.out, rows)
    lengths = sorted({int(str(r["output_tokens"])) for r in rows if "output_tokens" in r})
    span = f"{lengths[0]}-{lengths[-1]}" if lengths else "unset"
    words = f"{args.words} words" if args.words is not None else "their own words"
    if args.fresh is not None:
        words += ", freshly drawn"
    print(f"wrote {args.out}: {len(rows)} prompts of {words}, output tokens {span}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
