"""Random-weight bf16 transformer stacks, written for timing decode and verify forwards.

Everything is a plain function over a dict of weight tensors, so a whole forward can be
captured in one CUDA graph. The pieces that decide the step time are the ones a serving engine
runs: fused QKV and gate-up projections, RoPE, attention over a KV cache of `context` tokens
(one flash-attention call, which splits a long context over the GPU itself; a fallback
splits the context explicitly and merges the parts by their log-sum-exp), a routed-expert
FFN run as one grouped matmul over the experts the batch touches, the LM head over every
scored token, and greedy sampling.

KV layout: see `KVCache`. By default the n tokens of a forward are written into the cache
right after the context and one flash-attention call reads the cache in place, once per KV
head, as a serving engine's decode and verify kernels do (`attend_fused` says what it
simplifies).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from sims.calibrate.shapes import DraftShape, TargetShape

Weights = dict[str, Any]

# ----------------------------------------------------------------------------- attention

_FLASH_OK: dict[str, bool] = {}


def _partial_attention_math(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unmasked attention of q [.., Lq, D] over k/v [.., Lk, D]: output and log-sum-exp."""
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.matmul(torch.softmax(scores, dim=-1), v.float())
    return out, lse


def _partial_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Like `_partial_attention_math`, through the flash-attention kernel on a GPU."""
    if q.is_cuda and _FLASH_OK.get("flash", True):
        try:
            res = torch.ops.aten._scaled_dot_product_flash_attention(
                q, k, v, 0.0, False, False, scale=scale
            )
            return res[0], res[1]
        except RuntimeError:
            _FLASH_OK["flash"] = False
    return _partial_attention_math(q, k, v, scale)


def context_splits(batch: int, kv_heads: int, context: int, sms: int) -> int:
    """Chunks to split the context into so that batch * kv_heads * chunks fills the GPU twice.

    A power of two dividing the context, each chunk at least 128 tokens long.
    """
    splits = 1
    while (
        batch * kv_heads * splits < 2 * sms
        and context % (splits * 2) == 0
        and context // (splits * 2) >= 128
    ):
        splits *= 2
    return splits


def attend(
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_ctx: torch.Tensor,
    v_ctx: torch.Tensor,
    splits: int,
) -> torch.Tensor:
    """Causal attention of n new tokens per request over their context and each other.

    q [B, n, Hq, D]; k_new/v_new [B, n, Hkv, D]; k_ctx/v_ctx [B, Hkv, C, D] contiguous.
    Query heads that share a KV head are stacked as rows (row = i * G + g) so the cache is read
    once per KV head. The context part runs split `splits` ways; partial results merge by
    their log-sum-exp. Returns [B, n, Hq, D].
    """
    b, n, hq, d = q.shape
    hkv = k_new.shape[2]
    g = hq // hkv
    ctx = k_ctx.shape[2]
    scale = 1.0 / math.sqrt(d)
    rows = n * g
    qg = q.view(b, n, hkv, g, d).permute(0, 2, 1, 3, 4).reshape(b, hkv, rows, d)

    qa = qg.unsqueeze(2).expand(b, hkv, splits, rows, d).reshape(b, hkv * splits, rows, d)
    ka = k_ctx.view(b, hkv * splits, ctx // splits, d)
    va = v_ctx.view(b, hkv * splits, ctx // splits, d)
    out_a, lse_a = _partial_attention(qa, ka, va, scale)
    out_a = out_a.float().view(b, hkv, splits, rows, d)
    lse_a = lse_a.float().view(b, hkv, splits, rows)

    kb = k_new.permute(0, 2, 1, 3)  # [B, Hkv, n, D]
    vb = v_new.permute(0, 2, 1, 3)
    scores = torch.matmul(qg.float(), kb.float().transpose(-1, -2)) * scale  # [B,Hkv,rows,n]
    row_pos = torch.arange(rows, device=q.device) // g
    key_pos = torch.arange(n, device=q.device)
    scores = scores.masked_fill(key_pos[None, :] > row_pos[:, None], float("-inf"))
    lse_b = torch.logsumexp(scores, dim=-1)
    out_b = torch.matmul(torch.softmax(scores, dim=-1), vb.float())

    lse = torch.cat([lse_a, lse_b.unsqueeze(2)], dim=2)  # [B, Hkv, S+1, rows]
    weight = torch.softmax(lse, dim=2).unsqueeze(-1)
    out = (torch.cat([out_a, out_b.unsqueeze(2)], dim=2) * weight).sum(dim=2)
    out = out.view(b, hkv, n, g, d).permute(0, 2, 1, 3, 4).reshape(b, n, hq, d)
    return out.to(q.dtype)


def attend_cache(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, context: int
) -> torch.Tensor:
    """Attention of n new tokens over a cache that holds them right after `context` tokens.

    q [B, n, Hq, D]; k_cache/v_cache [B, Hkv, L_alloc, D]. Same computation as `attend`,
    reading the cache in place: one flash-attention call over the context (the kernel splits
    a long context across the GPU itself) plus the causal part among the n new tokens.
    A single flash call with a causal mask would read the cache once per query head, not once
    per KV head, when n > 1: several times the bytes a serving engine's verify kernel reads.
    """
    n = q.shape[1]
    k_new = k_cache[:, :, context : context + n].transpose(1, 2)
    v_new = v_cache[:, :, context : context + n].transpose(1, 2)
    return attend(q, k_new, v_new, k_cache[:, :, :context], v_cache[:, :, :context], 1)


def attend_fused(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, context: int
) -> torch.Tensor:
    """`attend_cache` as one flash-attention call, with the n new tokens all visible to each other.

    Reads the same bytes and does the same FLOPs as a serving engine's causal verify kernel
    (which applies the mask inside the kernel for free); what it saves is the dozen small
    kernels the exact causal part costs in eager PyTorch (see `attend_cache`), which no real
    engine launches. Values differ from causal attention only in which draft tokens a draft
    token sees, which is irrelevant to timing with random weights. For n = 1 it is exact.
    """
    b, n, hq, d = q.shape
    hkv = k_cache.shape[1]
    g = hq // hkv
    qg = q.view(b, n, hkv, g, d).permute(0, 2, 1, 3, 4).reshape(b, hkv, n * g, d)
    end = context + n
    out, _ = _partial_attention(qg, k_cache[:, :, :end], v_cache[:, :, :end], 1.0 / math.sqrt(d))
    return out.view(b, hkv, n, g, d).permute(0, 2, 1, 3, 4).reshape(b, n, hq, d).to(q.dtype)


def reference_attention(
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_ctx: torch.Tensor,
    v_ctx: torch.Tensor,
    causal: bool = True,
) -> torch.Tensor:
    """`attend` computed the obvious way in float32 (for checks only).

    causal=False: the new tokens see each other (what `attend_fused` computes).
    """
    n, hq = q.shape[1], q.shape[2]
    hkv = k_new.shape[2]
    k = torch.cat([k_ctx, k_new.permute(0, 2, 1, 3)], dim=2).float()
    v = torch.cat([v_ctx, v_new.permute(0, 2, 1, 3)], dim=2).float()
    k = k.repeat_interleave(hq // hkv, dim=1)
    v = v.repeat_interleave(hq // hkv, dim=1)
    ctx = k_ctx.shape[2]
    allowed = torch.arange(ctx + n, device=q.device)[None, :] <= (
        ctx + torch.arange(n, device=q.device)[:, None]
    )
    if not causal:
        allowed = torch.ones_like(allowed)
    out = F.scaled_dot_product_attention(q.permute(0, 2, 1, 3).float(), k, v, attn_mask=allowed)
    return out.permute(0, 2, 1, 3)


# ----------------------------------------------------------------------------- building blocks


def rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), w, 1e-6)


def rope_table(positions: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Complex rotations [n, D/2] for RoPE (theta 500000, adjacent-pair convention)."""
    inv = 1.0 / (500000.0 ** (torch.arange(0, head_dim, 2, device=positions.device) / head_dim))
    return torch.polar(torch.ones(1, device=positions.device), positions.float()[:, None] * inv)


def apply_rope(x: torch.Tensor, rot: torch.Tensor) -> torch.Tensor:
    """x [B, n, H, D] (queries and keys stacked along H); rot [n, D/2] complex."""
    xc = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)))
    return torch.view_as_real(xc * rot[None, :, None, :]).flatten(-2).to(x.dtype)


def grouped_mm(x: torch.Tensor, w: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """Rows [ends[e-1], ends[e]) of x times w[e].T for every expert e; other rows are left 0.

    x [R, K]; w [E, N, K]; ends [E] int32 cumulative row ends. On a GPU this is one grouped
    GEMM that reads only the experts with rows; the CPU path loops (tiny shapes only).
    """
    if x.is_cuda:
        return torch._grouped_mm(x, w.transpose(-2, -1), offs=ends)
    out = x.new_zeros(x.shape[0], w.shape[1])
    start = 0
    for e, end in enumerate(ends.tolist()):
        if end > start:
            out[start:end] = x[start:end] @ w[e].T
        start = end
    return out


MOE_ROW_ALIGN = 16  # each expert's row group starts on a multiple of this many rows


def moe_ffn(h: torch.Tensor, w: Weights, top_k: int) -> torch.Tensor:
    """Top-k routed FFN (softmax over the top-k router logits), static shapes only.

    Slots (token, choice) are sorted by expert; each expert's rows start on an aligned row of
    a buffer, one grouped GEMM runs gate-up and one runs down, and a batched matmul sums each
    token's top-k outputs with their router weights.
    """
    t, hidden = h.shape
    experts = w["router"].shape[0]
    ffn = w["w_down"].shape[2]
    top_logits, ids = F.linear(h, w["router"]).topk(top_k, dim=-1)
    topw = top_logits.float().softmax(dim=-1)
    slots = t * top_k
    sorted_e, order = ids.flatten().sort(stable=True)
    expert_ids = torch.arange(experts, device=h.device)
    ends = torch.searchsorted(sorted_e, expert_ids, right=True)
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    padded = (counts + (MOE_ROW_ALIGN - 1)) & -MOE_ROW_ALIGN
    pad_ends = torch.cumsum(padded, 0)
    shift = pad_ends - padded - (ends - counts)  # aligned start minus unaligned start
    dest = torch.arange(slots, device=h.device) + shift[sorted_e]
    xbuf = h.new_zeros(slots + experts * (MOE_ROW_ALIGN - 1), hidden)
    xbuf[dest] = h[order // top_k]
    group_ends = pad_ends.to(torch.int32)
    gate_up = grouped_mm(xbuf, w["w_gate_up"], group_ends)
    down = grouped_mm(F.silu(gate_up[:, :ffn]) * gate_up[:, ffn:], w["w_down"], group_ends)
    slot_row = torch.empty_like(dest)
    slot_row[order] = dest
    picked = down[slot_row].view(t, top_k, hidden)
    return torch.bmm(topw.to(h.dtype).unsqueeze(1), picked).squeeze(1)


def reference_moe_ffn(h: torch.Tensor, w: Weights, top_k: int) -> torch.Tensor:
    """`moe_ffn` one token at a time in float32 (for checks only). The experts are the ones
    `moe_ffn`'s own router picks: a float32 router can rank two near-tied experts the other
    way round, which would be a different token route, not an error in the grouped FFN."""
    ffn = w["w_down"].shape[2]
    top_logits, ids = F.linear(h, w["router"]).topk(top_k, dim=-1)
    topw = top_logits.float().softmax(dim=-1)
    out = torch.zeros_like(h, dtype=torch.float32)
    for i in range(h.shape[0]):
        for j in range(top_k):
            e = int(ids[i, j])
            gu = w["w_gate_up"][e].float() @ h[i].float()
            out[i] += topw[i, j] * (w["w_down"][e].float() @ (F.silu(gu[:ffn]) * gu[ffn:]))
    return out


def dense_ffn(h: torch.Tensor, w: Weights) -> torch.Tensor:
    gate_up = F.linear(h, w["w_gate_up"])
    ffn = gate_up.shape[-1] // 2
    return F.linear(F.silu(gate_up[:, :ffn]) * gate_up[:, ffn:], w["w_down"])


# ----------------------------------------------------------------------------- weights


def _param(shape: tuple[int, ...], device: torch.device, fan_in: int) -> torch.Tensor:
    return torch.empty(shape, dtype=torch.bfloat16, device=device).normal_(0.0, fan_in**-0.5)


def _ones(n: int, device: torch.device) -> torch.Tensor:
    return torch.ones(n, dtype=torch.bfloat16, device=device)


def _attn_weights(
    in_dim: int, hidden: int, heads: int, kv_heads: int, head_dim: int, device: torch.device
) -> Weights:
    qkv_out = (heads + 2 * kv_heads) * head_dim
    return {
        "w_qkv": _param((qkv_out, in_dim), device, in_dim),
        "w_o": _param((hidden, heads * head_dim), device, heads * head_dim),
    }


def build_target(shape: TargetShape, device: torch.device) -> Weights:
    layers = []
    for _ in range(shape.layers):
        lw = _attn_weights(
            shape.hidden, shape.hidden, shape.heads, shape.kv_heads, shape.head_dim, device
        )
        lw["ln1"] = _ones(shape.hidden, device)
        lw["ln2"] = _ones(shape.hidden, device)
        if shape.qk_norm:  # q_norm and k_norm, laid out per stacked head
            lw["qk_norm"] = _ones(shape.head_dim, device).repeat(shape.heads + shape.kv_heads, 1)
        if shape.is_moe:
            e, f, h = shape.experts, shape.expert_ffn, shape.hidden
            lw["router"] = _param((e, h), device, h)
            lw["w_gate_up"] = _param((e, 2 * f, h), device, h)
            lw["w_down"] = _param((e, h, f), device, f)
        else:
            lw["w_gate_up"] = _param((2 * shape.ffn, shape.hidden), device, shape.hidden)
            lw["w_down"] = _param((shape.hidden, shape.ffn), device, shape.ffn)
        layers.append(lw)
    return {
        "embed": _param((shape.vocab, shape.hidden), device, 1),
        "layers": layers,
        "norm": _ones(shape.hidden, device),
        "lm_head": _param((shape.vocab, shape.hidden), device, shape.hidden),
    }


def build_draft(shape: DraftShape, target_hidden: int, device: torch.device) -> Weights:
    h = shape.hidden
    w = _attn_weights(2 * h, h, shape.heads, shape.kv_heads, shape.head_dim, device)
    w.update(
        {
            "fc": _param((h, 3 * target_hidden), device, 3 * target_hidden),
            "ln_embed": _ones(h, device),
            "ln_hidden": _ones(h, device),
            "ln2": _ones(h, device),
            "w_gate_up": _param((2 * shape.ffn, h), device, h),
            "w_down": _param((h, shape.ffn), device, shape.ffn),
            "norm": _ones(h, device),
            "lm_head": _param((shape.vocab, h), device, h),
        }
    )
    return w


ATTENTION_MODES = ("fused", "cache", "split")


@dataclass
class KVCache:
    """Per-layer K/V for B requests of `context` tokens, in one of two layouts.

    mode "fused" / "cache": k/v [B, Hkv, context + n_max, D]; a forward writes its n tokens
    after the context and `attend_fused` / `attend_cache` read it in place (what serving
    engines do).
    mode "split": k/v [B, Hkv, context, D] plus new-token buffers [B, n_max, Hkv, D] that
    `attend` merges in (the fallback where the flash kernel cannot take the first layout).
    """

    mode: str
    k: list[torch.Tensor]
    v: list[torch.Tensor]
    k_new: list[torch.Tensor]
    v_new: list[torch.Tensor]

    @staticmethod
    def random(
        layers: int, batch: int, kv_heads: int, context: int, head_dim: int, n_max: int,
        device: torch.device, mode: str = "cache",
    ) -> KVCache:
        if mode not in ATTENTION_MODES:
            raise ValueError(f"attention mode {mode!r} is not one of {ATTENTION_MODES}")
        length = context if mode == "split" else context + n_max

        def kv() -> torch.Tensor:
            shape = (batch, kv_heads, length, head_dim)
            return torch.empty(shape, dtype=torch.bfloat16, device=device).normal_()

        def new() -> torch.Tensor:
            shape = (batch, n_max, kv_heads, head_dim)
            return torch.zeros(shape, dtype=torch.bfloat16, device=device)

        n_new = layers if mode == "split" else 0
        return KVCache(
            mode,
            [kv() for _ in range(layers)],
            [kv() for _ in range(layers)],
            [new() for _ in range(n_new)],
            [new() for _ in range(n_new)],
        )


@dataclass
class StepInputs:
    """Static inputs of one forward shape: B requests of n tokens after `context` tokens."""

    batch: int
    tokens: int
    context: int
    splits: int
    rot: torch.Tensor

    @staticmethod
    def make(
        batch: int, tokens: int, context: int, head_dim: int, sms: int, kv_heads: int,
        device: torch.device,
    ) -> StepInputs:
        pos = torch.arange(context, context + tokens, device=device)
        splits = context_splits(batch, kv_heads, context, sms)
        return StepInputs(batch, tokens, context, splits, rope_table(pos, head_dim))


def _attention_block(
    x_in: torch.Tensor, w: Weights, cache: KVCache, layer: int, step: StepInputs,
    heads: int, kv_heads: int, head_dim: int,
) -> torch.Tensor:
    b, n, ctx = step.batch, step.tokens, step.context
    qkv = F.linear(x_in, w["w_qkv"]).view(b, n, heads + 2 * kv_heads, head_dim)
    qk = qkv[:, :, : heads + kv_heads]
    if "qk_norm" in w:  # Qwen3: RMSNorm per head on queries and keys
        qk = F.rms_norm(qk, (head_dim,), None, 1e-6) * w["qk_norm"]
    qk = apply_rope(qk, step.rot)
    q, k, v = qk[:, :, :heads], qk[:, :, heads:], qkv[:, :, heads + kv_heads :]
    if cache.mode != "split":
        cache.k[layer][:b, :, ctx : ctx + n].copy_(k.transpose(1, 2))
        cache.v[layer][:b, :, ctx : ctx + n].copy_(v.transpose(1, 2))
        attend_in_place = attend_fused if cache.mode == "fused" else attend_cache
        out = attend_in_place(q, cache.k[layer][:b], cache.v[layer][:b], ctx)
    else:
        k_buf = cache.k_new[layer][:b, :n]
        v_buf = cache.v_new[layer][:b, :n]
        k_buf.copy_(k)
        v_buf.copy_(v)
        out = attend(
            q, k_buf, v_buf, cache.k[layer][:b], cache.v[layer][:b], step.splits
        )
    return F.linear(out.reshape(b * n, heads * head_dim), w["w_o"])


def eagle3_aux_layers(layers: int) -> tuple[int, int, int]:
    """Target layers whose outputs EAGLE-3 feeds its draft (low, middle, high)."""
    return (1, layers // 2 - 1, layers - 4)


def target_forward(
    shape: TargetShape, w: Weights, cache: KVCache, ids: torch.Tensor, step: StepInputs
) -> tuple[torch.Tensor, torch.Tensor]:
    """One verify/decode forward of B*n tokens: next-token ids [B*n], aux hiddens [B*n, 3H]."""
    x = F.embedding(ids, w["embed"])
    aux_at = eagle3_aux_layers(shape.layers)
    aux = []
    for i, lw in enumerate(w["layers"]):
        x = x + _attention_block(
            rms_norm(x, lw["ln1"]), lw, cache, i, step, shape.heads, shape.kv_heads,
            shape.head_dim,
        )
        h = rms_norm(x, lw["ln2"])
        x = x + (moe_ffn(h, lw, shape.top_k) if shape.is_moe else dense_ffn(h, lw))
        if i in aux_at:
            aux.append(x)
    logits = F.linear(rms_norm(x, w["norm"]), w["lm_head"])
    return logits.argmax(dim=-1), torch.cat(aux, dim=-1)


def draft_forward(
    shape: DraftShape, w: Weights, embed: torch.Tensor, cache: KVCache, ids: torch.Tensor,
    hidden: torch.Tensor, step: StepInputs, from_target: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One EAGLE-3 draft forward over B*n tokens; logits only for each request's last token.

    from_target: `hidden` is the target's 3 concatenated aux hiddens (the extend after a
    verify), else the draft's own previous hidden (a draft step).
    """
    if from_target:
        hidden = F.linear(hidden, w["fc"])
    x_in = torch.cat(
        [rms_norm(F.embedding(ids, embed), w["ln_embed"]), rms_norm(hidden, w["ln_hidden"])],
        dim=-1,
    )
    x = hidden + _attention_block(
        x_in, w, cache, 0, step, shape.heads, shape.kv_heads, shape.head_dim
    )
    x = x + dense_ffn(rms_norm(x, w["ln2"]), w)
    last = x.view(step.batch, step.tokens, -1)[:, -1]
    logits = F.linear(rms_norm(last, w["norm"]), w["lm_head"])
    return logits.argmax(dim=-1), x
