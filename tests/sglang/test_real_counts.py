"""Per-depth token counts are what SGLang emits: real `_resolve_spec_v2_tokens` and real Reqs.

Real: `SchedulerBatchResultProcessor._resolve_spec_v2_tokens` (SGLang 0.5.23's code, called
through the class and patched by the plugin's loader; the plugin counts in its AFTER hook),
`Req` (finished and retracted the way SGLang marks them), `GenerationBatchResult`.
Stand-ins: the processor's `self` (`_processor()`: the three collaborators the method calls:
metrics reporter, model worker, grammar advance; the processor is a frozen dataclass built
from a whole scheduler), and the batch (`reqs` plus `has_grammar`). The grammar-truncated run
is given on the result the way SGLang's grammar barrier leaves it (`grammar_advanced`,
`grammar_retained_tokens`), since a real grammar needs a tokenizer and xgrammar's backend.
"""

from __future__ import annotations

from types import SimpleNamespace as NS
from typing import Any

from sglang_hooks.runtime import SchedulerRuntime


def _req(rid: str) -> Any:
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    req = Req(rid, "hi", [1, 2, 3], SamplingParams(max_new_tokens=64))
    if getattr(req, "kv", None) is None:  # 0.5.23 keeps KV lengths on req.kv once allocated
        req.kv = NS(kv_committed_len=3, kv_allocated_len=8)
    return req


def _processor() -> Any:
    from sglang.srt.managers.scheduler_components.batch_result_processor import (
        SchedulerBatchResultProcessor,
    )

    fake = NS(metrics_reporter=NS(snapshot_spec_decode_metrics=lambda batch, result: None),
              model_worker=NS(on_verify_complete_cpu=lambda *a, **k: None))
    fake.advance_grammar_fsm = lambda result, batch: \
        SchedulerBatchResultProcessor.advance_grammar_fsm(fake, result, batch)
    return fake


def test_counts_skip_rows_sglang_does_not_emit_and_follow_grammar_truncation(
    runtime: SchedulerRuntime,
) -> None:
    import torch
    from sglang.srt.managers.schedule_batch import FINISH_LENGTH
    from sglang.srt.managers.scheduler_components.batch_result_processor import (
        SchedulerBatchResultProcessor,
    )
    from sglang.srt.managers.utils import GenerationBatchResult

    runtime.activate({0, 1, 2}, None)
    live, finished, retracted, constrained = (_req(r) for r in ("a", "b", "c", "d"))
    finished.finished_reason = FINISH_LENGTH(length=64)  # finished, launched once more (overlap)
    retracted.is_retracted = True
    constrained.grammar = NS()  # its grammar ended after the first accepted token
    depth = 2
    result = GenerationBatchResult(
        next_token_ids=torch.arange(100, 112), accept_lens=torch.tensor([3, 3, 2, 3]),
        speculative_num_draft_tokens=depth + 1, grammar_advanced=True,
        grammar_retained_tokens=[None, None, None, [109]],
    )
    result.specctl_launch = (False, None)
    batch = NS(reqs=[live, finished, retracted, constrained], has_grammar=True)
    runs = SchedulerBatchResultProcessor._resolve_spec_v2_tokens(_processor(), result, batch)
    assert runs[0] == [100, 101, 102] and runs[3] == [109]
    # What SGLang appends to output_ids: rows a (3 tokens) and d (1 token, grammar-cut).
    [(key, cell)] = runtime.counters.pending.items()
    assert key == (depth, 2)
    assert cell[:3] == [1, 2, 4]  # iterations, request steps, tokens
    assert runtime.unemitted_rows == 2
    # SGLang's own sum counts every row and every draft the target accepted.
    assert result.num_correct_drafts + len(batch.reqs) == 11


def test_a_result_whose_rows_all_finished_is_not_counted(runtime: SchedulerRuntime) -> None:
    import torch
    from sglang.srt.managers.schedule_batch import FINISH_LENGTH
    from sglang.srt.managers.scheduler_components.batch_result_processor import (
        SchedulerBatchResultProcessor,
    )
    from sglang.srt.managers.utils import GenerationBatchResult

    runtime.activate({1}, None)
    req = _req("z")
    req.finished_reason = FINISH_LENGTH(length=64)
    result = GenerationBatchResult(next_token_ids=torch.tensor([5, 6]),
                                   accept_lens=torch.tensor([2]), speculative_num_draft_tokens=2)
    result.specctl_launch = (False, None)
    SchedulerBatchResultProcessor._resolve_spec_v2_tokens(
        _processor(), result, NS(reqs=[req], has_grammar=False))
    assert runtime.counters.pending == {} and runtime.empty_results == 1
    assert runtime.report()["unemitted_rows"] == 1
