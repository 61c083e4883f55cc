"""Model folders for the GPU harness: written from configs (no download), or given.

A dummy folder holds a config.json and nothing else: SGLang's `--load-format dummy` fills
random weights of the config's shape. The target folder also gets the harness tokenizer
(benchmarks/gpu/tokenizer.py), which SGLang's text routes need. Two shapes: Llama-3.1-8B
and a tiny Llama (8 layers: EAGLE-3 reads hidden states from three layers of the target and
needs at least 7) for a quick check. Given folders (`--target/--draft`, e.g. a seeded target
and its trained head) are checked and used as they are, with their own weights.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from benchmarks.gpu.tokenizer import build_tokenizer, vocabulary

MIN_EAGLE3_TARGET_LAYERS = 7


@dataclass(frozen=True)
class TargetShape:
    name: str
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int = 128256
    max_position_embeddings: int = 8192
    draft_vocab_size: int = 32000


LLAMA_8B = TargetShape("llama8b", 4096, 14336, 32, 32, 8, 128)
TINY = TargetShape("tiny", 512, 1536, 8, 8, 8, 64)
SHAPES = {s.name: s for s in (LLAMA_8B, TINY)}


def target_config(shape: TargetShape) -> dict[str, Any]:
    """A Llama-3.1 config.json of `shape` (bos 1 / eos 2: the harness tokenizer's ids)."""
    if shape.num_hidden_layers < MIN_EAGLE3_TARGET_LAYERS:
        raise ValueError(f"{shape.name}: EAGLE-3 needs a target of at least "
                         f"{MIN_EAGLE3_TARGET_LAYERS} layers, got {shape.num_hidden_layers}")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_hidden_layers,
        "num_attention_heads": shape.num_attention_heads,
        "num_key_value_heads": shape.num_key_value_heads,
        "head_dim": shape.head_dim,
        "vocab_size": shape.vocab_size,
        "max_position_embeddings": shape.max_position_embeddings,
        "rope_theta": 500000.0,
        "rms_norm_eps": 1e-05,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
    }


def eagle3_config(shape: TargetShape) -> dict[str, Any]:
    """The EAGLE-3 head for a target of `shape`: one decoder layer, a reduced draft vocabulary."""
    config = target_config(shape)
    config.update(
        architectures=["LlamaForCausalLMEagle3"],
        num_hidden_layers=1,
        draft_vocab_size=shape.draft_vocab_size,
    )
    return config


@dataclass(frozen=True)
class ModelFolders:
    """What the servers load: folders, and whether SGLang must fill them with dummy weights."""

    target: str
    draft: str
    dummy: bool
    kind: str  # "dummy-<shape>", "given" or "seeded"
    datasets: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(data: dict[str, Any]) -> ModelFolders:
        return ModelFolders(
            target=str(data["target"]), draft=str(data["draft"]), dummy=bool(data["dummy"]),
            kind=str(data["kind"]), datasets=tuple(data.get("datasets") or ()),
        )  # fmt: skip


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")


def build_dummy_folders(root: Path, shape: TargetShape) -> ModelFolders:
    """root/target-<shape>/ (config + tokenizer) and root/eagle3-<shape>/ (config)."""
    target = root / f"target-{shape.name}"
    draft = root / f"eagle3-{shape.name}"
    _write_json(target / "config.json", target_config(shape))
    build_tokenizer(target, model_max_length=shape.max_position_embeddings)
    _write_json(draft / "config.json", eagle3_config(shape))
    if len(vocabulary()) > shape.vocab_size:
        raise ValueError(f"{shape.name}: vocab_size {shape.vocab_size} is smaller than the "
                         f"tokenizer's {len(vocabulary())} tokens")
    return ModelFolders(str(target.resolve()), str(draft.resolve()), True, f"dummy-{shape.name}")


class ModelFolderError(ValueError):
    """A given folder cannot be served; the message names the option and the fix."""


def check_given_folders(target: Path, draft: Path, kind: str = "given") -> ModelFolders:
    """Given target/draft folders: each needs a config.json, the target a tokenizer."""
    for option, folder in (("--target", target), ("--draft", draft)):
        if not (folder / "config.json").is_file():
            raise ModelFolderError(f"{option} {folder}: no config.json there; give a model "
                                   "folder (config.json and weights)")
    if not any((target / f).is_file() for f in ("tokenizer.json", "tokenizer.model")):
        raise ModelFolderError(f"--target {target}: no tokenizer.json or tokenizer.model; "
                               "write one with benchmarks.gpu.tokenizer.build_tokenizer(folder)")
    arch = json.loads((draft / "config.json").read_text()).get("architectures") or []
    if not any("Eagle3" in a for a in arch):
        raise ModelFolderError(f"--draft {draft}: config.json architectures {arch} name no "
                               "EAGLE-3 head (e.g. LlamaForCausalLMEagle3)")
    return ModelFolders(str(target.resolve()), str(draft.resolve()), False, kind)
