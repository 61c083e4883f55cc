"""Training data from the target's own greedy decoding, the head's training loop, and an offline
acceptance estimate of the trained head (what SGLang should measure when it serves the pair).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.gpu.seeded.eagle3 import Eagle3Head
from benchmarks.gpu.seeded.llama import KVCache, LlamaForward
from benchmarks.gpu.seeded.plan import FAMILIES, SeededPlan


@dataclass
class Rollouts:
    """Greedy continuations of prompts: tokens (N, T + 1), target argmax and aux at 0..T-1."""

    tokens: torch.Tensor  # int64
    greedy: torch.Tensor  # int64, greedy[:, p] = the target's next token after position p
    margin: torch.Tensor  # fp32, top-1 minus top-2 logit at each position
    aux: torch.Tensor  # bf16 (N, T, 3H)
    family: torch.Tensor  # int64 (N,), index into FAMILIES
    prompt_len: int


def word_prompts(
    plan: SeededPlan, family: str, count: int, length: int, rng: np.random.Generator
) -> np.ndarray:
    """`count` prompts of `length` random words of `family` (as target ids)."""
    from benchmarks.gpu.tokenizer import word_id

    ids = np.array([word_id(w) for w in plan.words[family]], dtype=np.int64)
    return rng.choice(ids, size=(count, length))


@torch.no_grad()
def rollout(
    model: LlamaForward, prompts: torch.Tensor, new_tokens: int, batch: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Greedy-decode `new_tokens` after each prompt with a KV cache, in batches."""
    out_tokens, out_greedy, out_margin, out_aux = [], [], [], []
    length = prompts.shape[1] + new_tokens
    for part in prompts.split(batch):
        cache = KVCache.empty(model.shape, part.shape[0], length, part.device, model.dtype)
        normed, aux = model.forward(part, cache)
        greedy, margin = model.greedy(normed)
        tokens, greedies, margins, auxes = [part], [greedy], [margin], [torch.cat(aux, -1)]
        for _ in range(new_tokens - 1):
            step = greedies[-1][:, -1:]
            tokens.append(step)
            normed, aux = model.forward(step, cache)
            greedy, margin = model.greedy(normed)
            greedies.append(greedy)
            margins.append(margin)
            auxes.append(torch.cat(aux, -1))
        tokens.append(greedies[-1][:, -1:])
        out_tokens.append(torch.cat(tokens, 1))
        out_greedy.append(torch.cat(greedies, 1))
        out_margin.append(torch.cat(margins, 1))
        out_aux.append(torch.cat(auxes, 1))
    return torch.cat(out_tokens), torch.cat(out_greedy), torch.cat(out_margin), torch.cat(out_aux)


def make_rollouts(
    model: LlamaForward,
    plan: SeededPlan,
    per_family: int,
    prompt_len: int,
    new_tokens: int,
    batch: int,
    seed: int,
    device: torch.device,
) -> Rollouts:
    rng = np.random.default_rng([seed, 0xDA7A])
    parts = []
    for f, name in enumerate(FAMILIES):
        prompts = torch.as_tensor(word_prompts(plan, name, per_family, prompt_len, rng))
        tokens, greedy, margin, aux = rollout(model, prompts.to(device), new_tokens, batch)
        parts.append((tokens, greedy, margin, aux, torch.full((per_family,), f)))
    return Rollouts(
        tokens=torch.cat([p[0] for p in parts]),
        greedy=torch.cat([p[1] for p in parts]),
        margin=torch.cat([p[2] for p in parts]),
        aux=torch.cat([p[3] for p in parts]),
        family=torch.cat([p[4] for p in parts]).to(device),
        prompt_len=prompt_len,
    )


@torch.no_grad()
def prefill_agreement(model: LlamaForward, data: Rollouts, count: int) -> float:
    """Share of positions where a one-pass causal forward picks the token decoding picked.

    The same weights through a different kernel sequence (decode with a cache vs one pass):
    an estimate of how often bf16 noise flips a greedy choice between two servers.
    """
    rows = data.tokens[:count, :-1]
    normed, _ = model.forward(rows)
    again, _ = model.greedy(normed)
    return float((again == data.greedy[:count]).float().mean())


@dataclass(frozen=True)
class TrainConfig:
    steps: int
    batch: int  # sequences per step
    lr: float = 1e-3
    draft_steps: int = 3  # unrolled draft steps (steps >= 2 feed the head's own output back)
    warmup: int = 20
    step_weight: float = 0.8  # loss weight of step j is step_weight ** (j - 1)


def _chain_inputs(
    embed: torch.Tensor,
    tokens: torch.Tensor,
    greedy: torch.Tensor,
    draft_index: torch.Tensor,
    prompt_len: int,
    steps: int,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per step: the embeddings each chain starts from, and its label (-100: no label).

    Chain t's step j (1-based) starts from token t + j and should propose greedy[t + j] (the
    target's pick after it). Step 1 is labelled everywhere; later steps only where the tokens
    they start from were greedy themselves (t + 2 >= prompt_len), as when serving.
    """
    length = greedy.shape[1]
    t = torch.arange(length, device=tokens.device)
    embeds, labels = [], []
    for j in range(1, steps + 1):
        src = (t + j).clamp(max=tokens.shape[1] - 1)
        embeds.append(embed[tokens[:, src]])
        lab_pos = (t + j).clamp(max=length - 1)
        lab = draft_index[greedy[:, lab_pos]]
        valid = (t + j <= length - 1) & ((j == 1) | (t + 2 >= prompt_len))
        labels.append(torch.where(valid[None, :] & (lab >= 0), lab, -100))
    return embeds, labels


def train_head(
    head: Eagle3Head,
    embed: torch.Tensor,
    data: Rollouts,
    rows: torch.Tensor,
    draft_index: torch.Tensor,
    cfg: TrainConfig,
    seed: int,
    log: Callable[[str], None] = print,
) -> list[float]:
    """Train on the rollouts' `rows`; return the loss of every step."""
    device = embed.device
    opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    positions = torch.arange(data.greedy.shape[1], device=device)
    weights = [cfg.step_weight**j for j in range(cfg.draft_steps)]
    losses: list[float] = []
    t0 = time.perf_counter()
    use_bf16 = device.type == "cuda"
    for step in range(cfg.steps):
        lr = cfg.lr * min(1.0, (step + 1) / cfg.warmup)
        lr *= 0.5 * (1 + math.cos(math.pi * step / cfg.steps))
        for group in opt.param_groups:
            group["lr"] = lr
        pick = rows[torch.randint(len(rows), (cfg.batch,), generator=gen)].to(device)
        embeds, labels = _chain_inputs(
            embed, data.tokens[pick], data.greedy[pick], draft_index, data.prompt_len,
            cfg.draft_steps,
        )  # fmt: skip
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16):
            logits = head.unroll(embeds, data.aux[pick], positions)
        loss = sum(
            w * F.cross_entropy(lg.float().flatten(0, 1), lab.flatten(), ignore_index=-100)
            for w, lg, lab in zip(weights, logits, labels, strict=True)
        ) / sum(weights)
        opt.zero_grad(set_to_none=True)
        assert isinstance(loss, torch.Tensor)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        if step % max(1, cfg.steps // 10) == 0 or step == cfg.steps - 1:
            log(f"  train step {step:4d}/{cfg.steps}  loss {losses[-1]:.4f}  "
                f"lr {lr:.2e}  {time.perf_counter() - t0:.1f} s")  # fmt: skip
    return losses


@torch.no_grad()
def offline_acceptance(
    head: Eagle3Head,
    embed: torch.Tensor,
    data: Rollouts,
    rows: torch.Tensor,
    draft_index: torch.Tensor,
    steps: int,
    batch: int = 16,
) -> dict[str, dict[str, list[float]]]:
    """Per family: P(draft token k right | tokens 1..k-1 right) for k = 1..steps, and the
    implied accept length (tokens per verify, bonus included) at depth 1..steps.

    Chains start in the generated part (t >= prompt_len - 2), as during decoding. Inputs of
    steps >= 2 are the greedy tokens: where every earlier draft was right these are the
    head's own tokens, and only those chains count for the next position.
    """
    device = embed.device
    positions = torch.arange(data.greedy.shape[1], device=device)
    hits: dict[int, np.ndarray] = {}
    counts: dict[int, np.ndarray] = {}
    use_bf16 = device.type == "cuda"
    for part in rows.split(batch):
        part = part.to(device)
        embeds, labels = _chain_inputs(
            embed, data.tokens[part], data.greedy[part], draft_index, data.prompt_len, steps
        )
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_bf16):
            logits = head.unroll(embeds, data.aux[part], positions)
        start = max(data.prompt_len - 2, 0)
        alive = labels[-1][:, start:] >= 0  # every step labelled
        fam = data.family[part]
        for f in fam.unique().tolist():
            hits.setdefault(f, np.zeros(steps))
            counts.setdefault(f, np.zeros(steps))
        for k, (lg, lab) in enumerate(zip(logits, labels, strict=True)):
            right = lg.argmax(-1)[:, start:] == lab[:, start:]
            for f in fam.unique().tolist():
                sel = alive & (fam == f)[:, None]
                counts[f][k] += float(sel.sum())
                hits[f][k] += float((sel & right).sum())
            alive = alive & right
    out: dict[str, dict[str, list[float]]] = {}
    for f, name in enumerate(FAMILIES):
        if f not in counts:
            continue
        cond = [h / c if c else 0.0 for h, c in zip(hits[f], counts[f], strict=True)]
        reach = np.cumprod(cond)
        out[name] = {
            "per_position": [round(float(x), 4) for x in cond],
            "accept_length": [round(1.0 + float(reach[:d].sum()), 4) for d in range(1, steps + 1)],
        }
    return out


def tie_stats(plan: SeededPlan, data: Rollouts, near: float = 0.5) -> dict[str, float]:
    """How the target's tied choices fell: share of each successor, and near-tie margins."""
    prompt = data.prompt_len
    prev = data.tokens[:, prompt - 1 : -1].cpu().numpy()
    nxt = data.tokens[:, prompt:].cpu().numpy()
    margin = data.margin[:, prompt - 1 :].float().cpu().numpy()
    tied = plan.tied[prev]
    follows = (plan.succ_next[prev] == nxt) | (plan.succ_jump[prev] == nxt)
    return {
        "follows_plan": round(float(follows.mean()), 5),
        "tied_share_visited": round(float(tied.mean()), 4),
        "tied_to_next": round(float((plan.succ_next[prev] == nxt)[tied].mean()), 4),
        f"tied_margin_below_{near:g}": round(float((margin[tied] < near).mean()), 5),
        "clear_margin_min": round(float(margin[~tied].min()), 3) if (~tied).any() else 0.0,
        "tied_margin_median": round(float(np.median(margin[tied])), 3),
    }
