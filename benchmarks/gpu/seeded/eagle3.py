"""An EAGLE-3 head in plain PyTorch, computing what SGLang's LlamaForCausalLMEagle3 computes.

Inputs of one draft step at position t (SGLang 0.5.17, `llama_eagle3.py` and the EAGLE worker):
- `embeds`: the target's own embedding of the token the step starts from (the draft shares the
  target's embed_tokens); `input_layernorm` normalises it;
- `hidden`: on the first step the target's three captured streams concatenated (3H), mapped to
  H by `fc`; on later steps the head's own previous output (H, no fc);
- the layer: residual = hidden; attention over cat(input_layernorm(embeds),
  hidden_norm(hidden)) (2H -> q, k, v), o_proj, add; post_attention_layernorm; MLP; add;
- the output fed to the next step is the pre-norm sum; logits = lm_head(norm(output)) over the
  draft vocabulary (draft id -> target id through d2t).
KV entries: the first step's come from the verified prefix (the draft extend writes them with
the target's hidden states); step j >= 2 of a chain sits at position t + j - 1 and sees the
prefix up to t plus its own chain's entries. `unroll` trains all chains of a sequence at once
under exactly that visibility.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.gpu.model_folders import TargetShape
from benchmarks.gpu.seeded.llama import RMS_EPS, apply_rope, rope_tables


class RMSNorm(nn.Module):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + RMS_EPS)
        return (xf * self.weight.float()).to(x.dtype)


class Eagle3Head(nn.Module):
    def __init__(self, shape: TargetShape, init_std: float = 0.02) -> None:
        super().__init__()
        h, d = shape.hidden_size, shape.head_dim
        self.shape = shape
        self.heads, self.kv_heads, self.head_dim = (
            shape.num_attention_heads, shape.num_key_value_heads, d,
        )  # fmt: skip
        self.fc = nn.Linear(3 * h, h, bias=False)
        self.input_layernorm = RMSNorm(h)
        self.hidden_norm = RMSNorm(h)
        self.q_proj = nn.Linear(2 * h, self.heads * d, bias=False)
        self.k_proj = nn.Linear(2 * h, self.kv_heads * d, bias=False)
        self.v_proj = nn.Linear(2 * h, self.kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.heads * d, h, bias=False)
        self.post_attention_layernorm = RMSNorm(h)
        self.gate_proj = nn.Linear(h, shape.intermediate_size, bias=False)
        self.up_proj = nn.Linear(h, shape.intermediate_size, bias=False)
        self.down_proj = nn.Linear(shape.intermediate_size, h, bias=False)
        self.norm = RMSNorm(h)
        self.lm_head = nn.Linear(h, shape.draft_vocab_size, bias=False)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=init_std)

    def sglang_state(self) -> dict[str, torch.Tensor]:
        """Weights under the names SGLang's Eagle3 loader maps onto its parameters."""
        layer = "model.layers.0."
        names: dict[str, nn.Linear | RMSNorm] = {
            "model.fc.weight": self.fc,
            layer + "input_layernorm.weight": self.input_layernorm,
            layer + "hidden_norm.weight": self.hidden_norm,
            layer + "self_attn.q_proj.weight": self.q_proj,
            layer + "self_attn.k_proj.weight": self.k_proj,
            layer + "self_attn.v_proj.weight": self.v_proj,
            layer + "self_attn.o_proj.weight": self.o_proj,
            layer + "post_attention_layernorm.weight": self.post_attention_layernorm,
            layer + "mlp.gate_proj.weight": self.gate_proj,
            layer + "mlp.up_proj.weight": self.up_proj,
            layer + "mlp.down_proj.weight": self.down_proj,
            "model.norm.weight": self.norm,
            "lm_head.weight": self.lm_head,
        }
        out: dict[str, torch.Tensor] = {}
        for name, module in names.items():
            weight = module.weight
            assert isinstance(weight, torch.Tensor)
            out[name] = weight.detach()
        return out

    def _qkv(
        self, embeds: torch.Tensor, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = torch.cat((self.input_layernorm(embeds), self.hidden_norm(hidden)), dim=-1)
        b, t, _ = x.shape

        def heads(proj: nn.Linear, n: int) -> torch.Tensor:
            return proj(x).view(b, t, n, self.head_dim).transpose(1, 2)

        q = apply_rope(heads(self.q_proj, self.heads), cos, sin)
        k = apply_rope(heads(self.k_proj, self.kv_heads), cos, sin)
        return q, k, heads(self.v_proj, self.kv_heads)

    def _finish(
        self, hidden: torch.Tensor, attn: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        b, _, t, _ = attn.shape
        residual = hidden + self.o_proj(attn.transpose(1, 2).reshape(b, t, -1))
        x = self.post_attention_layernorm(residual)
        out = residual + self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return out, self.lm_head(self.norm(out))

    def unroll(
        self, embeds: list[torch.Tensor], aux: torch.Tensor, positions: torch.Tensor
    ) -> list[torch.Tensor]:
        """Draft logits of every chain for len(embeds) steps.

        embeds[j] (B, T, H): the embedding step j + 1 of chain t starts from (the token at
        t + 1 + j); aux (B, T, 3H): the target's captured streams at position t; positions
        (T,): t. Returns one (B, T, draft_vocab) tensor per step.
        """
        group = self.heads // self.kv_heads
        scale = 1.0 / math.sqrt(self.head_dim)
        t = aux.shape[1]
        causal = torch.ones(t, t, dtype=torch.bool, device=aux.device).tril()
        hidden = self.fc(aux)
        prefix_k = prefix_v = None
        own_k: list[torch.Tensor] = []
        own_v: list[torch.Tensor] = []
        logits = []
        for step, emb in enumerate(embeds):
            cos, sin = rope_tables(positions + step, self.head_dim)
            q, k, v = self._qkv(emb, hidden, cos, sin)
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            if prefix_k is None:
                prefix_k, prefix_v = k, v
            else:
                own_k.append(k)
                own_v.append(v)
            assert prefix_v is not None
            scores = (q.float() @ prefix_k.float().transpose(-1, -2)) * scale
            scores = scores.masked_fill(~causal, float("-inf"))
            diag = [(q.float() * ok.float()).sum(-1, keepdim=True) * scale for ok in own_k]
            probs = torch.cat([scores, *diag], dim=-1).softmax(dim=-1)
            attn = probs[..., :t].to(v.dtype) @ prefix_v
            for i, ov in enumerate(own_v):
                attn = attn + probs[..., t + i : t + i + 1].to(ov.dtype) * ov
            hidden, step_logits = self._finish(hidden, attn)
            logits.append(step_logits)
        return logits
