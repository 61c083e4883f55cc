"""What a server says about itself in `/server_info`, kept in bench.json beside the levels.

A bench result is only comparable, and only replayable (`specctl sim fit`), together with the
server's limits: how many requests it runs at once, its KV pool, its prefill budget. SGLang's
`/server_info` is its resolved server arguments plus scheduler facts, flat, with one
`internal_states` entry per DP rank; the keys below are read as SGLang names them (0.5.17 to
0.5.23; a key a version does not have is recorded as null).
"""

from __future__ import annotations

from typing import Any

from sglang_hooks.contract import SERVER_INFO_KEY

# Top-level keys of SGLang's /server_info worth keeping (scalars only).
FACT_KEYS = (
    "version",
    "model_path",
    "served_model_name",
    "max_running_requests",  # the server argument (null when SGLang chose it)
    "max_total_num_tokens",  # the KV pool in tokens, from the scheduler
    "max_prefill_tokens",
    "chunked_prefill_size",
    "context_length",
    "max_req_input_len",
    "page_size",
    "cuda_graph_max_bs",  # 0.5.17
    "cuda_graph_max_bs_decode",  # 0.5.23
    "speculative_algorithm",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "attention_backend",
    "tp_size",
    "dp_size",
    "schedule_policy",
    "enable_mixed_chunk",
    "disable_overlap_schedule",
    "stream_interval",  # tokens per streamed chunk: inter-token latency is per chunk above 1
    "scheduler_recv_interval",  # iterations between the scheduler's intake of new requests
)
_SCALAR = (str, int, float, bool, type(None))


def server_facts(info: dict[str, Any]) -> dict[str, Any]:
    """The facts of one server from its `/server_info` body (missing keys are null).

    `effective_max_running_requests_per_dp` is the running-request cap SGLang actually applies
    (rank 0), which differs from `max_running_requests` when SGLang chose or lowered it.
    `captured_depths`, `off_mode`, `verify_schedule_backends`, `plain_decode_runners`,
    `lean_host`, `lean_relay`, `fence_at_replay` and `skip_draft_prefill` come from the specctl
    plugin's state;
    `simulated` (profile, speedup) only from `specctl sim serve`.
    """
    out: dict[str, Any] = {}
    for key in FACT_KEYS:
        value = info.get(key)
        out[key] = value if isinstance(value, _SCALAR) else None
    ranks = info.get("internal_states")
    rank0 = ranks[0] if isinstance(ranks, list) and ranks and isinstance(ranks[0], dict) else {}
    cap = rank0.get("effective_max_running_requests_per_dp")
    out["effective_max_running_requests_per_dp"] = cap if isinstance(cap, int) else None
    out["dp_ranks"] = len(ranks) if isinstance(ranks, list) else None
    specctl = rank0.get(SERVER_INFO_KEY)
    depths = specctl.get("captured_depths") if isinstance(specctl, dict) else None
    out["captured_depths"] = (
        sorted(d for d in depths if isinstance(d, int)) if isinstance(depths, list) else None
    )
    # What the plugin runs at depth 0 (`sglang` pays the draft extend, `skip-extend` not).
    mode = specctl.get("off_mode") if isinstance(specctl, dict) else None
    out["off_mode"] = mode if isinstance(mode, str) else None
    # Whether depth 0's verify ran with the decode's FA3 scheduling (its GPU cost differs).
    served = specctl.get("verify_schedule_backends") if isinstance(specctl, dict) else None
    out["verify_schedule_backends"] = served if isinstance(served, int) else None
    # Whether depth 0 ran as a plain decode (SPECCTL_PLAIN_DECODE) rather than through the verify:
    # the runners it ran on, 0 while `specctl_plain_decode` has switched them off.
    plain = specctl.get("plain_decode") if isinstance(specctl, dict) else None
    runners = plain.get("runners") if isinstance(plain, dict) else None
    if isinstance(plain, dict) and isinstance(runners, int) and not isinstance(runners, bool):
        out["plain_decode_runners"] = 0 if plain.get("live") is False else runners
    else:
        out["plain_decode_runners"] = None
    # Whether the plugin's host-work trims ran (they shorten depth 0's iteration at high load).
    # ... and whether requests admitted at depth 0 skipped the draft's prefill.
    for trims in ("lean_host", "lean_relay", "fence_at_replay", "skip_draft_prefill"):
        on = specctl.get(trims) if isinstance(specctl, dict) else None
        out[trims] = on if isinstance(on, bool) else None
    simulated = info.get("simulated")
    if isinstance(simulated, dict):
        out["simulated"] = {
            "profile": simulated.get("profile"),
            "speedup": simulated.get("speedup"),
        }
    return out


def running_cap(facts: dict[str, Any]) -> int | None:
    """The running-request cap a server applies: the effective one, else its argument."""
    for key in ("effective_max_running_requests_per_dp", "max_running_requests"):
        value = facts.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None
