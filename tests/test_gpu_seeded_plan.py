"""The seeded target's discrete structure (benchmarks/gpu/seeded/plan.py) and the prompt family
files: numpy and the harness tokenizer only (the torch parts run in tests/sglang)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks.gpu.model_folders import LLAMA_8B
from benchmarks.gpu.seeded.datasets import family_rows, write_family
from benchmarks.gpu.seeded.plan import FAMILIES, SEEDED_TINY, PlanSpec, make_plan
from benchmarks.gpu.tokenizer import SPECIAL_TOKENS, encode_words, vocabulary
from controller.bench.prompts import load_dataset


@pytest.mark.parametrize("shape", [SEEDED_TINY, LLAMA_8B], ids=lambda s: s.name)
def test_regions_cycles_and_ties(shape):
    plan = make_plan(shape, seed=7)
    spec = plan.spec
    a, b = plan.region("a"), plan.region("b")
    assert len(a) == len(b) == spec.region_size and not set(a) & set(b)
    assert sorted(plan.active) == sorted([*a, *b])
    assert len(plan.active) + spec.copy_dims + 1 <= shape.hidden_size  # fits the basis
    for name, region, share in (("a", a, spec.tied_a), ("b", b, spec.tied_b)):
        assert abs(plan.tied[region].mean() - share) < 0.01, name
        inside = set(region.tolist())
        assert set(plan.succ_next[region].tolist()) == inside  # one cycle through the region
        jumps = plan.succ_jump[region][plan.tied[region]]
        assert set(jumps.tolist()) <= inside
        tied = region[plan.tied[region]]
        # the two successors of a tied token carry opposite signs: the signal picks one
        assert (plan.sigma[plan.succ_next[tied]] == -plan.sigma[plan.succ_jump[tied]]).all()
    inactive = plan.family < 0
    assert (plan.succ_next[inactive] == -1).all() and (plan.sigma[inactive] == 0).all()
    specials = [vocabulary().index(t) for t in SPECIAL_TOKENS]
    assert not np.isin(specials, plan.active).any()  # never emits bos/eos/unk


def test_successor_follows_the_signal():
    plan = make_plan(SEEDED_TINY, seed=1)
    tied = plan.region("b")[0]
    nxt, jump = plan.succ_next[tied], plan.succ_jump[tied]
    plus = nxt if plan.sigma[nxt] > 0 else jump
    assert plan.successor(int(tied), True) == plus
    assert {plan.successor(int(tied), s) for s in (True, False)} == {nxt, jump}
    clear = next(t for t in plan.region("a") if not plan.tied[t])
    assert plan.successor(int(clear), True) == plan.successor(int(clear), False) == \
        plan.succ_next[clear]


def test_draft_vocabulary_and_d2t():
    plan = make_plan(LLAMA_8B, seed=0)
    assert len(plan.hot) == LLAMA_8B.draft_vocab_size
    assert np.isin(plan.active, plan.hot).all()
    target = np.arange(len(plan.hot)) + plan.d2t()  # SGLang: hot_token_id = d2t + arange
    assert (target == plan.hot).all()
    assert plan.d2t().max() > 0  # region ids above the draft vocabulary size are mapped
    assert plan.t2d().sum() == len(plan.hot)
    index = plan.draft_index()
    assert (index[plan.hot] == np.arange(len(plan.hot))).all()


def test_same_seed_same_plan_other_seed_other_plan():
    one, two, other = (make_plan(SEEDED_TINY, s) for s in (4, 4, 5))
    assert (one.succ_next == two.succ_next).all() and (one.bit == two.bit).all()
    assert one.words == two.words
    assert not (one.succ_next == other.succ_next).all()


def test_a_plan_that_does_not_fit_is_refused():
    with pytest.raises(ValueError, match="exceed hidden_size"):
        make_plan(SEEDED_TINY, 0, PlanSpec(region_size=200, words_per_family=10))
    with pytest.raises(ValueError, match="words per family"):
        make_plan(SEEDED_TINY, 0, PlanSpec(region_size=60, words_per_family=300))


def test_family_files_load_as_bench_datasets_and_stay_in_their_region(tmp_path):
    plan = make_plan(LLAMA_8B, seed=0)
    for index, family in enumerate(FAMILIES):
        rows = family_rows(plan, family, count=20, words=32, output_tokens=128, seed=0)
        path = tmp_path / f"family_{family}.jsonl"
        write_family(path, rows)
        prompts = load_dataset(path, default_output_tokens=1)
        assert [p.output_tokens for p in prompts] == [128] * 20
        for prompt in prompts:
            ids = encode_words(prompt.text)
            assert len(ids) == 32 and (plan.family[ids] == index).all()
        assert json.loads(path.read_text().splitlines()[0]).keys() == {"prompt", "output_tokens"}
