"""The GPU harness's model folders read by SGLang's own loaders (the real 0.5.23 classes on
CPU): the tokenizer through `get_tokenizer`, the configs through `ModelConfig`, as a server
started on them reads them before it loads (dummy) weights."""

from __future__ import annotations

import pytest

from benchmarks.gpu.model_folders import LLAMA_8B, TINY, build_dummy_folders
from benchmarks.gpu.tokenizer import bench_words, encode_words, word_id


@pytest.mark.parametrize("shape", [TINY, LLAMA_8B], ids=lambda s: s.name)
def test_sglang_reads_the_harness_folders(tmp_path, shape):
    from sglang.srt.configs.model_config import ModelConfig
    from sglang.srt.utils.hf_transformers_utils import get_tokenizer

    folders = build_dummy_folders(tmp_path, shape)
    tok = get_tokenizer(folders.target)
    words = list(bench_words()[:40])
    ids = tok.encode(" ".join(words))
    assert ids == encode_words(words)  # no BOS added, one token per word
    assert tok.decode(ids) == " ".join(words)
    assert tok.decode([word_id("the"), 120_000]) == "the"  # out-of-vocabulary ids: nothing
    assert (tok.bos_token_id, tok.eos_token_id) == (1, 2)

    target = ModelConfig(folders.target, context_length=4096)
    assert target.hf_config.architectures == ["LlamaForCausalLM"]
    assert (target.num_hidden_layers, target.vocab_size, target.context_len) == \
        (shape.num_hidden_layers, shape.vocab_size, 4096)
    assert target.hf_config.eos_token_id == tok.eos_token_id
    draft = ModelConfig(folders.draft, context_length=4096, is_draft_model=True)
    assert draft.hf_config.architectures == ["LlamaForCausalLMEagle3"]
    assert draft.num_hidden_layers == 1
    assert draft.hf_config.draft_vocab_size == shape.draft_vocab_size
