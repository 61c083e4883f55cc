"""Write the target and the head as model folders SGLang loads with its normal loader.

Target: config.json (the harness's Llama config of the shape), the harness tokenizer,
safetensors shards plus model.safetensors.index.json, HF Llama tensor names.
Head: config.json with "architectures": ["LlamaForCausalLMEagle3"], draft_vocab_size and the
aux layer ids, one model.safetensors with SGLang's Eagle3 parameter names (q/k/v and gate/up
unstacked: the loader stacks them), `d2t` (int64: target id = draft id + d2t) and `t2d` (bool
mask of the target ids the draft vocabulary holds; the loader skips it, heads ship it).
No embed_tokens in the head: SGLang gives the draft the target's embedding.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchmarks.gpu.model_folders import TargetShape, eagle3_config, target_config
from benchmarks.gpu.seeded.plan import SeededPlan
from benchmarks.gpu.seeded.weights import eagle_aux_layer_ids
from benchmarks.gpu.tokenizer import build_tokenizer

SHARD_BYTES = 5 * 1024**3


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


def draft_config(shape: TargetShape) -> dict[str, Any]:
    config = eagle3_config(shape)
    config["eagle_config"] = {
        "eagle_aux_hidden_state_layer_ids": eagle_aux_layer_ids(shape.num_hidden_layers),
        "use_aux_hidden_state": True,
    }
    return config


def write_target(folder: Path, weights: dict[str, torch.Tensor], shape: TargetShape) -> int:
    """Shards of at most SHARD_BYTES, in name order; returns the bytes written."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    _write_json(folder / "config.json", target_config(shape))
    build_tokenizer(folder, model_max_length=shape.max_position_embeddings)
    shards: list[list[str]] = [[]]
    size = 0
    for name in weights:
        nbytes = weights[name].numel() * weights[name].element_size()
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += nbytes
    weight_map: dict[str, str] = {}
    total = 0
    for i, names in enumerate(shards, start=1):
        file = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        part = {n: weights[n].detach().contiguous().cpu() for n in names}
        save_file(part, str(folder / file), metadata={"format": "pt"})
        total += sum(t.numel() * t.element_size() for t in part.values())
        weight_map.update(dict.fromkeys(names, file))
    _write_json(
        folder / "model.safetensors.index.json",
        {"metadata": {"total_size": total}, "weight_map": weight_map},
    )
    return total


def draft_tensors(state: dict[str, torch.Tensor], plan: SeededPlan) -> dict[str, torch.Tensor]:
    out = {name: t.detach().to(torch.bfloat16).contiguous().cpu() for name, t in state.items()}
    out["d2t"] = torch.from_numpy(plan.d2t().astype(np.int64))
    out["t2d"] = torch.from_numpy(plan.t2d())
    return out


def write_draft(
    folder: Path, state: dict[str, torch.Tensor], plan: SeededPlan, shape: TargetShape
) -> int:
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    _write_json(folder / "config.json", draft_config(shape))
    tensors = draft_tensors(state, plan)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return sum(t.numel() * t.element_size() for t in tensors.values())
