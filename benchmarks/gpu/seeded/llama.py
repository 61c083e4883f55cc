"""A plain PyTorch forward of a Llama checkpoint (HF names), as SGLang computes it.

Used to generate the head's training data from the very weights SGLang loads: RMSNorm in
fp32, rotary embedding in the neox layout (halves of each head rotate together), grouped
query attention, SiLU-gated MLP, a bf16 residual stream. `forward` also returns the residual
stream at the inputs of the layers EAGLE-3 captures (SGLang's `hidden_states + residual`).
Decoding uses a preallocated KV cache. On a CPU, give fp32 weights (bf16 matmuls are slow there).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from benchmarks.gpu.model_folders import TargetShape

RMS_EPS = 1e-5
ROPE_THETA = 500000.0


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = RMS_EPS) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * weight.float()).to(x.dtype)


def rope_tables(
    positions: torch.Tensor, head_dim: int, theta: float = ROPE_THETA
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape positions.shape + (head_dim // 2,), fp32."""
    inv_freq = 1.0 / (
        theta ** (torch.arange(0, head_dim, 2, device=positions.device).float() / head_dim)
    )
    angles = positions.float()[..., None] * inv_freq
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (..., T, head_dim) with cos/sin broadcastable to (..., T, head_dim // 2)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    out = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return out.to(x.dtype)


@dataclass
class KVCache:
    keys: list[torch.Tensor]  # per layer (B, kv_heads, max_len, head_dim)
    values: list[torch.Tensor]
    length: int = 0

    @staticmethod
    def empty(
        shape: TargetShape, batch: int, max_len: int, device: torch.device, dtype: torch.dtype
    ) -> KVCache:
        def one() -> torch.Tensor:
            return torch.empty(
                batch, shape.num_key_value_heads, max_len, shape.head_dim,
                device=device, dtype=dtype,
            )  # fmt: skip

        n = shape.num_hidden_layers
        return KVCache([one() for _ in range(n)], [one() for _ in range(n)])


class LlamaForward:
    def __init__(
        self, weights: dict[str, torch.Tensor], shape: TargetShape, aux_layers: list[int]
    ) -> None:
        self.w = weights
        self.shape = shape
        self.aux_layers = aux_layers  # capture the stream entering these layers

    @property
    def dtype(self) -> torch.dtype:
        return self.w["model.embed_tokens.weight"].dtype

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.w["model.embed_tokens.weight"])

    def forward(
        self, ids: torch.Tensor, cache: KVCache | None = None
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """ids (B, T) -> final normed hidden (B, T, H) and the captured aux streams.

        With a cache, the tokens sit at positions cache.length .. cache.length + T - 1 and
        attend to everything before them; without, it is a causal pass from position 0.
        """
        s = self.shape
        start = cache.length if cache is not None else 0
        batch, steps = ids.shape
        positions = torch.arange(start, start + steps, device=ids.device)
        cos, sin = rope_tables(positions, s.head_dim)
        h = self.embed(ids)
        aux: list[torch.Tensor] = []
        for layer in range(s.num_hidden_layers):
            if layer in self.aux_layers:
                aux.append(h)
            p = f"model.layers.{layer}."
            x = rms_norm(h, self.w[p + "input_layernorm.weight"])
            q = (x @ self.w[p + "self_attn.q_proj.weight"].T).view(batch, steps, -1, s.head_dim)
            k = (x @ self.w[p + "self_attn.k_proj.weight"].T).view(batch, steps, -1, s.head_dim)
            v = (x @ self.w[p + "self_attn.v_proj.weight"].T).view(batch, steps, -1, s.head_dim)
            q = apply_rope(q.transpose(1, 2), cos, sin)
            k = apply_rope(k.transpose(1, 2), cos, sin)
            v = v.transpose(1, 2)
            if cache is not None:
                cache.keys[layer][:, :, start : start + steps] = k
                cache.values[layer][:, :, start : start + steps] = v
                k = cache.keys[layer][:, :, : start + steps]
                v = cache.values[layer][:, :, : start + steps]
            attn = F.scaled_dot_product_attention(
                q, k, v, is_causal=steps > 1, enable_gqa=True
            ) if start == 0 or steps == 1 else _attend_offset(q, k, v, start)
            attn = attn.transpose(1, 2).reshape(batch, steps, -1)
            h = h + attn @ self.w[p + "self_attn.o_proj.weight"].T
            x = rms_norm(h, self.w[p + "post_attention_layernorm.weight"])
            gate = x @ self.w[p + "mlp.gate_proj.weight"].T
            up = x @ self.w[p + "mlp.up_proj.weight"].T
            h = h + (F.silu(gate) * up) @ self.w[p + "mlp.down_proj.weight"].T
        if cache is not None:
            cache.length = start + steps
        return rms_norm(h, self.w["model.norm.weight"]), aux

    def logits(self, normed: torch.Tensor) -> torch.Tensor:
        return normed @ self.w["lm_head.weight"].T

    def greedy(self, normed: torch.Tensor, chunk: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
        """Argmax token and the margin to the runner-up (fp32), chunked over positions."""
        flat = normed.reshape(-1, normed.shape[-1])
        ids, margins = [], []
        for part in flat.split(chunk):
            top = self.logits(part).float().topk(2, dim=-1)
            ids.append(top.indices[:, 0])
            margins.append(top.values[:, 0] - top.values[:, 1])
        lead = normed.shape[:-1]
        return torch.cat(ids).view(lead), torch.cat(margins).view(lead)


def _attend_offset(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int) -> torch.Tensor:
    """Several new tokens after `start` cached ones: causal among the new, all of the old."""
    steps, total = q.shape[2], k.shape[2]
    allowed = torch.ones(steps, total, dtype=torch.bool, device=q.device).tril(start)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=True)
