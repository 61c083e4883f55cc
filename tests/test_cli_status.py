"""`specctl status` end to end: the served simulator under load, and the daemon's own metrics."""

from __future__ import annotations

import importlib
import json
import re

import httpx
import pytest
from typer.testing import CliRunner

from controller.cli import COMMAND_MODULES, app
from controller.daemon.own_metrics import DaemonMetrics
from sglang_hooks.contract import push_body, single_depth_table

for _module in COMMAND_MODULES:
    importlib.import_module(_module)


@pytest.mark.parametrize("sim_server", [{"concurrency": 8, "speedup": 100}], indirect=True)
def test_status_shows_the_live_table_and_recent_per_depth_activity(sim_server) -> None:
    url = sim_server.base_url
    httpx.post(f"{url}/set_internal_state", json=push_body(single_depth_table(1, version=4)))
    metrics = DaemonMetrics()
    metrics.scrapes.labels("sim").inc(3)
    metrics.pushes.labels("sim", "good").inc()
    metrics.target_up.labels("sim").set(1)
    port = metrics.serve("127.0.0.1", 0)
    result = CliRunner().invoke(
        app,
        ["status", "--url", url, "--window", "1", "--json",
         "--daemon-url", f"http://127.0.0.1:{port}"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    server = doc["servers"][0]
    assert server["table_text"] == "1+: d1" and server["source"] == "push"
    assert server["version"] == 4 and server["captured_depths"] == [0, 1, 2, 3, 4]
    [d1] = server["depths"]  # only the forced depth ran during the window
    assert d1["depth"] == 1 and d1["iterations"] > 0 and d1["iteration_share"] == 1.0
    assert 1.0 < d1["accept_length"] <= 2.0 and d1["decode_tok_per_s"] > 0
    assert doc["daemon"]["targets"]["sim"]["scrapes"] == 3
    assert doc["daemon"]["targets"]["sim"]["pushes[good]"] == 1
    # what depth 0 runs there: the Kimi profile runs SGLang's own (the draft extend)
    assert server["off_path"] == {"path": "sglang", "features": []}
    assert server["off_path_text"] == "SGLang's own (SPECCTL_OFF_PATH=sglang)"

    panel = CliRunner().invoke(app, ["status", "--url", url, "--window", "0.5"])
    assert panel.exit_code == 0
    assert "1+: d1" in panel.output and "decode tok/s" in panel.output
    assert "depth 0    SGLang's own" in panel.output


@pytest.mark.parametrize("sim_server", [{"profile": "h200-sglang-llama8b-seeded"}], indirect=True)
def test_status_says_which_pieces_of_the_off_path_run(sim_server) -> None:
    result = CliRunner().invoke(app, ["status", "--url", sim_server.base_url, "--window", "0.5"])
    assert result.exit_code == 0, result.output
    assert "depth 0    specctl: plain-decode, skip-draft-prefill, skip-extend" in result.output


def test_status_names_an_unreachable_server_and_exits_1() -> None:
    result = CliRunner().invoke(app, ["status", "--url", "http://127.0.0.1:9", "--window", "0.5"])
    assert result.exit_code == 1
    assert "cannot reach http://127.0.0.1:9" in " ".join(result.output.split())


@pytest.mark.parametrize("sim_server", [{"speedup": 50}], indirect=True)
def test_an_idle_server_reads_idle_not_its_old_gauges(sim_server) -> None:
    result = CliRunner().invoke(app, ["status", "--url", sim_server.base_url, "--window", "0.5"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "now idle (no decode iterations in the last" in text
    assert "running" not in text  # no gauge beside "idle"
    doc = CliRunner().invoke(app, ["status", "--url", sim_server.base_url, "--json"])
    [server] = json.loads(doc.stdout)["servers"]
    assert server["decoding"] is False and server["depths"] == []


@pytest.mark.parametrize("sim_server", [{"concurrency": 32, "speedup": 50}], indirect=True)
def test_a_server_that_stops_decoding_with_requests_running_is_called_stalled(
    sim_server,
) -> None:
    """The simulated clock is stopped with 32 requests running: nothing decodes any more and
    the gauges keep their last values, as on a scheduler that hangs (real HTTP throughout)."""
    url = sim_server.base_url
    busy = CliRunner().invoke(app, ["status", "--url", url, "--window", "0.5", "--json"])
    [server] = json.loads(busy.stdout)["servers"]
    assert server["decoding"] is True and server["running_requests"] > 0
    sim_server.served.clock.stop()
    stalled = CliRunner().invoke(app, ["status", "--url", url, "--window", "0.5", "--json"])
    [server] = json.loads(stalled.stdout)["servers"]
    assert server["decoding"] is False and server["running_requests"] > 0
    result = CliRunner().invoke(app, ["status", "--url", url, "--window", "0.5"])
    assert result.exit_code == 0, result.output
    line = " ".join("".join(ch for ch in result.output if ch not in "│╭╮╰╯─").split())
    # the window is the one measured: 0.5 s asked, a little more on a busy machine
    quiet = re.search(r"stalled\? no decode iterations in the last ([\d.]+) s, yet SGLang's "
                      r"gauges last read", line)
    assert quiet is not None, line
    assert 0.5 <= float(quiet.group(1)) < 5.0
    assert f"running {server['running_requests']:.0f}," in line and "idle" not in line


def test_the_off_path_line_reads_every_shape_a_server_reports() -> None:
    """A plugin not steering yet reports no path; an older plugin (or garbage) nothing."""
    from controller.bench.server_client import ServerState, _off_path

    def text(reported: object) -> str | None:
        state = ServerState(None, 0, (), "none", None, 1, off_path=_off_path(
            {"off_path": reported}))
        return state.describe_off_path()

    assert text({"path": None, "features": []}) == "not steering yet"
    assert text({"path": "specctl", "features": ["skip-extend"]}) == "specctl: skip-extend"
    for unreadable in (None, "specctl", {"path": 3, "features": []}, {"path": "specctl"}):
        assert text(unreadable) is None
