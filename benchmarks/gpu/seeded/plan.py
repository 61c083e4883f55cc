"""The discrete structure of the seeded target: which tokens follow which, drawn from a seed.

Two prompt families own disjoint token regions. Inside a region the tokens form one long cycle
(a random order); greedy decoding walks it. A *clear* token has one successor, the next token
on the cycle. A *tied* token has two, the next token and a jump elsewhere in the region, and
the target picks between them with a sign it computes from the context two attention hops
deep (weights.py), which a one-layer EAGLE-3 head cannot compute. Family A has `tied_a` of its
tokens tied (the head's first draft token right about 1 - tied_a / 2 of the time), family B
`tied_b`.

Each region holds some of the harness tokenizer's words (so prompts can be written as text)
and otherwise ids beyond the tokenizer's vocabulary, which decode to nothing.
Only numpy here: the plan is small and the same on every machine for one seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from benchmarks.gpu.model_folders import LLAMA_8B, TargetShape
from benchmarks.gpu.tokenizer import vocabulary

FAMILIES = ("a", "b")
_JUMP_CHOICES = 3

# The CPU-test and quick-check shape: head_dim 64 (FlashAttention-3 serves it), 8 layers
# (EAGLE-3 reads three target layers and the construction needs two unseen ones after them),
# a vocabulary just above the harness tokenizer's.
SEEDED_TINY = TargetShape(
    name="seeded-tiny",
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=8,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    vocab_size=1024,
    max_position_embeddings=4096,
    draft_vocab_size=512,
)
SHAPES = {s.name: s for s in (LLAMA_8B, SEEDED_TINY)}


@dataclass(frozen=True)
class PlanSpec:
    """Sizes of the structure; `for_shape` picks them so the active tokens fit the basis."""

    region_size: int  # tokens per family
    words_per_family: int
    tied_a: float = 0.4
    tied_b: float = 1.0
    copy_dims: int = 64  # residual dimensions the first hop writes (weights.py)

    @staticmethod
    def for_shape(shape: TargetShape) -> PlanSpec:
        if shape.hidden_size >= 4096:
            return PlanSpec(region_size=1500, words_per_family=len(word_tokens()) // 2)
        return PlanSpec(region_size=96, words_per_family=40, copy_dims=16)


def word_tokens() -> list[tuple[str, int]]:
    """The harness tokenizer's plain words (letters only) with their ids."""
    return [(w, i) for i, w in enumerate(vocabulary()) if w.isalpha() and w.isascii()]


@dataclass(frozen=True)
class SeededPlan:
    """Arrays over target ids (length vocab_size); -1 / 0 where a token is not active."""

    seed: int
    spec: PlanSpec
    vocab_size: int
    family: np.ndarray  # int8: 0 = a, 1 = b, -1 = not in a region
    succ_next: np.ndarray  # int64: next token on the cycle (-1: inactive)
    succ_jump: np.ndarray  # int64: the other successor of a tied token (-1: clear)
    sigma: np.ndarray  # int8 +-1: which sign of the hidden context signal favours this token
    bit: np.ndarray  # int8 +-1: what this token contributes when the second hop reads it
    active: np.ndarray  # int64: region tokens, family a first (their order fixes the basis)
    hot: np.ndarray  # int64, sorted: the draft vocabulary (target ids)
    words: dict[str, tuple[str, ...]]  # family -> its words

    @property
    def tied(self) -> np.ndarray:
        return self.succ_jump >= 0

    def region(self, family: str) -> np.ndarray:
        return np.flatnonzero(self.family == FAMILIES.index(family))

    def successor(self, token: int, signal_positive: bool) -> int:
        """The target's greedy next token after `token` for a sign of the context signal."""
        nxt, jump = int(self.succ_next[token]), int(self.succ_jump[token])
        if jump < 0:
            return nxt
        want = 1 if signal_positive else -1
        return nxt if int(self.sigma[nxt]) == want else jump

    def d2t(self) -> np.ndarray:
        """EAGLE-3's draft-to-target map: target id = draft id + d2t[draft id]."""
        return self.hot - np.arange(len(self.hot), dtype=np.int64)

    def t2d(self) -> np.ndarray:
        """Which target ids the draft vocabulary holds (shipped beside d2t, as heads do)."""
        mask = np.zeros(self.vocab_size, dtype=bool)
        mask[self.hot] = True
        return mask

    def draft_index(self) -> np.ndarray:
        """Target id -> draft id (-1 where the draft vocabulary lacks it)."""
        index = np.full(self.vocab_size, -1, dtype=np.int64)
        index[self.hot] = np.arange(len(self.hot))
        return index

    def summary(self) -> dict[str, object]:
        out: dict[str, object] = {"seed": self.seed, "active_tokens": len(self.active)}
        for i, name in enumerate(FAMILIES):
            members = self.family == i
            out[f"family_{name}"] = {
                "tokens": int(members.sum()),
                "words": len(self.words[name]),
                "tied_share": round(float(self.tied[members].mean()), 4),
            }
        return out


def make_plan(shape: TargetShape, seed: int, spec: PlanSpec | None = None) -> SeededPlan:
    spec = spec or PlanSpec.for_shape(shape)
    rng = np.random.default_rng([seed, 0x5EED])
    vocab = shape.vocab_size
    words = word_tokens()
    tokenizer_size = len(vocabulary())
    need_words = 2 * spec.words_per_family
    if need_words > len(words) or spec.words_per_family >= spec.region_size:
        raise ValueError(
            f"{spec.words_per_family} words per family do not fit: the tokenizer has "
            f"{len(words)} words and a region {spec.region_size} tokens"
        )
    active_total = 2 * spec.region_size
    if active_total + spec.copy_dims + 1 > shape.hidden_size:
        raise ValueError(
            f"{active_total} active tokens + {spec.copy_dims + 1} signal dimensions exceed "
            f"hidden_size {shape.hidden_size}: lower region_size"
        )
    if active_total > shape.draft_vocab_size or shape.draft_vocab_size > vocab:
        raise ValueError(
            f"draft_vocab_size {shape.draft_vocab_size} must hold the {active_total} active "
            f"tokens and be at most vocab_size {vocab}"
        )
    others = vocab - tokenizer_size
    if others < active_total - need_words:
        raise ValueError(f"vocab_size {vocab} leaves too few ids beyond the tokenizer")

    order = rng.permutation(len(words))
    chosen_words = [words[i] for i in order[:need_words]]
    extra_ids = tokenizer_size + rng.choice(others, size=active_total - need_words, replace=False)

    family = np.full(vocab, -1, dtype=np.int8)
    succ_next = np.full(vocab, -1, dtype=np.int64)
    succ_jump = np.full(vocab, -1, dtype=np.int64)
    sigma = np.zeros(vocab, dtype=np.int8)
    bit = np.zeros(vocab, dtype=np.int8)
    active: list[int] = []
    family_words: dict[str, tuple[str, ...]] = {}
    per_extra = spec.region_size - spec.words_per_family
    for f, name in enumerate(FAMILIES):
        own = chosen_words[f * spec.words_per_family : (f + 1) * spec.words_per_family]
        family_words[name] = tuple(w for w, _ in own)
        ids = np.array(
            [i for _, i in own] + list(extra_ids[f * per_extra : (f + 1) * per_extra]),
            dtype=np.int64,
        )
        cycle = ids[rng.permutation(len(ids))]
        active.extend(int(i) for i in cycle)
        family[cycle] = f
        sigma[cycle] = rng.choice(np.array([-1, 1], dtype=np.int8), size=len(cycle))
        bit[cycle] = rng.choice(np.array([-1, 1], dtype=np.int8), size=len(cycle))
        succ_next[cycle] = np.roll(cycle, -1)
        share = spec.tied_a if name == "a" else spec.tied_b
        n_tied = round(share * len(cycle))
        for pos in rng.choice(len(cycle), size=n_tied, replace=False):
            token, nxt = int(cycle[pos]), int(cycle[(pos + 1) % len(cycle)])
            # The jump skips a few tokens ahead (walks keep moving forward, so they visit tied
            # tokens at their share) and carries the sign opposite to the next token's, so the
            # context signal decides between the two: a random pick among the first
            # _JUMP_CHOICES opposite-signed tokens from two ahead on.
            ahead = (int(cycle[(pos + k) % len(cycle)]) for k in range(2, len(cycle)))
            pool = [t for t in ahead if sigma[t] == -sigma[nxt] and t != token]
            succ_jump[token] = pool[int(rng.integers(min(_JUMP_CHOICES, len(pool))))]

    active_arr = np.array(active, dtype=np.int64)
    fill = np.setdiff1d(np.arange(vocab, dtype=np.int64), active_arr)
    hot = np.sort(np.concatenate([active_arr, fill[: shape.draft_vocab_size - len(active_arr)]]))
    return SeededPlan(
        seed=seed,
        spec=spec,
        vocab_size=vocab,
        family=family,
        succ_next=succ_next,
        succ_jump=succ_jump,
        sigma=sigma,
        bit=bit,
        active=active_arr,
        hot=hot,
        words=family_words,
    )
