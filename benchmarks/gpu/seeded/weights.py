"""The seeded target's weights, in Hugging Face Llama names, made on the device from a seed.

Every matmul of the Llama shape runs at full size, but most results are thrown away on purpose:
- Token embeddings of the region tokens are orthogonal (rows of a random orthonormal basis,
  scaled to RMS 1); other ids get Gaussian rows.
- Every layer's o_proj and down_proj are zero except two: the residual stream stays exactly
  the current token's embedding through every layer EAGLE-3 reads (aux hidden states are
  captured at the inputs of layers 2, L/2 and L-3), so the head sees the token, nothing more.
- Layer L-3, head 0 ("hop 1"): sharp attention (random query/key maps) picks an earlier
  position and copies a random code of its token into `copy_dims` spare residual directions.
- Layer L-2, head 0 ("hop 2"): its query reads that code, so it picks a second position
  depending on the first, and writes that token's +-1 `bit` onto one more spare direction,
  the *signal*. Two chained lookups: one attention layer (the head's) cannot reproduce them.
- lm_head: row s = successor-logit * (sum of the basis directions of s's predecessors)
  + tie-logit * sigma(s) * (signal direction). A clear token's successor wins by about
  succ_logit - 2 * tie_logit; for a tied token the two successors differ only through the
  signal, by about 2 * tie_logit, and which one wins is the sign of the signal.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import torch

from benchmarks.gpu.model_folders import TargetShape
from benchmarks.gpu.seeded.plan import SeededPlan


@dataclass(frozen=True)
class SignalDesign:
    score_std: float = 12.0  # std of both hops' attention logits: sharp, so one position wins
    copy_norm: float = 0.5  # norm of the copied code, relative to the token's embedding
    signal_norm: float = 0.5  # norm of the signal, relative to the token's embedding
    succ_logit: float = 20.0  # a successor's logit (before the final norm's scale)
    tie_logit: float = 4.0  # what the signal adds or takes from each region token's logit

    def to_json(self) -> dict[str, float]:
        return asdict(self)


def layer_roles(num_layers: int) -> tuple[int, int]:
    """(hop 1, hop 2): the two layers after the last one whose input EAGLE-3 captures."""
    return num_layers - 3, num_layers - 2


def eagle_aux_layer_ids(num_layers: int) -> list[int]:
    """SGLang's `eagle_aux_hidden_state_layer_ids` for Llama (it captures at id + 1)."""
    return [1, num_layers // 2 - 1, num_layers - 4]


def build_target(
    plan: SeededPlan,
    shape: TargetShape,
    seed: int,
    device: torch.device,
    design: SignalDesign | None = None,
) -> dict[str, torch.Tensor]:
    """Every weight of the target (bf16, on `device`), named as a HF Llama checkpoint."""
    d = design or SignalDesign()
    gen = torch.Generator(device=device).manual_seed(seed)
    hidden, head_dim = shape.hidden_size, shape.head_dim
    n_act, r = len(plan.active), plan.spec.copy_dims
    bf16 = torch.bfloat16

    def randn(*size: int, std: float) -> torch.Tensor:
        return torch.randn(*size, generator=gen, device=device, dtype=torch.float32).mul_(std)

    basis, _ = torch.linalg.qr(randn(hidden, hidden, std=1.0))  # columns orthonormal
    tok_dirs = basis[:, :n_act]  # one per active token, in plan.active order
    copy_dirs = basis[:, n_act : n_act + r]
    signal_dir = basis[:, n_act + r]
    active = torch.as_tensor(plan.active, device=device)

    embed = torch.randn(shape.vocab_size, hidden, generator=gen, device=device, dtype=bf16)
    embed[active] = (math.sqrt(hidden) * tok_dirs.T).to(bf16)
    weights: dict[str, torch.Tensor] = {"model.embed_tokens.weight": embed}

    q_rows = shape.num_attention_heads * head_dim
    kv_rows = shape.num_key_value_heads * head_dim
    inter = shape.intermediate_size
    hop1, hop2 = layer_roles(shape.num_hidden_layers)
    filler = 1.0 / math.sqrt(hidden)
    for layer in range(shape.num_hidden_layers):
        p = f"model.layers.{layer}."
        q = torch.randn(q_rows, hidden, generator=gen, device=device, dtype=bf16).mul_(filler)
        k = torch.randn(kv_rows, hidden, generator=gen, device=device, dtype=bf16).mul_(filler)
        v = torch.randn(kv_rows, hidden, generator=gen, device=device, dtype=bf16).mul_(filler)
        o = torch.zeros(hidden, q_rows, device=device, dtype=bf16)
        if layer == hop1:
            s = math.sqrt(d.score_std / hidden)
            q[:head_dim] = randn(head_dim, hidden, std=s).to(bf16)
            k[:head_dim] = randn(head_dim, hidden, std=s).to(bf16)
            v[:r] = randn(r, hidden, std=filler).to(bf16)  # a code with N(0, 1) entries
            o[:, :r] = (d.copy_norm * math.sqrt(hidden / r) * copy_dirs).to(bf16)
        elif layer == hop2:
            rho2 = 1.0 + d.copy_norm**2  # squared RMS of the stream entering this layer
            s = math.sqrt(d.score_std * rho2 / (d.copy_norm * hidden))
            q[:head_dim] = (randn(head_dim, r, std=s) @ copy_dirs.T).to(bf16)
            k[:head_dim] = (randn(head_dim, n_act, std=s) @ tok_dirs.T).to(bf16)
            bits = torch.as_tensor(plan.bit[plan.active], device=device, dtype=torch.float32)
            v[0] = (tok_dirs @ bits / math.sqrt(hidden)).to(bf16)  # = bit(token) / RMS
            o[:, 0] = (d.signal_norm * math.sqrt(hidden * rho2) * signal_dir).to(bf16)
        weights[p + "self_attn.q_proj.weight"] = q
        weights[p + "self_attn.k_proj.weight"] = k
        weights[p + "self_attn.v_proj.weight"] = v
        weights[p + "self_attn.o_proj.weight"] = o
        weights[p + "mlp.gate_proj.weight"] = torch.randn(
            inter, hidden, generator=gen, device=device, dtype=bf16
        ).mul_(filler)
        weights[p + "mlp.up_proj.weight"] = torch.randn(
            inter, hidden, generator=gen, device=device, dtype=bf16
        ).mul_(filler)
        weights[p + "mlp.down_proj.weight"] = torch.zeros(hidden, inter, device=device, dtype=bf16)
        weights[p + "input_layernorm.weight"] = torch.ones(hidden, device=device, dtype=bf16)
        weights[p + "post_attention_layernorm.weight"] = torch.ones(
            hidden, device=device, dtype=bf16
        )
    weights["model.norm.weight"] = torch.ones(hidden, device=device, dtype=bf16)
    weights["lm_head.weight"] = _lm_head(plan, shape, d, tok_dirs, signal_dir)
    return weights


def _lm_head(
    plan: SeededPlan,
    shape: TargetShape,
    d: SignalDesign,
    tok_dirs: torch.Tensor,
    signal_dir: torch.Tensor,
) -> torch.Tensor:
    device, hidden = tok_dirs.device, shape.hidden_size
    n_act = len(plan.active)
    slot = np.full(plan.vocab_size, -1, dtype=np.int64)
    slot[plan.active] = np.arange(n_act)
    # preds[i, j] = 1 when active token j can be followed by active token i
    preds = np.zeros((n_act, n_act), dtype=np.float32)
    for j, token in enumerate(plan.active):
        preds[slot[plan.succ_next[token]], j] = 1.0
        if plan.succ_jump[token] >= 0:
            preds[slot[plan.succ_jump[token]], j] = 1.0
    rows = (d.succ_logit / math.sqrt(hidden)) * (torch.as_tensor(preds, device=device) @ tok_dirs.T)
    sigma = torch.as_tensor(plan.sigma[plan.active], device=device, dtype=torch.float32)
    rows += (d.tie_logit / (d.signal_norm * math.sqrt(hidden))) * sigma[:, None] * signal_dir
    head = torch.zeros(shape.vocab_size, hidden, device=device, dtype=torch.bfloat16)
    head[torch.as_tensor(plan.active, device=device)] = rows.to(torch.bfloat16)
    return head
