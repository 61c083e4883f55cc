"""A depth-0 plain decode fences the scheduler's next writes at its graph's replay.

After each launch SGLang's spec-v2 overlap scheduler fences its next writes to buffers the
forward reads (the next batch's KV slots, written into `req_to_token` on the schedule stream)
behind the event the last shared-buffer reader published (the WAR barrier). For EAGLE that
reader is the draft extend, and only a captured draft-extend graph publishes the event, just
before its replay. With the extend skipped at depth 0 (or run eagerly, as on FA3), the barrier
falls back to waiting for the whole forward.

A depth-0 batch on the target's DECODE graphs (plain_decode.py) reads its shared buffers
where a server without speculation's decode reads them: the graph runner builds the page
table out of `req_to_token` before it replays, and publishes its read-done event there (on
the target's model runner, which the barrier of an EAGLE server does not read). The plugin
hands the barrier that event, so the next iteration's preparation on the schedule stream runs
beside this decode, as on a server without speculation, instead of after it. What runs after
the replay reads nothing the schedule stream writes next: the sampler reads the graph's
logits, and the next lengths (made before the replay) and bonus tokens reach the next
iteration through the FutureMap, whose own publish event orders them.

Only a replay event is ever handed over: a depth-0 batch that kept the verify (a plain decode
fallback) keeps SGLang's whole-forward barrier. The verify's graph, a breakable one, reads
`req_to_token` during its replay (SGLang publishes its event after the replay), and an event
any earlier than the verify's outputs let the next batch's preparation race them (on the
H200, requests stopped finishing).
"""

from __future__ import annotations

from typing import Any

# On a plain decode's result: the read-done event its DECODE graph published before replaying.
REPLAY_EVENT = "specctl_replay_read_done"
# The read-done attribute the scheduler's WAR barrier reads: 0.5.23's name, then 0.5.17's.
EVENT_ATTRS = ("shared_read_done_event", "war_fastpath_read_done_event")


def event_attr(runner: Any) -> str | None:
    """The read-done attribute of this release's model runners, or None."""
    return next((a for a in EVENT_ATTRS if hasattr(runner, a)), None)


def barrier_runner(worker: Any) -> Any:
    """The model runner whose read-done event SGLang's WAR barrier reads for this worker."""
    runner = getattr(worker, "last_shared_read_runner", None)
    return runner if runner is not None else worker.war_fastpath_runner


def hand_over(worker: Any, replay_event: Any) -> bool:
    """Give the WAR barrier `replay_event`, a plain decode's read-done event from before its
    replay. False where the worker has no such runner."""
    runner = barrier_runner(worker)
    attr = event_attr(runner)
    if attr is None:
        return False
    setattr(runner, attr, replay_event)
    return True
