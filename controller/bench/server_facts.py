"""What a server says about itself in `/server_info`, kept in bench.json beside the levels.

A bench result is only comparable, and only replayable (`specctl sim fit`), together with the
server's limits: how many requests it runs at once, its KV pool, its prefill budget. SGLang's
`/server_info` is its resolved server arguments plus scheduler facts, flat, with one
`internal_states` entry per DP rank; the keys below are read as SGLang names them (0.5.17 to
0.5.23; a key a version does not have is recorded as null).
"""

from __future__ import annotations

from typing import Any

from sglang_hooks.contract import OFF_PATH_KEY, SERVER_INFO_KEY

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
    `captured_depths`, `off_path` (what depth 0 ran: the path and its pieces) and
    `plain_decode_runners` come from the specctl plugin's state; `simulated` (profile,
    speedup) only from `specctl sim serve`.
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
    # What the plugin ran at depth 0: `sglang` pays the draft extend; the plugin's path runs
    # the pieces listed (skip-extend, skip-draft-prefill, plain-decode, host-trims).
    out["off_path"] = _off_path(specctl.get(OFF_PATH_KEY) if isinstance(specctl, dict) else None)
    # Whether depth 0 ran as a plain decode rather than through the verify: the DECODE graph
    # runners it ran on (0 where none was captured).
    plain = specctl.get("plain_decode") if isinstance(specctl, dict) else None
    runners = plain.get("runners") if isinstance(plain, dict) else None
    if isinstance(plain, dict) and isinstance(runners, int) and not isinstance(runners, bool):
        out["plain_decode_runners"] = runners
    else:
        out["plain_decode_runners"] = None
    simulated = info.get("simulated")
    if isinstance(simulated, dict):
        out["simulated"] = {
            "profile": simulated.get("profile"),
            "speedup": simulated.get("speedup"),
        }
    return out


def _off_path(reported: Any) -> dict[str, Any] | None:
    """The plugin's `off_path` report, kept if it has its shape (a path, a list of names)."""
    if not isinstance(reported, dict):
        return None
    path, features = reported.get("path"), reported.get("features")
    if not isinstance(path, str) or not isinstance(features, list) \
            or not all(isinstance(f, str) for f in features):
        return None
    return {"path": path, "features": sorted(features)}


def running_cap(facts: dict[str, Any]) -> int | None:
    """The running-request cap a server applies: the effective one, else its argument."""
    for key in ("effective_max_running_requests_per_dp", "max_running_requests"):
        value = facts.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None
