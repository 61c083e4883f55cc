"""Shapes of the models the calibration benchmark builds (no torch needed here)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

BF16_BYTES = 2


@dataclass(frozen=True)
class TargetShape:
    """A decoder-only target model. `experts` = 0 means every layer has a dense FFN."""

    name: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    experts: int = 0
    top_k: int = 0
    expert_ffn: int = 0
    qk_norm: bool = False

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    def attn_params(self) -> int:
        q = self.heads * self.head_dim
        kv = self.kv_heads * self.head_dim
        return self.hidden * (q + 2 * kv) + q * self.hidden

    def expert_params(self) -> int:
        """Parameters of one routed expert (gate, up, down)."""
        return 3 * self.hidden * self.expert_ffn

    def dense_layer_params(self) -> int:
        """Parameters read by every token in one layer: attention, norms, FFN or router."""
        ffn = self.hidden * self.experts if self.is_moe else 3 * self.hidden * self.ffn
        return self.attn_params() + ffn + 2 * self.hidden

    def dense_bytes(self) -> int:
        """Weights every forward reads whatever the batch: layers' dense part and the LM head.

        The embedding table is excluded: a forward reads only the rows of its tokens.
        """
        per_layer = self.dense_layer_params()
        return BF16_BYTES * (self.layers * per_layer + self.vocab * self.hidden + self.hidden)

    def expert_bytes(self) -> int:
        """All routed experts' weights (0 for a dense model)."""
        return BF16_BYTES * self.layers * self.experts * self.expert_params()

    def active_bytes(self, tokens: int = 1) -> int:
        """Weights one forward of `tokens` tokens reads if each token picks distinct experts."""
        if not self.is_moe:
            return self.dense_bytes()
        touched = min(self.experts, self.top_k * tokens)
        return self.dense_bytes() + BF16_BYTES * self.layers * touched * self.expert_params()

    def kv_bytes_per_token(self) -> int:
        return BF16_BYTES * 2 * self.layers * self.kv_heads * self.head_dim

    def flops_per_token(self) -> int:
        """Matmul FLOPs per token, excluding attention over the context."""
        ffn = 3 * self.hidden * self.expert_ffn * self.top_k if self.is_moe else 0
        dense = self.attn_params() + (self.hidden * self.experts if self.is_moe else 0)
        if not self.is_moe:
            dense += 3 * self.hidden * self.ffn
        return 2 * (self.layers * (dense + ffn) + self.vocab * self.hidden)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class DraftShape:
    """An EAGLE-3 draft head: fc(3 target hidden states) -> one decoder layer -> LM head.

    The layer's attention reads [embedding ; hidden] (2 * hidden wide), as EAGLE-3's does.
    """

    name: str
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int

    def weight_bytes(self) -> int:
        q = self.heads * self.head_dim
        kv = self.kv_heads * self.head_dim
        fc = 3 * self.hidden * self.hidden
        attn = 2 * self.hidden * (q + 2 * kv) + q * self.hidden
        mlp = 3 * self.hidden * self.ffn
        return BF16_BYTES * (fc + attn + mlp + self.vocab * self.hidden + 4 * self.hidden)

    def kv_bytes_per_token(self) -> int:
        return BF16_BYTES * 2 * self.kv_heads * self.head_dim

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Preset:
    """A target, its draft head and the context lengths / batch sizes to measure."""

    key: str
    target: TargetShape
    draft: DraftShape
    contexts: tuple[int, ...]
    batches: tuple[int, ...]
    max_tokens_per_req: int = 8
    # Largest batch measured at each context: the KV cache must fit next to the weights.
    max_batch_at: tuple[tuple[int, int], ...] = ()

    def batches_at(self, context: int) -> tuple[int, ...]:
        cap = dict(self.max_batch_at).get(context, max(self.batches))
        return tuple(b for b in self.batches if b <= cap)


ALL_BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)

LLAMA_8B = TargetShape(
    name="llama-3.1-8b", hidden=4096, layers=32, heads=32, kv_heads=8, head_dim=128,
    ffn=14336, vocab=128256,
)
# EAGLE-3 head for Llama-3.1-8B: one Llama layer at the target's width, full-vocabulary head.
LLAMA_8B_EAGLE3 = DraftShape(
    name="eagle3-llama-3.1-8b", hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=14336,
    vocab=128256,
)
QWEN3_30B_A3B = TargetShape(
    name="qwen3-30b-a3b", hidden=2048, layers=48, heads=32, kv_heads=4, head_dim=128, ffn=0,
    vocab=151936, experts=128, top_k=8, expert_ffn=768, qk_norm=True,
)
# EAGLE-3 heads published for Qwen3-30B-A3B are one dense Llama-style layer at width 2048.
QWEN3_30B_A3B_EAGLE3 = DraftShape(
    name="eagle3-qwen3-30b-a3b", hidden=2048, heads=32, kv_heads=4, head_dim=128, ffn=6144,
    vocab=151936,
)

TINY_DENSE = TargetShape(
    name="tiny-dense", hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, ffn=128, vocab=256,
)
TINY_MOE = TargetShape(
    name="tiny-moe", hidden=64, layers=2, heads=4, kv_heads=2, head_dim=16, ffn=0, vocab=256,
    experts=8, top_k=2, expert_ffn=32, qk_norm=True,
)
TINY_DRAFT = DraftShape(
    name="tiny-eagle3", hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=128, vocab=256,
)

PRESETS: dict[str, Preset] = {
    "llama8b": Preset(
        key="llama8b", target=LLAMA_8B, draft=LLAMA_8B_EAGLE3, contexts=(1024, 8192),
        batches=ALL_BATCHES, max_batch_at=((8192, 64),),
    ),
    "moe": Preset(
        key="moe", target=QWEN3_30B_A3B, draft=QWEN3_30B_A3B_EAGLE3, contexts=(1024, 8192),
        batches=ALL_BATCHES, max_batch_at=((8192, 64),),
    ),
    "tiny-dense": Preset(
        key="tiny-dense", target=TINY_DENSE, draft=TINY_DRAFT, contexts=(32, 64),
        batches=(1, 2, 4), max_tokens_per_req=3,
    ),
    "tiny-moe": Preset(
        key="tiny-moe", target=TINY_MOE, draft=TINY_DRAFT, contexts=(32,), batches=(1, 4),
        max_tokens_per_req=3,
    ),
}
