"""`benchmarks.gpu.seeded.build` at the tiny shape on CPU, end to end: the seeded target decodes
as constructed, the head's loss falls and its offline acceptance is high on family a and about
one half on family b, and SGLang's own config and tokenizer loaders read what was written
(the real 0.5.23 classes; the forward passes are compared in test_real_seeded_sglang.py)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from benchmarks.gpu.seeded import build as build_mod
from benchmarks.gpu.seeded import train
from benchmarks.gpu.seeded.llama import LlamaForward
from benchmarks.gpu.seeded.plan import SEEDED_TINY, make_plan
from benchmarks.gpu.seeded.weights import build_target, eagle_aux_layer_ids
from controller.bench.prompts import load_dataset

SIZES = build_mod.BuildSizes(
    sequences_per_family=24, prompt_words=12, new_tokens=41, rollout_batch=48,
    train=train.TrainConfig(steps=60, batch=16, lr=3e-3),
    dataset_prompts=16, dataset_words=12, dataset_output_tokens=32,
)  # fmt: skip


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    torch.set_num_threads(1)  # a shared 2-core box: more threads only contend
    out = tmp_path_factory.mktemp("build")
    report = build_mod.build(out, SEEDED_TINY, 0, torch.device("cpu"), SIZES)
    return SimpleNamespace(out=out, report=report)


def test_build_writes_both_folders_the_datasets_and_the_report(built: SimpleNamespace) -> None:
    out: Path = built.out
    report = json.loads((out / "build.json").read_text())
    assert report == json.loads(json.dumps(built.report))
    index = json.loads((out / "target" / "model.safetensors.index.json").read_text())
    assert len(index["weight_map"]) == 9 * SEEDED_TINY.num_hidden_layers + 3
    assert (out / "draft" / "model.safetensors").is_file()
    for step in ("plan", "target weights", "write target", "target rollouts", "train head",
                 "offline acceptance", "write draft", "datasets"):
        assert report["seconds"][step] >= 0.0, step
    assert report["target"]["follows_plan"] == 1.0
    assert report["target"]["prefill_vs_decode_agreement"] > 0.99


def test_the_heads_loss_falls(built: SimpleNamespace) -> None:
    loss = built.report["loss"]
    assert loss["last"] < loss["first"] / 4, loss


def test_offline_acceptance_separates_the_families(built: SimpleNamespace) -> None:
    acc = built.report["offline_acceptance"]
    a, b = acc["a"]["per_position"], acc["b"]["per_position"]
    assert a[0] > 0.7 and 0.35 < b[0] < 0.65, acc
    assert a[0] - b[0] > 0.2, acc
    assert acc["a"]["accept_length"][2] > 2.0, acc  # depth 3 on the easy family


def test_sglang_reads_the_folders_and_the_prompts_stay_in_their_region(
    built: SimpleNamespace,
) -> None:
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.utils.hf_transformers_utils import get_tokenizer

    target = ModelConfig(str(built.out / "target"), context_length=4096)
    assert target.hf_config.architectures == ["LlamaForCausalLM"]
    draft = ModelConfig(str(built.out / "draft"), context_length=4096, is_draft_model=True)
    assert draft.hf_config.architectures == ["LlamaForCausalLMEagle3"]
    assert draft.hf_config.draft_vocab_size == SEEDED_TINY.draft_vocab_size
    tok = get_tokenizer(str(built.out / "target"))
    plan = make_plan(SEEDED_TINY, 0)
    for index, family in enumerate(("a", "b")):
        prompts = load_dataset(built.out / f"family_{family}.jsonl", default_output_tokens=1)
        assert len(prompts) == SIZES.dataset_prompts
        for prompt in prompts:
            ids = tok.encode(prompt.text)
            assert len(ids) == SIZES.dataset_words
            assert all(plan.family[i] == index for i in ids), prompt.text


def test_greedy_decoding_follows_the_plan_and_ties_split_evenly() -> None:
    torch.set_num_threads(1)
    plan = make_plan(SEEDED_TINY, 5)
    weights = {k: v.float() for k, v in build_target(plan, SEEDED_TINY, 5,
                                                     torch.device("cpu")).items()}
    aux_layers = [i + 1 for i in eagle_aux_layer_ids(SEEDED_TINY.num_hidden_layers)]
    model = LlamaForward(weights, SEEDED_TINY, aux_layers)
    data = train.make_rollouts(model, plan, 24, 12, 60, 48, 5, torch.device("cpu"))
    stats = train.tie_stats(plan, data)
    assert stats["follows_plan"] == 1.0
    assert 0.4 < stats["tied_to_next"] < 0.6, stats  # the context signal decides half and half
    assert stats["clear_margin_min"] > 5.0, stats
    assert stats["tied_margin_below_0.5"] < 0.05, stats
    prev = data.tokens[:, 11:-1].numpy()
    clear = ~plan.tied[prev]
    assert (plan.succ_next[prev][clear] == data.tokens[:, 12:].numpy()[clear]).all()
    # every captured stream is the token's own embedding: the head sees the token, no more
    embed = weights["model.embed_tokens.weight"][data.tokens[:, :-1]]
    width = SEEDED_TINY.hidden_size
    for k in range(3):
        assert torch.equal(data.aux[..., k * width : (k + 1) * width], embed)
    # the family's cycle: a walk stays in its region
    fam = plan.family[data.tokens.numpy()]
    assert (fam == data.family.numpy()[:, None]).all()
    assert np.isin(data.tokens.numpy(), plan.active).all()
