"""`specctl release`: hands a server back to SGLang's own choice (or strips its probes).

Against simulated servers over loopback HTTP (conftest's `sim_server`); the server without
the plugin is a small FastAPI app whose /server_info is SGLang's without the plugin's state.
"""

from __future__ import annotations

import importlib
import socket

import pytest
from fastapi import FastAPI
from test_daemon_http import Loopback
from typer.testing import CliRunner

from controller.cli import COMMAND_MODULES, app
from sglang_hooks.contract import PolicyTable, Tier, push_body

for _module in COMMAND_MODULES:  # register every command, as the console script does
    importlib.import_module(_module)

PROBING = PolicyTable.build(
    [Tier(1, 3, explore_share=0.05, explore_depths=(1,)), Tier(16, 3), Tier(48, 1, hysteresis=4)],
    version=12,
)


def _push(sim_server, table: PolicyTable) -> None:  # type: ignore[no-untyped-def]
    key = sim_server.server.admin_key
    auth = None if key is None else f"Bearer {key}"
    assert sim_server.server.set_internal_state(push_body(table), auth)[0] == 200


def _release(*args: str):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(app, ["release", *args], env={"SPECCTL_ADMIN_KEY": None})


@pytest.mark.parametrize("sim_server", [{"admin_key": "adm"}], indirect=True)
def test_release_hands_the_server_back_and_prints_before_and_now(sim_server) -> None:
    _push(sim_server, PROBING)
    result = _release("--url", sim_server.base_url, "--admin-key", "adm")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [
        f"before: {PROBING.label()} 1-47: d3 (probes) | 48+: d1 (source push)",
        "now:    released (SGLang's own choice) (source none)",
    ]
    assert sim_server.server.specctl_state()["table"] is None
    again = _release("--url", sim_server.base_url, "--admin-key", "adm")
    assert again.exit_code == 0
    assert again.output.splitlines()[-1] == "now:    unchanged: already released, nothing pushed"


@pytest.mark.parametrize("sim_server", [{"admin_key": "adm"}], indirect=True)
def test_keep_table_strips_the_probes_and_keeps_the_decisions(sim_server) -> None:
    _push(sim_server, PROBING)
    result = _release("--url", sim_server.base_url, "--keep-table", "--admin-key", "adm")
    assert result.exit_code == 0, result.output
    live = sim_server.server.specctl_state()["table"]
    stripped = PolicyTable.build([Tier(1, 3), Tier(48, 1, hysteresis=4)], version=13)
    assert live == stripped.to_json()
    now = f"now:    {stripped.label()} 1-47: d3 | 48+: d1 (source push)"
    assert result.output.splitlines()[-1] == now
    again = _release("--url", sim_server.base_url, "--keep-table", "--admin-key", "adm")
    unchanged = "now:    unchanged: the table has no probes, nothing pushed"
    assert again.output.splitlines()[-1] == unchanged


@pytest.mark.parametrize("sim_server", [{"admin_key": "adm"}], indirect=True)
def test_a_wrong_admin_key_is_one_line_and_exit_2(sim_server) -> None:
    _push(sim_server, PROBING)
    result = _release("--url", sim_server.base_url, "--admin-key", "wrong")
    assert result.exit_code == 2
    error = [ln for ln in result.output.splitlines() if ln.startswith("error:")]
    assert len(error) == 1 and "401 Unauthorized" in error[0], result.output
    assert sim_server.server.specctl_state()["table"] == PROBING.to_json()


def test_an_unreachable_url_is_one_line_and_exit_2() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = _release("--url", f"http://127.0.0.1:{port}")
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and "error: cannot reach" in result.output


def test_a_url_without_scheme_is_a_usage_error() -> None:
    result = _release("--url", "127.0.0.1:30000")
    assert result.exit_code == 2
    assert "--url" in result.output and "has no scheme" in result.output


def test_a_server_without_the_plugin_is_one_line_and_exit_2() -> None:
    plain = FastAPI()

    @plain.get("/server_info")
    async def server_info() -> dict[str, object]:
        return {"internal_states": [{"last_gen_throughput": 0.0}]}

    lb = Loopback(plain).start()
    try:
        result = _release("--url", lb.url)
    finally:
        lb.stop()
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and "plugin is not loaded" in result.output
