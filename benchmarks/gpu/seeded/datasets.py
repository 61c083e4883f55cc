"""The two prompt families as `specctl bench --dataset` files: {"prompt": ..., "output_tokens": N}.

A family's prompts are random sequences of its own words (harness tokenizer words, one token
each), so the target starts, and stays, on that family's cycle: family A's head is accepted
about 0.8 of the time for the first draft token, family B's about 0.5.
"""

from __future__ import annotations

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


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu.seeded.datasets",
        description="Write a family's dataset with longer prompts (same rows, same output "
        "lengths, each prompt WORDS words of the family): a bench at a second context length.",
    )
    ap.add_argument("source", type=Path, help="a family's JSONL, e.g. family_a.jsonl")
    ap.add_argument("out", type=Path, help="where to write the longer-prompt JSONL")
    ap.add_argument("--words", type=int, required=True, help="words (tokens) per prompt")
    args = ap.parse_args(argv)
    try:
        rows = [json.loads(line) for line in args.source.read_text().splitlines() if line.strip()]
        longer = lengthen(rows, args.words)
    except (OSError, ValueError) as err:  # json.JSONDecodeError is a ValueError
        print(f"error: {args.source}: {err}", file=sys.stderr)
        return 2
    write_family(args.out, longer)
    print(f"wrote {args.out}: {len(longer)} prompts of {args.words} words")
    return 0


if __name__ == "__main__":
    sys.exit(main())
