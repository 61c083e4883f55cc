"""The draft's prefill at admission, skipped while off.

With speculation on, every prefill batch runs the target's forward and then the draft model's
extend over the same prompt tokens (`EagleDraftWorker._draft_extend_for_prefill`), so that
the draft has KV for the prompt and a hidden state to start drafting from. The skipped draft
extend (`OffPathFeature.SKIP_EXTEND`) skips the draft's work after each depth-0 verify but not
this one: on fresh prompts it was what depth 0 still paid at admission (docs/sglang.md, "Off":
the device timer's prefill ms per request, depth 0 against a plain server).

Where the adapter declares the skip (`OffPathFeature.SKIP_DRAFT_PREFILL`), a prefill batch
admitted while the table's live tier is a depth-0 tier that skips its extend gets the draft
input the skipped extend's stub gives a depth-0 iteration: the target's bonus tokens, zeroed
top-k and hidden state (SGLang's `_stub_skipped_draft_extend`; with the host-work trims, the
same zeros reused per batch size). No draft forward runs. The target still prefills and
samples, so outputs do not change. A request admitted so has
no draft KV for its prompt: if it is still running when its tier drafts again, the draft
starts cold (its first drafts almost surely rejected) and attends to whatever its prompt's
KV slots held; the target verifies every drafted token, so what that costs is acceptance.

Which tier a prefill batch lands in is read without moving the table's hysteresis state:
the tier the last decode launch was in, looked up at that launch's batch size plus the
requests being admitted.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from sglang_hooks import lean_host


def skippable_batch(draft_worker: Any, batch: Any, extra: tuple[Any, ...],
                    extra_kw: dict[str, Any]) -> bool:
    """Whether this prefill batch may skip the draft's extend at all, whatever the table:
    not an idle batch (data-parallel attention), no multimodal embeddings (the parameter after
    the bonus tokens), and not a draft whose first drafts are seeded from the extend (DSA
    top-k). 0.5.23's KV location plan only says where the extend would write."""
    if batch.forward_mode.is_idle():
        return False
    embeds = extra[0] if extra else extra_kw.get("mm_input_embeds")
    if embeds is not None:
        return False
    return not getattr(draft_worker, "seed_dsa_topk_from_draft_extend", False)


def stub_draft_input(spec_worker: Any, batch: Any, next_token_ids: Any, *,
                     reuse_stubs: bool = False) -> Any:
    """The next draft input of a prefill whose draft extend was skipped: the bonus tokens
    and the zeros SGLang's own stub for a skipped extend writes (one row per request).
    `reuse_stubs` (the host-work trims): those zeros built once per batch size and shared
    with the depth-0 decodes' stubs, which nothing writes into."""
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    draft_input = EagleDraftInput(bonus_tokens=next_token_ids, num_tokens_per_req=1,
                                  num_tokens_for_logprob_per_req=1)
    holder = SimpleNamespace(next_draft_input=draft_input)
    if reuse_stubs:
        lean_host.stub_skipped_extend(spec_worker, batch, holder)
    else:
        spec_worker._stub_skipped_draft_extend(batch, holder)
    return draft_input
