"""The admin path: SGLang's real HTTP route, io_struct and internal-state controller.

Real: `http_server.app` (route, request validation, exception handlers), `SetInternalStateReq`
/ `SetInternalStateReqOutput`, `SchedulerInternalStateController` (0.5.23) and
`TokenizerManager.set_internal_state`/`get_internal_state` (patched by the plugin).
Stand-ins, because these need running processes: the ZMQ communicators of the tokenizer
manager (`_Communicator`, which calls the scheduler side in-process), and the Scheduler
object the controller reads (`_Scheduler`: the three attributes its update path touches).
For 0.5.17, whose `Scheduler.set_internal_state` cannot be constructed here, the hook runs
around `_Scheduler017.set_internal_state`, a stand-in with the same whitelist behaviour;
the guard tests prove that the real 0.5.17 method has the hooked signature.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from sglang_hooks import hooks
from sglang_hooks.contract import PolicyTable, Tier, encode_table, push_body, read_server_state
from sglang_hooks.runtime import SchedulerRuntime

TABLE = PolicyTable.build([Tier(1, 3), Tier(16, 1, hysteresis=2)], version=5)


class _Scheduler:
    max_running_requests = 64
    spec_algorithm = SimpleNamespace(is_none=lambda: False, is_dflash=lambda: False,
                                     is_dspark=lambda: False)
    metrics_reporter = SimpleNamespace(spec_total_num_accept_tokens=0,
                                       spec_total_num_forward_ct=0)


@pytest.fixture
def controller(runtime: SchedulerRuntime) -> Any:
    from sglang.srt.managers.scheduler_components.internal_state import (
        SchedulerInternalStateController,
    )

    runtime.activate({0, 1, 3}, None)
    return SchedulerInternalStateController(_Scheduler(), record_step_time=False)


def _req(server_args: dict[str, Any]) -> Any:
    from sglang.srt.managers.io_struct import SetInternalStateReq

    return SetInternalStateReq(server_args=server_args)


def test_controller_applies_a_valid_table_and_says_so(controller: Any,
                                                      runtime: SchedulerRuntime) -> None:
    out = controller.set_internal_state(_req(encode_table(TABLE)))
    assert out.updated is True
    assert runtime.table == TABLE and runtime.source == "push"


def test_controller_refuses_uncaptured_depth_truthfully(controller: Any,
                                                        runtime: SchedulerRuntime) -> None:
    bad = PolicyTable.build([Tier(1, 5)], version=6)
    out = controller.set_internal_state(_req(encode_table(bad)))
    assert out.updated is False
    assert runtime.table is None
    assert runtime.last_rejection is not None
    assert "specctl_t0_depth" in runtime.last_rejection and "not captured" in runtime.last_rejection


def test_sglang_keys_still_go_through_sglang(controller: Any, runtime: SchedulerRuntime) -> None:
    out = controller.set_internal_state(_req({"bogus_knob": 1}))
    assert out.updated is False  # SGLang's own refusal, untouched by the plugin
    out = controller.set_internal_state(_req({**encode_table(TABLE), "bogus_knob": 1}))
    assert out.updated is False and runtime.table is None  # all or nothing


def test_release_returns_control_to_sglang(controller: Any, runtime: SchedulerRuntime) -> None:
    assert controller.set_internal_state(_req(encode_table(TABLE))).updated
    assert controller.set_internal_state(_req(encode_table(None))).updated
    assert runtime.table is None and runtime.source == "none"


@pytest.mark.parametrize("key", ["specctl_off_mode", "specctl_lean_host", "specctl_lean_relay",
                                 "specctl_fence_at_replay", "specctl_skip_draft_prefill",
                                 "specctl_plain_decode"])
def test_a_former_setting_key_is_refused_through_the_controller_as_any_unknown_key(
    controller: Any, runtime: SchedulerRuntime, key: str,
) -> None:
    """The plugin has no run-time setting left: alone, such a key is a table push missing its
    version; beside a table, an unknown key of it. Nothing is applied either way."""
    out = controller.set_internal_state(_req({key: 1}))
    assert out.updated is False and (runtime.last_rejection or "").startswith("specctl_version")
    out = controller.set_internal_state(_req({**encode_table(TABLE), key: 0}))
    assert out.updated is False and runtime.table is None
    assert (runtime.last_rejection or "").startswith(f"{key}: unknown key")


def test_state_report_lands_in_the_real_output_message(runtime: SchedulerRuntime) -> None:
    from sglang.srt.managers.io_struct import GetInternalStateReqOutput

    runtime.activate({0, 1, 3}, None)
    runtime.commit(TABLE)
    out = hooks.get_internal_state(GetInternalStateReqOutput(internal_state={"x": 1}), None)
    [state] = read_server_state({"internal_states": [out.internal_state]})
    assert state["version"] == 5 and state["captured_depths"] == [0, 1, 3]
    assert PolicyTable.build(TABLE.tiers, 5).to_json() == state["table"]


def _owner(**server_args: Any) -> Any:
    """What the get_internal_state hook receives: the Scheduler (0.5.17) or the internal-state
    controller holding it (0.5.23); either way only its real `ServerArgs` is read (0.5.23
    builds them unresolved, so no model needs to exist)."""
    from sglang.srt.server_args import ServerArgs

    args = ServerArgs(model_path="unused", speculative_algorithm="EAGLE3",
                      speculative_eagle_topk=1, **server_args)
    return SimpleNamespace(server_args=args, scheduler=SimpleNamespace(server_args=args))


def test_server_info_names_why_the_controller_never_started(runtime: SchedulerRuntime) -> None:
    """The push's 400 and /server_info give the same reason; before, /server_info said only
    that the controller had not started."""
    from sglang.srt.managers.io_struct import GetInternalStateReqOutput

    owner = _owner(speculative_adaptive=False)
    off = hooks.get_internal_state(GetInternalStateReqOutput(internal_state={}), owner)
    state = off.internal_state["specctl"]
    assert state["active"] is False
    assert state["inactive_reason"].startswith("speculative_adaptive is off")
    assert state["inactive_reason"] == hooks.unsupported_config_reason(owner.server_args)

    pp = hooks.get_internal_state(GetInternalStateReqOutput(internal_state={}),
                                  _owner(speculative_adaptive=True, pp_size=2))
    assert "pp_size=2" in pp.internal_state["specctl"]["inactive_reason"]


def test_a_scheduler_whose_states_build_under_pipeline_parallelism_stays_inactive(
    runtime: SchedulerRuntime,
) -> None:
    """With pp_size 2 SGLang still builds the adaptive states on a scheduler; the plugin then
    reports inactive with the reason the HTTP side refuses pushes for, not active with a
    table state no push can reach. The real ServerArgs; the controller is a stand-in."""
    from sglang.srt.managers.io_struct import GetInternalStateReqOutput

    params = SimpleNamespace(candidate_steps=[0, 3], cuda_graph_bs_for_step=lambda step: [1])
    owner = _owner(speculative_adaptive=True, pp_size=2)
    worker = SimpleNamespace(speculative_num_steps=3, server_args=owner.server_args)
    hooks.on_states_built(None, SimpleNamespace(params=params, worker=worker), [1])
    assert runtime.active is False and "pp_size=2" in (runtime.inactive_reason or "")
    out = hooks.get_internal_state(GetInternalStateReqOutput(internal_state={}), owner)
    assert out.internal_state["specctl"]["active"] is False
    one = SimpleNamespace(speculative_num_steps=3,
                          server_args=_owner(speculative_adaptive=True).server_args)
    hooks.on_states_built(None, SimpleNamespace(params=params, worker=one), [1])
    assert runtime.active is True  # the same start without pipeline parallelism steers


def test_a_started_controller_reports_no_reason(runtime: SchedulerRuntime) -> None:
    from sglang.srt.managers.io_struct import GetInternalStateReqOutput

    runtime.activate({0, 1, 3}, None)
    out = hooks.get_internal_state(GetInternalStateReqOutput(internal_state={}),
                                   _owner(speculative_adaptive=False))
    state = out.internal_state["specctl"]
    assert state["active"] is True and state["inactive_reason"] is None


class _Scheduler017:
    """0.5.17's Scheduler.set_internal_state, reduced to its whitelist (see module doc)."""

    calls: list[dict[str, Any]]

    def __init__(self) -> None:
        self.calls = []

    def set_internal_state(self, recv_req: Any) -> Any:
        from sglang.srt.managers.io_struct import SetInternalStateReqOutput

        self.calls.append(dict(recv_req.server_args))
        ok = all(k == "pp_max_micro_batch_size" for k in recv_req.server_args)
        return SetInternalStateReqOutput(updated=ok)


def test_0_5_17_hook_keeps_specctl_keys_away_from_the_whitelist(
    runtime: SchedulerRuntime,
) -> None:
    runtime.activate({1, 3}, None)
    sched = _Scheduler017()
    out = hooks.set_internal_state(_Scheduler017.set_internal_state, sched,
                                   _req(encode_table(TABLE)))
    assert out.updated is True and sched.calls == []  # not even called: no stats reset
    out = hooks.set_internal_state(_Scheduler017.set_internal_state, sched,
                                   _req({**encode_table(TABLE), "pp_max_micro_batch_size": 4}))
    assert out.updated is True and sched.calls == [{"pp_max_micro_batch_size": 4}]


# ----------------------------------------------------------------------------- HTTP


class _Communicator:
    """Stands in for the ZMQ fan-out: answers from the in-process scheduler side."""

    def __init__(self, handler: Any) -> None:
        self.handler = handler

    async def __call__(self, req: Any) -> list[Any]:
        return [self.handler(req)]


@pytest.fixture
def client(controller: Any) -> Any:
    from fastapi.testclient import TestClient
    from sglang.srt.entrypoints import http_server
    from sglang.srt.managers.io_struct import GetInternalStateReqOutput
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    tm = TokenizerManager.__new__(TokenizerManager)  # real methods, no processes behind it
    tm.auto_create_handle_loop = lambda: None
    tm.set_internal_state_communicator = _Communicator(controller.set_internal_state)
    tm.get_internal_state_communicator = _Communicator(
        lambda req: hooks.get_internal_state(GetInternalStateReqOutput(internal_state={}), None)
    )
    hooks.HTTP.inactive_reason = None
    previous = getattr(http_server, "_global_state", None)
    http_server._global_state = SimpleNamespace(tokenizer_manager=tm)
    yield TestClient(http_server.app)
    http_server._global_state = previous


def test_push_body_passes_sglang_request_validation_and_is_applied(
    client: Any, runtime: SchedulerRuntime
) -> None:
    resp = client.post("/set_internal_state", json=push_body(TABLE))
    assert resp.status_code == 200, resp.text
    assert resp.json() == [True]
    assert runtime.table == TABLE


def test_malformed_table_is_a_400_naming_the_wire_key(client: Any,
                                                      runtime: SchedulerRuntime) -> None:
    body = push_body(TABLE)
    body["server_args"]["specctl_t1_hysteresis"] = 20  # band overlaps the tier below
    resp = client.post("/set_internal_state", json=body)
    assert resp.status_code == 400
    detail = json.loads(resp.json()["message"])
    assert detail["error"] == "invalid_policy" and detail["field"] == "specctl_t1_hysteresis"
    assert runtime.table is None


def test_uncaptured_depth_is_a_400_before_reaching_the_scheduler(client: Any) -> None:
    resp = client.post("/set_internal_state",
                       json=push_body(PolicyTable.build([Tier(1, 7)], 2)))
    assert resp.status_code == 400
    detail = json.loads(resp.json()["message"])
    assert detail["field"] == "specctl_t0_depth" and "not captured" in detail["message"]


def test_a_former_setting_key_is_a_400_naming_it(client: Any,
                                                runtime: SchedulerRuntime) -> None:
    resp = client.post("/set_internal_state", json={"server_args": {"specctl_off_mode": 0}})
    assert resp.status_code == 400
    assert json.loads(resp.json()["message"])["field"] == "specctl_version"
    body = push_body(TABLE)
    body["server_args"]["specctl_plain_decode"] = 1
    resp = client.post("/set_internal_state", json=body)
    assert resp.status_code == 400
    detail = json.loads(resp.json()["message"])
    assert detail["field"] == "specctl_plain_decode" and "unknown key" in detail["message"]
    assert runtime.table is None


def test_smoke_off_path_check_reads_the_real_report(runtime: SchedulerRuntime) -> None:
    """The smoke test's check of what depth 0 runs, on the states the real report hook gives:
    every rank the same path and pieces passes, a rank on another path or not yet steering
    fails, and this SGLang's path skips the draft extend."""
    from sglang.srt.managers.io_struct import GetInternalStateReqOutput

    from sglang_hooks import settings, smoke

    def state() -> dict[str, Any]:
        out = hooks.get_internal_state(GetInternalStateReqOutput(internal_state={}), None)
        [got] = read_server_state({"internal_states": [out.internal_state]})
        return got

    ours = state()
    assert ours["off_path"]["path"] == "specctl" and smoke.skips_extend(ours)
    ok, what = smoke.off_path_check([ours, ours])
    assert ok and "skip-extend" in what
    runtime.use_off_path(settings.SGLANG, ())
    fallback = state()
    assert not smoke.off_path_check([ours, fallback])[0] and not smoke.skips_extend(fallback)
    runtime.off_path = None  # as before steering starts
    assert not smoke.off_path_check([state()])[0]


def test_non_numeric_value_is_refused_by_sglang_own_validation(client: Any) -> None:
    body = push_body(TABLE)
    body["server_args"]["specctl_t0_depth"] = "three"
    resp = client.post("/set_internal_state", json=body)
    assert resp.status_code in (400, 422)


def test_inactive_server_refuses_a_push_with_the_reason(client: Any) -> None:
    hooks.HTTP.inactive_reason = "speculative_adaptive is off"
    resp = client.post("/set_internal_state", json=push_body(TABLE))
    assert resp.status_code == 400
    assert "speculative_adaptive is off" in json.loads(resp.json()["message"])["message"]


class _FullDiskExporter:
    """Stand-in exporter failing like a full PROMETHEUS_MULTIPROC_DIR (the real one writes
    mmap'd files; making that fail here would need a full disk)."""

    def export(self, runtime: SchedulerRuntime) -> None:
        raise OSError(28, "No space left on device")


def test_a_failing_metrics_write_neither_fails_nor_undoes_a_push(
    controller: Any, runtime: SchedulerRuntime
) -> None:
    from sglang.srt.managers.io_struct import GetInternalStateReqOutput

    runtime.exporter = _FullDiskExporter()
    out = controller.set_internal_state(_req(encode_table(TABLE)))
    assert out.updated is True and runtime.table == TABLE
    got = hooks.get_internal_state(GetInternalStateReqOutput(internal_state={}), None)
    [state] = read_server_state({"internal_states": [got.internal_state]})
    assert state["version"] == TABLE.version and state["source"] == "push"


@pytest.mark.parametrize(("api_key", "admin_key"),
                         [(None, None), ("api", None), (None, "admin"), ("api", "admin")])
def test_smoke_sends_each_route_a_key_sglang_accepts(api_key: str | None,
                                                     admin_key: str | None) -> None:
    """SGLang's own auth decision (`decide_request_auth`) and the auth level each real route
    of `http_server.app` declares, for every way a server can be keyed."""
    from sglang.srt.entrypoints import http_server
    from sglang.srt.utils.auth import AuthLevel, decide_request_auth

    from sglang_hooks import smoke

    levels = {getattr(r, "path", None): getattr(getattr(r, "endpoint", None), "_auth_level",
                                                 AuthLevel.NORMAL)
              for r in http_server.app.routes}
    admin, api = smoke.auth_headers(api_key, admin_key)
    for method, path, headers in (("POST", "/set_internal_state", admin),
                                  ("GET", "/server_info", api), ("POST", "/generate", api),
                                  ("GET", "/metrics", api)):
        level = levels.get(path, AuthLevel.NORMAL)
        decision = decide_request_auth(method=method, path=path,
                                       authorization_header=headers.get("Authorization"),
                                       api_key=api_key, admin_api_key=admin_key,
                                       auth_level=level)
        assert decision.allowed, (path, level, headers)
    assert levels["/set_internal_state"] == AuthLevel.ADMIN_OPTIONAL
