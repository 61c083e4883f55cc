"""Build the seeded target, train its EAGLE-3 head, write both, the prompt families and build.json.

    python -m benchmarks.gpu.seeded.build --out DIR [--tiny] [--seed S]

DIR/target (config, harness tokenizer, safetensors), DIR/draft (Eagle3 head), DIR/family_a.jsonl,
DIR/family_b.jsonl (`specctl bench --dataset` format) and DIR/build.json (times of each step,
losses, the target's tie statistics, the offline acceptance per family and draft position).
The default shape is Llama-3.1-8B (needs a CUDA device, about 16 GB of safetensors); `--tiny`
is the CPU-test shape. Same seed, same torch build and device type: same weights.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from benchmarks.gpu.model_folders import LLAMA_8B, TargetShape
from benchmarks.gpu.seeded import checkpoint, datasets, train
from benchmarks.gpu.seeded.eagle3 import Eagle3Head
from benchmarks.gpu.seeded.llama import LlamaForward
from benchmarks.gpu.seeded.plan import FAMILIES, SEEDED_TINY, SeededPlan, make_plan
from benchmarks.gpu.seeded.weights import (
    SignalDesign,
    build_target,
    eagle_aux_layer_ids,
    layer_roles,
)


@dataclass(frozen=True)
class BuildSizes:
    sequences_per_family: int  # target rollouts the head learns from (1/8 held out)
    prompt_words: int
    new_tokens: int
    rollout_batch: int
    train: train.TrainConfig
    dataset_prompts: int  # prompts per family in the JSONL files
    dataset_words: int
    dataset_output_tokens: int

    @staticmethod
    def for_shape(shape: TargetShape) -> BuildSizes:
        if shape.hidden_size >= 4096:
            return BuildSizes(
                512, 24, 233, 512, train.TrainConfig(steps=400, batch=16, lr=1e-3),
                dataset_prompts=512, dataset_words=32, dataset_output_tokens=128,
            )  # fmt: skip
        return BuildSizes(
            48, 12, 52, 64, train.TrainConfig(steps=60, batch=16, lr=3e-3),
            dataset_prompts=64, dataset_words=16, dataset_output_tokens=64,
        )  # fmt: skip


class BuildError(RuntimeError):
    """Bad options or a folder in the way; the message says what to change."""


class Timer:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.t0 = time.perf_counter()

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        print(f"[{time.perf_counter() - self.t0:7.1f} s] {name} ...", flush=True)
        start = time.perf_counter()
        yield
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.seconds[name] = round(time.perf_counter() - start, 2)
        print(f"[{time.perf_counter() - self.t0:7.1f} s] {name}: {self.seconds[name]:.1f} s",
              flush=True)  # fmt: skip


def _fingerprint(weights: dict[str, torch.Tensor], shape: TargetShape) -> str:
    """A short hash of the constructed layers and the head of the vocabulary (not all 16 GB)."""
    digest = hashlib.sha256()
    hop1, hop2 = layer_roles(shape.num_hidden_layers)
    for name in (
        f"model.layers.{hop1}.self_attn.q_proj.weight",
        f"model.layers.{hop2}.self_attn.v_proj.weight",
        "model.layers.0.mlp.up_proj.weight",
        "lm_head.weight",
        "model.embed_tokens.weight",
    ):
        digest.update(weights[name][:512].float().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def _prepare_out(out: Path, force: bool) -> None:
    for sub in ("target", "draft"):
        if (out / sub).exists() and any((out / sub).iterdir()) and not force:
            raise BuildError(f"--out {out}: {out / sub} already exists; pass --force to "
                             "overwrite it or choose another --out")  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)


def build(
    out: Path,
    shape: TargetShape,
    seed: int,
    device: torch.device,
    sizes: BuildSizes,
    force: bool = False,
) -> dict[str, Any]:
    if device.type != "cuda" and shape.hidden_size >= 1024:
        raise BuildError(f"shape {shape.name} needs a CUDA device; use --tiny on a CPU")
    _prepare_out(out, force)
    timer = Timer()
    torch.manual_seed(seed)
    with timer.step("plan"):
        plan = make_plan(shape, seed)
    design = SignalDesign()
    with timer.step("target weights"):
        weights = build_target(plan, shape, seed, device, design)
    with timer.step("write target"):
        target_bytes = checkpoint.write_target(out / "target", weights, shape)
    # bf16 matmuls are slow on a CPU: compute there in fp32 (the checkpoint stays bf16)
    compute = weights if device.type == "cuda" else {k: v.float() for k, v in weights.items()}
    captured = [i + 1 for i in eagle_aux_layer_ids(shape.num_hidden_layers)]
    model = LlamaForward(compute, shape, captured)
    with timer.step("target rollouts"):
        data = train.make_rollouts(
            model, plan, sizes.sequences_per_family, sizes.prompt_words, sizes.new_tokens,
            sizes.rollout_batch, seed, device,
        )  # fmt: skip
    with timer.step("tie statistics"):
        ties = train.tie_stats(plan, data)
        ties["prefill_vs_decode_agreement"] = round(
            train.prefill_agreement(model, data, min(64, len(data.family))), 5
        )
    print(f"  target: {json.dumps(ties)}", flush=True)
    embed = compute["model.embed_tokens.weight"]
    if device.type != "cuda":
        data.aux = data.aux.float()
    rows_train, rows_eval = _split(data, seed)
    head = Eagle3Head(shape).to(device)
    hot = torch.as_tensor(plan.hot, device=device)
    with torch.no_grad():  # SGLang's usual start: the target's lm_head rows of the draft vocab
        head.lm_head.weight.copy_(weights["lm_head.weight"][hot].float())
    draft_index = torch.as_tensor(plan.draft_index(), device=device)
    with timer.step("train head"):
        losses = train.train_head(head, embed, data, rows_train, draft_index, sizes.train, seed)
    with timer.step("offline acceptance"):
        acceptance = train.offline_acceptance(
            head, embed, data, rows_eval, draft_index, sizes.train.draft_steps
        )
    for family, numbers in acceptance.items():
        print(f"  family {family}: per position {numbers['per_position']}, "
              f"accept length by depth {numbers['accept_length']}", flush=True)  # fmt: skip
    with timer.step("write draft"):
        draft_bytes = checkpoint.write_draft(out / "draft", head.sglang_state(), plan, shape)
    with timer.step("datasets"):
        for family in FAMILIES:
            rows = datasets.family_rows(
                plan, family, sizes.dataset_prompts, sizes.dataset_words,
                sizes.dataset_output_tokens, seed,
            )  # fmt: skip
            datasets.write_family(out / f"family_{family}.jsonl", rows)
    report = _report(plan, shape, seed, device, sizes, design, timer, weights, losses, ties,
                     acceptance, target_bytes, draft_bytes)  # fmt: skip
    (out / "build.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"[{time.perf_counter() - timer.t0:7.1f} s] done: {out}", flush=True)
    return report


def _split(data: train.Rollouts, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per family, 1/8 of the rollouts held out for the acceptance estimate."""
    gen = torch.Generator().manual_seed(seed)
    train_rows, eval_rows = [], []
    family = data.family.cpu()
    for f in range(len(FAMILIES)):
        rows = torch.nonzero(family == f).flatten()
        rows = rows[torch.randperm(len(rows), generator=gen)]
        held = max(1, len(rows) // 8)
        eval_rows.append(rows[:held])
        train_rows.append(rows[held:])
    return torch.cat(train_rows), torch.cat(eval_rows)


def _report(
    plan: SeededPlan,
    shape: TargetShape,
    seed: int,
    device: torch.device,
    sizes: BuildSizes,
    design: SignalDesign,
    timer: Timer,
    weights: dict[str, torch.Tensor],
    losses: list[float],
    ties: dict[str, float],
    acceptance: dict[str, dict[str, list[float]]],
    target_bytes: int,
    draft_bytes: int,
) -> dict[str, Any]:
    every = max(1, len(losses) // 20)
    return {
        "shape": asdict(shape),
        "seed": seed,
        "fingerprint": _fingerprint(weights, shape),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "python": platform.python_version(),
        "plan": plan.summary(),
        "design": design.to_json(),
        "sizes": {k: v for k, v in asdict(sizes).items() if k != "train"},
        "train": asdict(sizes.train),
        "seconds": timer.seconds,
        "seconds_total": round(sum(timer.seconds.values()), 1),
        "bytes": {"target": target_bytes, "draft": draft_bytes},
        "peak_gpu_bytes": torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0,
        "loss": {
            "first": round(losses[0], 4),
            "last": round(losses[-1], 4),
            "every": every,
            "curve": [round(x, 4) for x in losses[::every]],
        },
        "target": ties,
        "offline_acceptance": acceptance,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder to write into")
    parser.add_argument("--tiny", action="store_true", help="the small CPU-test shape")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default=None, help="cuda or cpu (default: cuda if present)")
    parser.add_argument("--train-steps", type=int, default=None, help="override the default")
    parser.add_argument("--lr", type=float, default=None, help="override the default")
    parser.add_argument("--sequences", type=int, default=None,
                        help="target rollouts per family (default by shape)")  # fmt: skip
    parser.add_argument("--force", action="store_true", help="overwrite DIR/target, DIR/draft")
    args = parser.parse_args(argv)
    shape = SEEDED_TINY if args.tiny else LLAMA_8B
    sizes = BuildSizes.for_shape(shape)
    cfg = sizes.train
    if args.train_steps is not None or args.lr is not None:
        cfg = train.TrainConfig(
            steps=args.train_steps or cfg.steps, batch=cfg.batch, lr=args.lr or cfg.lr,
            draft_steps=cfg.draft_steps, warmup=cfg.warmup, step_weight=cfg.step_weight,
        )  # fmt: skip
    seqs = args.sequences or sizes.sequences_per_family
    if seqs < 2 or cfg.steps < 1:
        print("error: --sequences must be >= 2 and --train-steps >= 1", file=sys.stderr)
        return 2
    sizes = BuildSizes(**{**asdict(sizes), "train": cfg, "sequences_per_family": seqs})
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    try:
        build(args.out, shape, args.seed, device, sizes, force=args.force)
    except BuildError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
