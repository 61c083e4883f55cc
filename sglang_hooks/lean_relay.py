"""A depth-0 iteration's lighter hand-over to the next one (`specctl_lean_relay`).

When a table's depth-0 tier skips the draft extend (the `skip-extend` off modes), SGLang's
spec-v2 overlap scheduler still hands the iteration over as if a draft had run. Three pieces
of that hand-over sit on the path from one forward to the next, where a plain decode has none
(docs/sglang.md, "Off"):

- **The WAR barrier.** After each launch the scheduler fences its next writes to buffers the
  forward reads (the next batch's KV slots, written into `req_to_token` on the schedule
  stream) behind the event the last shared-buffer reader published. For EAGLE that reader is
  the draft extend, and only a captured draft-extend graph publishes the event, just before
  its replay: after the verify's outputs (accept lengths, new sequence lengths, bonus tokens)
  are written. Skipped (or run eagerly, as on FA3), the barrier falls back to waiting for the
  whole forward, the relay of draft state below included. With the trims the plugin records
  that same event where the skipped extend would have started and hands it to the barrier.
  (An event any earlier, before the verify graph's replay, is not enough: the next batch's
  preparation then races this verify's outputs, and on the H200 requests stopped finishing.)
- **The relay of draft state.** Every iteration the overlap scheduler stashes the draft's
  top-k and hidden state into per-request buffers for the next one (a cast and an indexed
  write each, the hidden state batch x hidden wide). At depth 0 those are the skipped
  extend's zeroed stub, which the next depth-0 iteration ignores, and so are those of an
  admission whose draft prefill was skipped (draft_prefill.py). With the trims SGLang
  0.5.17 stashes the bonus tokens alone (0.5.23 already leaves out empty fields). A request
  that goes back to drafting then starts from the draft state its slot held last instead of
  zeros; the target verifies every drafted token either way, so outputs do not change. The
  buffers are zeroed once, before the first such stash: a slot never stashed in full would
  otherwise hold uninitialised memory.

- **The gather of draft state.** At the start of every iteration the overlap scheduler gathers
  each request's top-k and hidden state back out of those buffers (`_resolve_spec_extras`),
  before the launch knows its depth; a depth-0 launch reads the bonus tokens alone. With the
  trims SGLang 0.5.17 gathers the bonus tokens then, and the rest only once the launch's depth
  choice says it drafts (inside the launch, on the same stream, before any draft work): SGLang's
  own gather, run later.

Chosen at start-up with `SPECCTL_LEAN_RELAY=1` and at run time with the admin key
`specctl_lean_relay` (0 or 1) in `POST /set_internal_state`. Off where the variable is absent.

- **The fence at the replay** (its own switch, under the trims above). A depth-0 batch on
  the target's DECODE graphs (plain_decode.py) reads its shared buffers where a server
  without speculation's decode reads them: the graph runner builds the page table out of
  `req_to_token` before it replays, and publishes its read-done event there (on the target's
  model runner, which the barrier of an EAGLE server does not read). With
  `SPECCTL_FENCE_AT_REPLAY=1`, or the admin key `specctl_fence_at_replay` 1, the hand-over
  gives the barrier that event instead of one at the decode's outputs, so the next
  iteration's preparation on the schedule stream runs beside this decode, as on a server
  without speculation, instead of after it. What runs after the replay reads nothing the
  schedule stream writes next: the sampler reads the graph's logits, and the next lengths
  (made before the replay) and bonus tokens reach the next iteration through the FutureMap,
  whose own publish event orders them. (The verify's graph, a breakable one, reads
  `req_to_token` during its replay: SGLang publishes its event after the replay, and so an
  event before a verify's replay is never handed over.) Off where the variable is absent.
"""

from __future__ import annotations

from typing import Any

from sglang_hooks import contract
from sglang_hooks.env_switch import read_switch

ENV = "SPECCTL_LEAN_RELAY"
KEY = contract.LEAN_RELAY_KEY
FENCE_ENV = "SPECCTL_FENCE_AT_REPLAY"
# On a plain decode's result: the read-done event its DECODE graph published before replaying.
REPLAY_EVENT = "specctl_replay_read_done"
# The read-done attribute the scheduler's WAR barrier reads: 0.5.23's name, then 0.5.17's.
EVENT_ATTRS = ("shared_read_done_event", "war_fastpath_read_done_event")
# Releases whose FutureMap.stash writes every draft field whatever the payload holds (read in
# their source); later ones skip empty fields themselves.
STASH_RELEASES = frozenset({"0.5.17"})


def from_env() -> tuple[bool, str | None]:
    """(on, error): the start-up setting, and why the variable was ignored if it was."""
    return read_switch(ENV, "the depth-0 relay trims")


def fence_from_env() -> tuple[bool, str | None]:
    """(on, error): the start-up setting of the fence at the replay."""
    return read_switch(FENCE_ENV, "the depth-0 fence at the DECODE graph's replay")


def event_attr(runner: Any) -> str | None:
    """The read-done attribute of this release's model runners, or None."""
    return next((a for a in EVENT_ATTRS if hasattr(runner, a)), None)


def barrier_runner(worker: Any) -> Any:
    """The model runner whose read-done event SGLang's WAR barrier reads for this worker."""
    runner = getattr(worker, "last_shared_read_runner", None)
    return runner if runner is not None else worker.war_fastpath_runner


def new_event(device: Any) -> Any:
    """An event on `device`'s current stream (a CUDA device on a server)."""
    import torch

    event = torch.get_device_module(device).Event()
    event.record()
    return event


def hand_over(worker: Any, replay_event: Any = None) -> bool:
    """Give the WAR barrier an event marking where the skipped extend would have started
    (the verify's outputs are written by then), or `replay_event`, a plain decode's read-done
    event from before its replay. False where the worker has no such runner."""
    runner = barrier_runner(worker)
    attr = event_attr(runner)
    if attr is None:
        return False
    setattr(runner, attr, replay_event if replay_event is not None else new_event(worker.device))
    return True


def _buffers_ready(release: str | None, future_map: Any) -> bool:
    """Whether this FutureMap's draft buffers can be left alone: a release whose stash and
    gather touch every field, buffers already sized (the first stash sizes them from its
    payload: SGLang's own), and a draft state relayed through them (not ngram's)."""
    return release in STASH_RELEASES \
        and getattr(future_map, "_forward_buf_initialized", False) \
        and not future_map.spec_algo.is_ngram()


# Set on a FutureMap once its draft buffers were zeroed (`_zero_draft_state_once`).
_ZEROED = "_specctl_draft_state_zeroed"
_DRAFT_BUFFERS = ("topk_p_buf", "topk_index_buf", "hidden_states_buf")


def _zero_draft_state_once(future_map: Any) -> None:
    """Zero the FutureMap's draft buffers before its first bonus-only stash. SGLang allocates
    them uninitialised and fills a pool row at its request's first stash; a row first
    stashed bonus-only (an admission whose draft prefill was skipped) would otherwise hold
    whatever the memory held, and a top-k index from it, read by a later drafting launch,
    can be out of the vocabulary. Zeros are what SGLang's own stub would have written."""
    if getattr(future_map, _ZEROED, False):
        return
    for name in _DRAFT_BUFFERS:
        buf = getattr(future_map, name, None)
        if buf is not None:
            buf.zero_()
    setattr(future_map, _ZEROED, True)


def stash_bonus_only(release: str | None, future_map: Any, indices: Any, payload: Any) -> bool:
    """Stash a depth-0 relay's bonus tokens alone where the release would write every draft
    field. True if it did (the caller then skips SGLang's stash)."""
    if indices.shape[0] == 0 or not _buffers_ready(release, future_map):
        return False
    if getattr(payload, "draft_probs", None) is not None \
            or getattr(payload, "dsa_topk_indices", None) is not None:
        return False
    import torch

    _zero_draft_state_once(future_map)

    buf = future_map.output_tokens_buf
    tokens = payload.bonus_tokens.to(buf.dtype)
    # SGLang's `buf[indices] = tokens`, through the direct kernel: an indexed assignment
    # costs the scheduler more host time per launch (the indices, pool rows, are distinct).
    if indices.dtype == torch.int64:
        buf.index_copy_(0, indices, tokens)
    else:
        buf[indices] = tokens
    return True


def resolve_bonus_only(release: str | None, future_map: Any, batch: Any) -> bool:
    """Gather a decode batch's bonus tokens alone where the release would gather every draft
    field. True if it did (the caller then owes SGLang's gather to a launch that drafts)."""
    draft_input = batch.spec_info
    if draft_input is None or not _buffers_ready(release, future_map):
        return False
    indices = draft_input.future_indices
    if indices is None or indices.shape[0] == 0 \
            or getattr(future_map, "draft_probs_buf", None) is not None \
            or getattr(draft_input, "future_dsa_topk_indices_available", False):
        return False
    # No record of the indices, where SGLang's gather makes one: they are the batch's pool
    # rows, which the overlap scheduler keeps for two iterations (0.5.17 says the record is
    # redundant there), and a record costs a call and an event the allocator polls.
    # SGLang's `buf[indices]`, through the direct kernel (less host time a launch).
    draft_input.bonus_tokens = future_map.output_tokens_buf.index_select(0, indices)
    draft_input.dsa_topk_indices = None
    return True
