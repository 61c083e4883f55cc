"""The seeded target and its EAGLE-3 head through SGLang's own model classes (the real 0.5.23
classes on CPU): `LlamaForCausalLMEagle3.load_weights` and `LlamaForCausalLM.load_weights` read
the checkpoints the build writes, and SGLang's forward passes give what the build's PyTorch
code computes (the head's three draft steps, the target's captured hidden states and greedy
tokens). 0.5.17's Eagle3 loader is checked to be the same code as 0.5.23's.

Stand-ins, because these parts cannot run on a CPU: RadixAttention's kernel (an attention
backend needs a GPU model runner) is replaced by plain causal attention over a per-layer list
of keys and values, i.e. one request's KV cache; and the rotary embedding is told it runs on
a CPU (the flag SGLang sets from its CPU-engine environment, which needs the CPU build of
sgl_kernel). Everything else (parameter stacking, norms, fc, residuals, rotary embedding,
d2t) is SGLang's. This module publishes server args and sets up a one-process gloo group for
the rest of the session, so it runs after the other test_real_* files (alphabetical order).
"""

from __future__ import annotations

import ast
import json
import socket
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from benchmarks.gpu.seeded import checkpoint
from benchmarks.gpu.seeded.eagle3 import Eagle3Head
from benchmarks.gpu.seeded.llama import LlamaForward
from benchmarks.gpu.seeded.plan import SEEDED_TINY, make_plan
from benchmarks.gpu.seeded.weights import build_target, eagle_aux_layer_ids

SHAPE = SEEDED_TINY


class CausalAttention(torch.nn.Module):
    """Stand-in for RadixAttention's kernel: one request, its keys and values kept per call."""

    def __init__(self, heads: int, kv_heads: int, head_dim: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *_: Any,
                **__: Any) -> torch.Tensor:
        q = q.view(-1, self.heads, self.head_dim).transpose(0, 1)
        k = k.view(-1, self.kv_heads, self.head_dim).transpose(0, 1)
        v = v.view(-1, self.kv_heads, self.head_dim).transpose(0, 1)
        start = 0 if self.k is None else self.k.shape[1]
        self.k = k if self.k is None else torch.cat([self.k, k], 1)
        self.v = v if self.v is None else torch.cat([self.v, v], 1)
        mask = torch.ones(q.shape[1], self.k.shape[1], dtype=torch.bool).tril(start)
        out = F.scaled_dot_product_attention(q[None], self.k[None], self.v[None],
                                             attn_mask=mask, enable_gqa=True)[0]
        return out.transpose(0, 1).reshape(q.shape[1], -1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> SimpleNamespace:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    plan = make_plan(SHAPE, seed=3)
    weights = build_target(plan, SHAPE, 3, torch.device("cpu"))
    root = tmp_path_factory.mktemp("seeded")
    checkpoint.write_target(root / "target", weights, SHAPE)
    head = Eagle3Head(SHAPE, init_std=0.05)
    with torch.no_grad():  # what the checkpoint holds: bf16
        for p in head.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    checkpoint.write_draft(root / "draft", head.sglang_state(), plan, SHAPE)
    return SimpleNamespace(plan=plan, weights=weights, head=head, root=root)


@pytest.fixture(scope="module")
def sglang_cpu(built: SimpleNamespace) -> None:
    from sglang.srt import runtime_context
    from sglang.srt.distributed import init_distributed_environment, initialize_model_parallel
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(model_path=str(built.root / "target"), device="cpu",
                      skip_tokenizer_init=True, speculative_algorithm="EAGLE3",
                      speculative_draft_model_path=str(built.root / "draft"))  # fmt: skip
    args.resolve_once()
    runtime_context.publish(args, role="scheduler",
                            ranks=runtime_context.SpawnRanks(world_rank=0))  # fmt: skip
    if not torch.distributed.is_initialized():
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"tcp://127.0.0.1:{_free_port()}")
        initialize_model_parallel()
    import sglang.srt.layers.rotary_embedding.base as rope_base

    rope_base._is_cpu = True  # stand-in, see the module docstring


class _ExtendMode:
    """An extend (prefill) forward mode: every other `is_*` question answers no."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("is_"):
            return lambda: name == "is_extend"
        raise AttributeError(name)


def _forward_batch(hidden: torch.Tensor | None) -> SimpleNamespace:
    """The few ForwardBatch fields the model code reads outside attention."""
    return SimpleNamespace(spec_info=SimpleNamespace(hidden_states=hidden),
                           mm_input_embeds=None, forward_mode=_ExtendMode(),
                           contains_mm_inputs=lambda: False)  # fmt: skip


def _standin_attention(model: Any) -> None:
    for layer in model.model.layers:
        layer.self_attn.attn = CausalAttention(SHAPE.num_attention_heads,
                                               SHAPE.num_key_value_heads, SHAPE.head_dim)


def _sglang_draft(built: SimpleNamespace) -> Any:
    from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3
    from transformers import LlamaConfig

    config = LlamaConfig(**json.loads((built.root / "draft" / "config.json").read_text()))
    model = LlamaForCausalLMEagle3(config)
    model.load_weights(iter(load_file(str(built.root / "draft" / "model.safetensors")).items()))
    return model


def test_sglang_loads_every_head_tensor_and_d2t(built: SimpleNamespace, sglang_cpu: None) -> None:
    model = _sglang_draft(built)
    params = dict(model.named_parameters())
    assert set(params) == {
        "model.embed_tokens.weight", "model.fc.weight", "model.norm.weight", "lm_head.weight",
        "model.layers.0.self_attn.qkv_proj.weight", "model.layers.0.self_attn.o_proj.weight",
        "model.layers.0.mlp.gate_up_proj.weight", "model.layers.0.mlp.down_proj.weight",
        "model.layers.0.input_layernorm.weight", "model.layers.0.hidden_norm.weight",
        "model.layers.0.post_attention_layernorm.weight",
    }  # fmt: skip
    ours = {k: v.float() for k, v in built.head.sglang_state().items()}
    p = "model.layers.0."
    expect = dict(ours)
    expect[p + "self_attn.qkv_proj.weight"] = torch.cat(
        [expect.pop(p + f"self_attn.{x}_proj.weight") for x in "qkv"])
    expect[p + "mlp.gate_up_proj.weight"] = torch.cat(
        [expect.pop(p + f"mlp.{x}_proj.weight") for x in ("gate", "up")])
    for name, value in expect.items():  # every parameter but embed_tokens (the target's)
        assert torch.equal(params[name].float(), value), name
    assert torch.equal(model.hot_token_id, torch.as_tensor(built.plan.hot))
    assert model.hot_token_id[-1] > SHAPE.draft_vocab_size  # d2t really maps ids
    assert model.config.draft_vocab_size == SHAPE.draft_vocab_size


def test_sglang_eagle3_forward_matches_the_training_code(built: SimpleNamespace,
                                                         sglang_cpu: None) -> None:
    """One request: a draft extend over positions 0..T-1, then two draft decode steps, each fed
    the previous step's pre-norm output, as SGLang's EAGLE worker does; against `unroll`."""
    model = _sglang_draft(built)
    model.set_embed(torch.nn.Parameter(built.weights["model.embed_tokens.weight"].float()))
    model = model.float()
    _standin_attention(model)
    gen = torch.Generator().manual_seed(1)
    length = 12
    pick = torch.randint(len(built.plan.active), (length + 3,), generator=gen)
    tokens = torch.as_tensor(built.plan.active[pick])
    aux = torch.randn(1, length, 3 * SHAPE.hidden_size, generator=gen)
    head = model.lm_head.weight.float()
    with torch.no_grad():
        normed, (out,) = model.model(tokens[1 : length + 1], torch.arange(length),
                                     _forward_batch(aux[0]))  # fmt: skip
        theirs = [normed @ head.T]
        hidden = out[-1:]
        for step in (1, 2):
            normed, (hidden,) = model.model(tokens[length + step : length + step + 1],
                                            torch.tensor([length + step - 1]),
                                            _forward_batch(hidden))  # fmt: skip
            theirs.append(normed @ head.T)
        embed = built.weights["model.embed_tokens.weight"].float()
        embeds = [embed[tokens[1 + j : length + 1 + j]][None] for j in range(3)]
        ours = built.head.unroll(embeds, aux, torch.arange(length))
    assert torch.allclose(theirs[0], ours[0][0], atol=2e-4), "draft extend, every position"
    for step in (1, 2):
        assert torch.allclose(theirs[step][-1], ours[step][0, -1], atol=2e-4), f"step {step + 1}"


def test_sglang_llama_reads_the_target_and_computes_the_same_tokens(built: SimpleNamespace,
                                                                    sglang_cpu: None) -> None:
    from sglang.srt.models.llama import LlamaForCausalLM
    from transformers import LlamaConfig

    config = LlamaConfig(**json.loads((built.root / "target" / "config.json").read_text()))
    model = LlamaForCausalLM(config)
    index = json.loads((built.root / "target" / "model.safetensors.index.json").read_text())
    for file in sorted(set(index["weight_map"].values())):
        model.load_weights(iter(load_file(str(built.root / "target" / file)).items()))
    layer_ids = json.loads((built.root / "draft" / "config.json").read_text())[
        "eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert layer_ids == eagle_aux_layer_ids(SHAPE.num_hidden_layers)
    model.set_eagle3_layers_to_capture(layer_ids)
    model = model.float()
    _standin_attention(model)
    plan = built.plan
    words = plan.region("a")
    tokens = torch.as_tensor(words[torch.randint(len(words), (20,),
                                                 generator=torch.Generator().manual_seed(2))])
    ours = LlamaForward({k: v.float() for k, v in built.weights.items()}, SHAPE,
                        [i + 1 for i in layer_ids])  # fmt: skip
    with torch.no_grad():
        hidden, aux = model.model(tokens, torch.arange(len(tokens)), _forward_batch(None))
        greedy_theirs = (hidden @ model.lm_head.weight.float().T).argmax(-1)
        normed, our_aux = ours.forward(tokens[None])
        greedy_ours, _ = ours.greedy(normed)
    assert torch.allclose(hidden, normed[0], atol=1e-4)
    for theirs_a, ours_a in zip(aux, our_aux, strict=True):
        assert torch.allclose(theirs_a, ours_a[0], atol=1e-5)
    assert torch.equal(greedy_theirs, greedy_ours[0])
    # and the tokens are the plan's: each a successor of the one before
    prev, nxt = tokens.numpy(), greedy_theirs.numpy()
    assert ((plan.succ_next[prev] == nxt) | (plan.succ_jump[prev] == nxt)).all()


def _load_weights_source(root: Path) -> str:
    tree = ast.parse((root / "srt" / "models" / "llama_eagle3.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "LlamaForCausalLMEagle3":
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and item.name == "load_weights":
                    return ast.dump(item)
    raise AssertionError(f"{root}: LlamaForCausalLMEagle3.load_weights not found")


def test_the_eagle3_loader_is_the_same_in_0_5_17(sglang17_root: Path) -> None:
    import sglang

    installed = Path(sglang.__file__).parent
    assert _load_weights_source(sglang17_root) == _load_weights_source(installed)
