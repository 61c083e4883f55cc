"""The two prompt families as `specctl bench --dataset` files: {"prompt": ..., "output_tokens": N}.

A family's prompts are random sequences of its own words (harness tokenizer words, one token
each), so the target starts, and stays, on that family's cycle: family A's head is accepted
about 0.8 of the time for the first draft token, family B's about 0.5.
"""

from __future__ import annotations

import json
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
