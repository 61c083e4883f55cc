"""SimulatedServer in-process API: clock, admin RPC semantics, readback, metrics, determinism."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sglang_hooks import contract
from sglang_hooks.contract import (
    parse_rejection,
    parse_table,
    push_body,
    read_server_state,
    single_depth_table,
)
from sims.profile import load_profile
from sims.server import SimulatedServer
from sims.workload import Workload, load_scenario

KIMI = "kimi-k25-8x-rtxpro6000-pcie"


@pytest.fixture(scope="module")
def kimi():
    return load_profile(KIMI)


def _server(profile, concurrency=16, **kw) -> SimulatedServer:
    workload = Workload.closed(concurrency, prompt_tokens=512, output_tokens=128)
    return SimulatedServer(profile, workload, **kw)


def _counters(text: str) -> dict[tuple[str, int, int], float]:
    """(family, depth, bucket) -> value for the contract's counter families."""
    out: dict[tuple[str, int, int], float] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name not in contract.COUNTER_FAMILIES:
            continue
        for s in fam.samples:
            if s.name.endswith("_total"):
                key = (fam.name, int(s.labels["depth"]), int(s.labels["bs_bucket"]))
                out[key] = out.get(key, 0.0) + s.value
    return out


def _by_depth(counters: dict[tuple[str, int, int], float], family: str) -> dict[int, float]:
    out: dict[int, float] = {}
    for (fam, depth, _), v in counters.items():
        if fam == family:
            out[depth] = out.get(depth, 0.0) + v
    return out


def test_clock_advances_and_tokens_flow(kimi):
    server = _server(kimi)
    server.advance(30)
    assert server.now >= 30
    stats = server.stats()
    assert stats.tokens_generated > 0
    assert stats.completed_requests > 0
    assert stats.decode_iterations > 0 and stats.prefill_iterations > 0


def test_same_seed_same_results_and_other_seed_differs(kimi):
    def run(seed: int) -> tuple[int, int, str]:
        server = SimulatedServer(kimi, load_scenario("ramp").workload, seed=seed)
        server.advance(90)
        st = server.stats()
        return st.tokens_generated, st.decode_iterations, server.metrics_text()

    assert run(7) == run(7)
    assert run(7)[0] != run(8)[0]


def test_push_applies_table_at_next_iteration_and_depth_changes(kimi):
    server = _server(kimi, concurrency=16)
    server.advance(20)
    before = _by_depth(_counters(server.metrics_text()), contract.METRIC_ITERATIONS)
    status, body = server.set_internal_state(push_body(single_depth_table(2, version=5)), None)
    assert (status, body) == (200, [True])
    state = read_server_state(server.server_info())[0]
    assert state["source"] == "push" and state["version"] == 5
    assert state["applied_iteration"] is None  # applied at the next iteration boundary
    server.advance(20)
    state = read_server_state(server.server_info())[0]
    assert state["applied_iteration"] is not None
    after = _by_depth(_counters(server.metrics_text()), contract.METRIC_ITERATIONS)
    grown = {d for d in after if after[d] > before.get(d, 0.0)}
    assert grown == {2}
    assert "specctl_policy_version{" in server.metrics_text()
    assert server.policy_version == 5


def test_release_returns_control_to_sglang_adaptive(kimi):
    server = _server(kimi)
    server.set_internal_state(push_body(single_depth_table(2, version=1)), None)
    server.advance(5)
    status, body = server.set_internal_state(push_body(None), None)
    assert (status, body) == (200, [True])
    server.advance(5)
    state = read_server_state(server.server_info())[0]
    assert state["source"] == "none" and state["table"] is None
    assert server.policy_name == "sglang-adaptive"
    assert server.policy_version == 0


def test_invalid_push_is_400_naming_the_wire_key_and_recorded(kimi):
    server = _server(kimi)
    body = push_body(parse_table({"tiers": [{"min_batch": 1, "depth": 3}]}))
    body["server_args"]["specctl_t0_depth"] = 9  # not captured
    status, err = server.set_internal_state(body, None)
    assert status == 400
    rejection = parse_rejection(err)
    assert rejection is not None and rejection.field == "specctl_t0_depth"
    state = read_server_state(server.server_info())[0]
    assert state["last_rejection"].startswith("specctl_t0_depth")
    assert state["source"] == "none"


@pytest.mark.parametrize("key", ["specctl_off_mode", "specctl_lean_host", "specctl_lean_relay",
                                 "specctl_fence_at_replay", "specctl_skip_draft_prefill",
                                 "specctl_plain_decode"])
def test_a_former_plugin_setting_is_answered_as_any_unknown_key(kimi, key: str):
    """The plugin has no run-time setting left: alone, such a key is a push without its
    version; beside a table, an unknown key of it (a 400 naming it). Nothing is applied."""
    server = _server(kimi)
    before = read_server_state(server.server_info())[0]
    status, err = server.set_internal_state({"server_args": {key: 1}}, None)
    rejection = parse_rejection(err)
    assert status == 400 and rejection is not None and rejection.field == "specctl_version"
    body = push_body(single_depth_table(2, version=3))
    body["server_args"][key] = 0
    status, err = server.set_internal_state(body, None)
    rejection = parse_rejection(err)
    assert status == 400 and rejection is not None and rejection.field == key
    assert "unknown key" in rejection.message
    after = read_server_state(server.server_info())[0]
    assert after["table"] is None and after["off_path"] == before["off_path"]


@pytest.mark.parametrize(("profile", "path", "features", "runners"), [
    (KIMI, "sglang", [], 0),  # SGLang's own depth 0: the draft extend, the draft prefill
    ("h200-sglang-llama8b-seeded",  # SGLang 0.5.17's off path, as the plugin runs it there
     "specctl", ["plain-decode", "skip-draft-prefill", "skip-extend"], 1),
])  # fmt: skip
def test_the_off_path_is_reported_as_the_plugin_reports_it(profile: str, path: str,
                                                           features: list[str], runners: int):
    """What depth 0 runs comes from the profile, in the plugin's shape: the path and its
    pieces, the counters beside them; none of the keys the plugin no longer reports."""
    server = _server(load_profile(profile))
    server.set_internal_state(push_body(single_depth_table(0, version=1)), None)
    server.advance(5)
    state = read_server_state(server.server_info())[0]
    assert state["off_path"] == {"path": path, "features": features}
    assert state["plain_decode"]["runners"] == runners
    assert not {"enabled", "env_error", "live"} & set(state["plain_decode"])
    skipped = state["skipped_draft_extends"]
    assert (skipped > 0) is ("skip-extend" in features)
    assert state["replay_fences"] == (skipped if runners else 0)
    assert state["host_trim_runs"] == {}
    for gone in ("off_mode", "lean_host", "lean_relay", "fence_at_replay", "skip_draft_prefill"):
        assert gone not in state


@pytest.mark.parametrize(
    "body, field",
    [
        ({"server_args": {"specctl_version": "three"}}, "specctl_version"),
        ({"server_args": [1, 2]}, "server_args"),
        ({"args": {}}, "server_args"),
        ("not json object", None),
    ],
)
def test_malformed_body_is_400_naming_the_field(kimi, body, field):
    """SGLang answers request-validation errors with 400 and an ErrorResponse, not 422."""
    server = _server(kimi)
    status, err = server.set_internal_state(body, None)
    assert status == 400
    assert err["object"] == "error" and "body" in err["message"]
    if field is not None:
        assert field in err["message"]


def test_unknown_sglang_key_is_false_and_known_key_true(kimi):
    server = _server(kimi)
    assert server.set_internal_state({"server_args": {"no_such_knob": 1}}, None) == (200, [False])
    ok = {"server_args": {"speculative_accept_threshold_single": 1.0}}
    assert server.set_internal_state(ok, None) == (200, [True])
    # A table plus a refused key: nothing is applied, and the reason is recorded.
    mixed = push_body(single_depth_table(1, version=3))
    mixed["server_args"]["no_such_knob"] = 1
    assert server.set_internal_state(mixed, None) == (200, [False])
    state = read_server_state(server.server_info())[0]
    assert state["version"] == 0 and "no_such_knob" in state["last_rejection"]


def test_auth_admin_optional(kimi):
    admin = _server(kimi, admin_key="adm", api_key="api")
    body = push_body(single_depth_table(1, version=1))
    assert admin.set_internal_state(body, None) == (401, {"error": "Unauthorized"})
    assert admin.set_internal_state(body, "Bearer api")[0] == 401  # api key is not enough
    assert admin.set_internal_state(body, "Bearer adm") == (200, [True])
    api_only = _server(kimi, api_key="api")
    assert api_only.set_internal_state(body, "Bearer wrong")[0] == 401
    assert api_only.set_internal_state(body, "Bearer api") == (200, [True])
    assert _server(kimi).set_internal_state(body, None) == (200, [True])


def test_metrics_ratios_match_stats(kimi):
    server = _server(kimi, concurrency=8)
    server.set_internal_state(push_body(single_depth_table(3, version=1)), None)
    server.advance(120)
    c = _counters(server.metrics_text())
    iters = sum(v for (f, d, _), v in c.items() if f == contract.METRIC_ITERATIONS and d == 3)
    steps = sum(v for (f, d, _), v in c.items() if f == contract.METRIC_REQUEST_STEPS and d == 3)
    tokens = sum(v for (f, d, _), v in c.items() if f == contract.METRIC_TOKENS and d == 3)
    gpu = sum(v for (f, d, _), v in c.items() if f == contract.METRIC_GPU_SECONDS and d == 3)
    accept = tokens / steps
    expected = kimi.acceptance.expected_length("chat", 3)
    assert accept == pytest.approx(expected, rel=0.03)
    mean_batch = steps / iters
    model_ms = float(kimi.iteration_ms(3, round(mean_batch)))
    assert 1000 * gpu / iters == pytest.approx(model_ms, rel=0.10)


def test_sglang_series_present_with_real_labels(kimi):
    server = _server(kimi, concurrency=4)
    server.advance(30)
    fams = {f.name: f for f in text_string_to_metric_families(server.metrics_text())}
    for name in contract.SGLANG_GAUGES:
        sample = fams[name].samples[0]
        assert set(sample.labels) == set(contract.BASE_LABELS)
    assert fams["sglang:num_running_reqs"].samples[0].value == 4
    assert 1.0 < fams["sglang:spec_accept_length"].samples[0].value < 4.0
    assert fams["sglang:generation_tokens"].type == "counter"
    captured = {int(s.labels["depth"]) for s in fams[contract.METRIC_CAPTURED_DEPTH].samples}
    assert captured == set(kimi.captured_depths)


def test_nospec_server_has_no_draft_cost_and_higher_cap(kimi):
    spec = _server(kimi, concurrency=200)
    nospec = _server(kimi, concurrency=200, speculative=False)
    assert nospec.engine.max_running > spec.engine.max_running
    nospec.advance(60)
    assert set(nospec.stats().iterations_per_depth) == {0}
    info = nospec.server_info()
    assert info["speculative_algorithm"] is None


def test_external_concurrency_override(kimi):
    server = _server(kimi, concurrency=1)
    server.set_concurrency(32)
    server.advance(60)
    assert server.engine.n + server.engine.queue_length >= 24


@pytest.mark.parametrize("speculative, decode_kind", [(True, "target_verify"), (False, "decode")])
def test_device_timer_counter_is_the_engines_own_time(kimi, speculative, decode_kind):
    """SGLang's `sglang:forward_execution_seconds_total` (its device timer), when asked for:
    prefill seconds as `extend`, the decode iterations' timed seconds under the kind SGLang
    uses for them; together no more than the clock moved."""
    from controller.bench.metrics import parse_scrape

    server = _server(kimi, speculative=speculative, device_timer=True)
    server.advance(60)
    seen = parse_scrape(server.metrics_text()).forward_seconds
    stats = server.stats()
    gpu = _by_depth(_counters(server.metrics_text()), contract.METRIC_GPU_SECONDS)
    assert set(seen) == {"extend", decode_kind}
    assert seen["extend"] == pytest.approx(stats.prefill_seconds) and seen["extend"] > 0
    if speculative:
        assert seen[decode_kind] == pytest.approx(sum(gpu.values())) and seen[decode_kind] > 0
    assert 0 < seen["extend"] + seen[decode_kind] <= server.now
    assert "forward_execution_seconds" not in _server(kimi).metrics_text()


def _with_draft_prefill(ms: float, skipped_ms: float = 0.0):
    profile = load_profile("h200-sglang-llama8b-seeded")
    draft = profile.draft.model_copy(update={"prefill_ms": ms, "prefill_at_depth0": False,
                                             "prefill_skipped_ms": skipped_ms})
    return profile.model_copy(update={"draft": draft})


def _prefill_ms(server: SimulatedServer, seconds: float) -> float:
    server.advance(seconds)
    stats = server.stats()
    return 1000.0 * stats.prefill_seconds / stats.prefill_iterations


def _depth0(profile) -> SimulatedServer:
    server = _server(profile, concurrency=16)
    body = push_body(single_depth_table(0, version=1))
    assert server.set_internal_state(body, None) == (200, [True])
    return server


def test_the_draft_prefill_skip_drops_its_cost_after_depth_zero_only():
    """On an off path with the skip (the profile's `prefill_at_depth0: false`) and a table, a
    prefill after a depth-0 iteration runs without `draft.prefill_ms`; on SGLang's own depth
    0 (`prefill_at_depth0: true`) or at depth 2, a prefill pays it. 200 ms stands out of any
    prefill's own noise."""
    profile = _with_draft_prefill(200.0)
    assert not _server(profile).engine.skip_draft_prefill  # SGLang's own choice: no table
    skipping = _depth0(profile)
    assert skipping.engine.skip_draft_prefill
    skipped = _prefill_ms(skipping, 30)
    assert skipped < 100
    state = read_server_state(skipping.server_info())[0]
    assert "skip-draft-prefill" in state["off_path"]["features"]
    assert state["skipped_draft_prefills"] > 0
    draft = profile.draft.model_copy(update={"prefill_at_depth0": True})
    prefilling = _depth0(profile.model_copy(update={"draft": draft}))
    assert _prefill_ms(prefilling, 30) > skipped + 150
    assert prefilling.engine.skipped_draft_prefills == 0
    speculating = _server(profile, concurrency=16)
    speculating.set_internal_state(push_body(single_depth_table(2, version=1)), None)
    assert _prefill_ms(speculating, 30) > skipped + 150
    assert read_server_state(speculating.server_info())[0]["skipped_draft_prefills"] == 0


def test_a_skipped_draft_prefill_still_costs_what_the_profile_says_on_the_speculative_server():
    """`draft.prefill_skipped_ms` is what a prefill after depth 0 pays beyond a plain
    server's with the draft's prefill skipped: charged there, and never on a server without
    speculation. 150 ms stands out of any prefill's own noise."""
    plain_cost = _prefill_ms(_depth0(_with_draft_prefill(200.0)), 30)
    charged = _depth0(_with_draft_prefill(200.0, skipped_ms=150.0))
    assert charged.engine.skip_draft_prefill
    assert _prefill_ms(charged, 30) > plain_cost + 100
    assert charged.engine.skipped_draft_prefills > 0
    speculating = _server(_with_draft_prefill(200.0, skipped_ms=150.0), concurrency=16)
    speculating.set_internal_state(push_body(single_depth_table(2, version=1)), None)
    drafting = _prefill_ms(speculating, 30)  # pays prefill_ms, not the skipped extra on top
    assert plain_cost + 150 < drafting < plain_cost + 250
    without = _server(_with_draft_prefill(200.0, skipped_ms=150.0), concurrency=16,
                      speculative=False)
    assert _prefill_ms(without, 30) < plain_cost + 50
