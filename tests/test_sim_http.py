"""The simulated server over real loopback HTTP: metrics, admin RPC, generation endpoints."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sglang_hooks import contract
from sglang_hooks.contract import (
    parse_rejection,
    push_body,
    read_server_state,
    single_depth_table,
)


def _depth_iterations(text: str) -> dict[int, float]:
    out: dict[int, float] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name == contract.METRIC_ITERATIONS:
            for s in fam.samples:
                if s.name.endswith("_total"):
                    d = int(s.labels["depth"])
                    out[d] = out.get(d, 0.0) + s.value
    return out


def _wait_for(predicate, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.05)


@pytest.mark.parametrize("sim_server", [{"concurrency": 8, "speedup": 200}], indirect=True)
def test_push_over_http_changes_depth_and_reads_back(sim_server):
    url = sim_server.base_url
    with httpx.Client(base_url=url, timeout=10) as client:
        _wait_for(lambda: sum(_depth_iterations(client.get("/metrics").text).values()) > 50)
        r = client.post("/set_internal_state", json=push_body(single_depth_table(1, version=9)))
        assert r.status_code == 200 and r.json() == [True]
        before = _depth_iterations(client.get("/metrics").text)
        _wait_for(lambda: _depth_iterations(client.get("/metrics").text).get(1, 0) > 50)
        after = _depth_iterations(client.get("/metrics").text)
        assert {d for d in after if after[d] > before.get(d, 0)} == {1}
        state = read_server_state(client.get("/server_info").json())[0]
        assert state["source"] == "push" and state["version"] == 9
        assert state["applied_iteration"] is not None
        legacy = client.get("/get_server_info").json()
        assert read_server_state(legacy)[0]["version"] == 9
        # PUT is accepted too, and release hands control back.
        r = client.put("/set_internal_state", json=push_body(None))
        assert r.json() == [True]
        assert read_server_state(client.get("/server_info").json())[0]["source"] == "none"


@pytest.mark.parametrize("sim_server", [{"admin_key": "adm", "api_key": "api"}], indirect=True)
def test_http_auth_and_errors(sim_server):
    url = sim_server.base_url
    good = push_body(single_depth_table(2, version=1))
    with httpx.Client(base_url=url, timeout=10) as client:
        assert client.get("/health").status_code == 200
        assert client.get("/metrics").status_code == 200  # always open, like SGLang
        r = client.post("/set_internal_state", json=good)
        assert (r.status_code, r.json()) == (401, {"error": "Unauthorized"})
        api = {"Authorization": "Bearer api"}
        adm = {"Authorization": "Bearer adm"}
        assert client.post("/set_internal_state", json=good, headers=api).status_code == 401
        assert client.get("/server_info").status_code == 401
        assert client.get("/server_info", headers=api).status_code == 200
        r = client.post("/set_internal_state", content=b"{not json", headers=adm)
        assert r.status_code == 400 and r.json()["message"].count("body") == 1
        r = client.post("/set_internal_state", json={"server_args": {"a": [1]}}, headers=adm)
        assert r.status_code == 400
        assert "body.server_args.a" in r.json()["message"]
        bad = push_body(single_depth_table(2, version=1))
        bad["server_args"]["specctl_t0_hysteresis"] = 3
        r = client.post("/set_internal_state", json=bad, headers=adm)
        rejection = parse_rejection(r.json())
        assert r.status_code == 400 and rejection is not None
        assert rejection.field == "specctl_t0_hysteresis"
        r = client.post("/set_internal_state", json={"server_args": {"nope": 1}}, headers=adm)
        assert (r.status_code, r.json()) == (200, [False])
        r = client.post("/set_internal_state", json=good, headers=adm)
        assert (r.status_code, r.json()) == (200, [True])
        # SGLang's maintenance endpoints are admin-optional: the admin key opens them.
        for path in ("/freeze_gc", "/flush_cache"):
            assert client.post(path, headers=adm).status_code == 200
            assert client.post(path, headers=api).status_code == 401


@pytest.mark.parametrize("sim_server", [{"speedup": 100}], indirect=True)
def test_completions_generate_and_models(sim_server):
    url = sim_server.base_url
    with httpx.Client(base_url=url, timeout=20) as client:
        models = client.get("/v1/models").json()
        assert models["data"][0]["id"] == sim_server.server.model_name
        r = client.post("/v1/completions", json={"prompt": "x" * 400, "max_tokens": 20})
        body = r.json()
        assert r.status_code == 200
        assert body["usage"] == {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}
        assert body["choices"][0]["finish_reason"] == "length" and body["choices"][0]["text"]

        chunks = []
        with client.stream(
            "POST",
            "/v1/completions",
            json={
                "prompt": "hello",
                "max_tokens": 30,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        ) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    chunks.append(line[6:])
        assert chunks[-1] == "[DONE]"
        events = [json.loads(c) for c in chunks[:-1]]
        assert events[-1]["usage"]["completion_tokens"] == 30
        text_chunks = [e for e in events if e["choices"] and e["choices"][0]["text"]]
        # Speculation delivers several tokens per decode step: fewer chunks than tokens.
        assert 1 < len(text_chunks) < 30

        r = client.post(
            "/generate", json={"input_ids": [1] * 64, "sampling_params": {"max_new_tokens": 12}}
        )
        meta = r.json()["meta_info"]
        assert meta["prompt_tokens"] == 64 and meta["completion_tokens"] == 12
        assert meta["finish_reason"]["type"] == "length"
        with client.stream(
            "POST",
            "/generate",
            json={"text": "hi", "stream": True, "sampling_params": {"max_new_tokens": 8}},
        ) as resp:
            lines = [ln for ln in resp.iter_lines() if ln.startswith("data: ")]
        assert lines[-1] == "data: [DONE]"
        assert json.loads(lines[-2][6:])["meta_info"]["completion_tokens"] == 8
        r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 0})
        assert r.status_code == 400 and "max_tokens" in r.json()["message"]

        fams = {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}
        streaming = [
            s for s in fams["sglang:num_requests"].samples if s.labels["is_streaming"] == "true"
        ]
        assert streaming and streaming[0].value == 2


def test_http_latency_reflects_load(sim_server_factory):
    """TTFT grows when a background load fills the batch (the request waits for prefill)."""
    idle = sim_server_factory(speedup=100)
    busy = sim_server_factory(speedup=100, concurrency=200)

    def sim_latency(handle) -> float:
        with httpx.Client(base_url=handle.base_url, timeout=30) as client:
            t0 = handle.server.now
            r = client.post(
                "/generate", json={"text": "x" * 40, "sampling_params": {"max_new_tokens": 4}}
            )
            assert r.status_code == 200
            return r.json()["meta_info"]["e2e_latency"] or (handle.server.now - t0)

    time.sleep(0.3)
    assert sim_latency(busy) > 3 * sim_latency(idle)


@pytest.mark.parametrize("sim_server", [{"speedup": 200}], indirect=True)
def test_chat_completions_and_usage_on_every_chunk(sim_server) -> None:
    """What bench sends: /v1/chat/completions with messages, and per-chunk usage when asked
    (stream_options.continuous_usage_stats), as SGLang streams it; ids as a completion prompt."""
    url = sim_server.base_url
    messages = [{"role": "system", "content": "x" * 400}, {"role": "user", "content": "y" * 40}]
    whole = httpx.post(f"{url}/v1/chat/completions", timeout=30,
                       json={"messages": messages, "max_tokens": 5}).json()  # fmt: skip
    assert whole["object"] == "chat.completion"
    assert whole["choices"][0]["message"]["role"] == "assistant"
    assert whole["usage"]["completion_tokens"] == 5
    # 110 tokens of content, and the template's: 4 per message and 3 for the generation prompt.
    assert whole["usage"]["prompt_tokens"] == 110 + 2 * 4 + 3
    body = {"messages": messages, "max_tokens": 12, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}  # fmt: skip
    chunks = []
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=30) as resp:
        for line in resp.iter_lines():
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                chunks.append(json.loads(line[5:]))
    text_chunks = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert text_chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    counts = [c["usage"]["completion_tokens"] for c in text_chunks]
    assert counts == sorted(counts) and counts[-1] == 12  # cumulative, on every chunk
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 12
    ids = httpx.post(f"{url}/v1/completions", timeout=30,
                     json={"prompt": list(range(1000, 1064)), "max_tokens": 2}).json()  # fmt: skip
    assert ids["usage"]["prompt_tokens"] == 64
    bad = httpx.post(f"{url}/v1/chat/completions", json={"messages": []}, timeout=30)
    assert bad.status_code == 400 and "messages" in bad.json()["message"]


def test_the_announced_port_takes_connections_before_the_server_runs() -> None:
    """`specctl sim serve` prints its URL before uvicorn runs: a client that connects at once
    waits in the socket's backlog instead of being refused, and is answered once it runs."""
    import socket

    from sims.http import ServedSimulation
    from sims.profile import load_profile
    from sims.server import SimulatedServer
    from sims.workload import Workload

    server = SimulatedServer(load_profile("kimi-k25-8x-rtxpro6000-pcie"), Workload.closed(0.0))
    served = ServedSimulation(server, speedup=50.0)
    try:
        with socket.create_connection(("127.0.0.1", served.port), timeout=2):
            pass  # refused before the socket listened at construction
        served.start()
        assert httpx.get(f"{served.base_url}/health", timeout=5).status_code == 200
    finally:
        served.stop()
