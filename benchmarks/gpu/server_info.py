"""Both servers' /server_info: written to files, and the fields a run compares side by side.

The capacity fields (pool sizes, request caps, graph sizes) and, from the speculative
server's scheduler state, the plugin's own block (`specctl`): whether it steers and, as
whatever the plugin reports there, its `off_path` and `plain_decode` state.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from benchmarks.gpu import servers
from benchmarks.gpu.state import RunState

SERVER_INFO_FIELDS = (
    "model_path", "version", "max_running_requests", "max_total_num_tokens",
    "max_prefill_tokens", "context_length", "chunked_prefill_size", "mem_fraction_static",
    "cuda_graph_max_bs", "cuda_graph_max_bs_decode", "attention_backend", "sampling_backend",
    "load_format", "speculative_algorithm", "speculative_num_steps",
    "speculative_num_draft_tokens", "speculative_eagle_topk", "speculative_adaptive",
    "disable_overlap_schedule", "enable_metrics",
)  # fmt: skip
INTERNAL_STATE_FIELDS = ("effective_max_running_requests_per_dp", "memory_usage",
                         "avg_spec_accept_length")
# The plugin's state: whether it steers, from where; then its depth-0 blocks, kept whole.
PLUGIN_FIELDS = ("active", "inactive_reason", "captured_depths", "source")
PLUGIN_BLOCKS = ("off_path", "plain_decode")


def plugin_state(specctl: dict[str, Any]) -> dict[str, Any]:
    """The plugin's block of /server_info as the summary shows it: its fields that say whether
    it steers, and its depth-0 blocks as the plugin reports them (no field assumed)."""
    out = {k: specctl[k] for k in PLUGIN_FIELDS if k in specctl}
    out |= {k: specctl[k] for k in PLUGIN_BLOCKS if k in specctl}
    return out


def record(state: RunState) -> dict[str, Any]:
    """/server_info of both servers to server_info_ROLE.json; the fields compared returned and
    saved in the state."""
    out: dict[str, Any] = {}
    for role in (servers.SPEC, servers.PLAIN):
        url = state.url(role)
        if url is None:
            continue
        try:
            info = httpx.get(f"{url}/server_info", timeout=10).json()
        except (httpx.HTTPError, ValueError) as err:
            out[role] = {"error": f"{type(err).__name__}: {err}"}
            continue
        (state.run_dir / f"server_info_{role}.json").write_text(json.dumps(info, indent=2) + "\n")
        fields = {k: info.get(k) for k in SERVER_INFO_FIELDS if k in info}
        states = info.get("internal_states") or [{}]
        first = states[0] if isinstance(states, list) and states else {}
        for k in INTERNAL_STATE_FIELDS:
            if isinstance(first, dict) and k in first:
                fields[f"internal.{k}"] = first[k]
        if isinstance(first, dict) and isinstance(first.get("specctl"), dict):
            fields["specctl"] = plugin_state(first["specctl"])
        out[role] = fields
    state.data["server_info"] = out
    state.save()
    return out


def kv_pool_note(server_info: dict[str, Any]) -> str | None:
    """A warning when the two servers' KV pools differ, naming the cap that evens them.

    SGLang lowers a `--max-total-tokens` above what its memory share holds to what it holds,
    so the harness's one cap evens the pools only where both shares hold it (an 80 GB card's
    do not hold 262,144 tokens of the 8B shape)."""
    spec, plain = ((server_info.get(role) or {}).get("max_total_num_tokens")
                   for role in (servers.SPEC, servers.PLAIN))
    if not isinstance(spec, int) or not isinstance(plain, int) or spec == plain:
        return None
    return (f"the KV pools differ: {servers.SPEC} {spec:,} tokens, {servers.PLAIN} "
            f"{plain:,}; a paired comparison then weighs unequal prefix caches. Pass "
            f"{servers.KV_TOKENS_FLAG} {min(spec, plain)} in --server-args to give both the "
            "smaller")
