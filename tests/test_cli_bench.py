"""`specctl bench` end to end over loopback against the served simulator (`sim_server`)."""

from __future__ import annotations

import csv
import importlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from typer.testing import CliRunner

from controller.bench.server_client import ServerClient, ServerError
from controller.cli import COMMAND_MODULES, app
from sglang_hooks.contract import parse_table, push_body, read_server_state

for _module in COMMAND_MODULES:
    importlib.import_module(_module)

KEY = "bench-key"
# A table that is not a single depth, so that restoring it is visible.
BEFORE = parse_table(
    {"version": 5, "tiers": [{"min_batch": 1, "depth": 3}, {"min_batch": 16, "depth": 0}]}
)
FAST = ["--requests-per-level", "6", "--output-tokens", "12", "--prompt-tokens", "32"]


def flat(text: str) -> str:
    return " ".join(text.split())  # rich wraps long lines at the terminal width


def state_of(url: str) -> dict:
    return read_server_state(httpx.get(f"{url}/server_info", timeout=5).json())[0]


def push_before(url: str) -> None:
    resp = httpx.post(
        f"{url}/set_internal_state",
        json=push_body(BEFORE),
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=5,
    )
    assert resp.json() == [True]


def sweep_two_servers(factory, out: Path, speedup: float = 50, **options: object):
    """Two simulators and a `bench` of depths 0 and 3 and the plain twin at 1 and 4 streams:
    (spec, nospec, run), where run() invokes the bench (after whatever the test sets up).

    Slower clocks and longer replies than FAST alone: requests must outlast the client's own
    turnaround, or a busy machine's client never keeps 4 streams in flight. The simulators
    serve from this process, whose CPU share the client-bound flag reads: a busy machine would
    flag every level and leave nothing to recommend from (the flag has its own tests in
    test_cli_bench_processes.py)."""
    spec = factory(admin_key=KEY, speedup=speedup, **options)
    nospec = factory(speedup=speedup, speculative=False, **options)
    return spec, nospec, lambda: CliRunner().invoke(
        app,
        ["bench", "--url", spec.base_url, "--admin-key", KEY, "--depths", "0,3",
         "--concurrency", "1,4", "--no-spec-url", nospec.base_url, "--out", str(out), *FAST,
         "--output-tokens", "48", "--client-bound-share", "100"],
    )  # fmt: skip


def one_level_bench(url: str, out: Path):
    """`bench` of depth 0 at one stream, no plain twin, no other option."""
    return CliRunner().invoke(
        app,
        ["bench", "--url", url, "--admin-key", KEY, "--depths", "0", "--concurrency", "1",
         "--out", str(out), *FAST, "--client-bound-share", "100"],
    )  # fmt: skip


def test_short_sweep_measures_each_depth_restores_the_table_and_writes_reports(
    sim_server_factory, tmp_path: Path
) -> None:
    out = tmp_path / "bench"
    spec, _, run = sweep_two_servers(sim_server_factory, out)
    push_before(spec.base_url)
    result = run()
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader((out / "bench.csv").open()))
    assert [(r["series"], r["concurrency"]) for r in rows] == [
        ("d0", "1"), ("d0", "4"), ("d3", "1"), ("d3", "4"), ("no-spec", "1"), ("no-spec", "4"),
    ]  # fmt: skip
    for r in rows:
        assert float(r["output_tok_per_s"]) > 0 and int(r["requests"]) >= 6
        assert float(r["ttft_p50_ms"]) > 0 and float(r["tpot_p90_ms"]) >= float(r["tpot_p50_ms"])
        assert r["output_tokens_min"] == r["output_tokens_max"] == "48"  # EOS ignored
        # SGLang's pass counter, as the simulator exports it: decode iterations every level,
        # and at most a prefill per request admitted in the window (those that finished in it,
        # those still running at its end, those waiting at its start).
        admitted = int(r["requests"]) + 2 * int(r["concurrency"])
        assert int(r["decode_passes"]) > 0 and 0 < int(r["prefill_passes"]) <= admitted
    by = {(r["series"], r["concurrency"]): r for r in rows}
    # The server's own counters confirm the forced depth ran: no drafts at d0, drafts at d3.
    assert float(by["d0", "1"]["accept_length"]) == pytest.approx(1.0)
    assert float(by["d3", "1"]["accept_length"]) > 1.3
    assert float(by["d3", "4"]["mean_batch"]) > float(by["d3", "1"]["mean_batch"])
    report = json.loads((out / "bench.json").read_text())
    assert report["table_before"] == BEFORE.to_json() and report["recommended_table"]["tiers"]
    assert (out / "bench.png").stat().st_size > 10_000
    # The table that was live before the sweep is live again.
    after = state_of(spec.base_url)
    assert after["table"] == BEFORE.to_json() and after["version"] == BEFORE.version
    assert "server table restored: 1-15: d3 | 16+: off" in flat(result.output)


def test_freeze_gc_freezes_each_server_and_names_the_one_it_could_not(
    sim_server_factory, tmp_path: Path
) -> None:
    spec = sim_server_factory(admin_key=KEY, speedup=200)
    # The plain server has another admin key: its /freeze_gc refuses the bench's key.
    nospec = sim_server_factory(admin_key="other", speedup=200, speculative=False)
    out = tmp_path / "bench"
    result = CliRunner().invoke(
        app,
        ["bench", "--url", spec.base_url, "--admin-key", KEY, "--depths", "0",
         "--concurrency", "1", "--no-spec-url", nospec.base_url, "--out", str(out), *FAST,
         "--freeze-gc", "--client-bound-share", "100"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert (spec.server.gc_freezes, nospec.server.gc_freezes) == (1, 0)
    text = flat(result.output)
    assert f"froze the garbage collector of {spec.base_url}" in text
    assert "garbage collector not frozen" in text and "give the server's --admin-api-key" in text
    frozen = json.loads((out / "bench.json").read_text())["gc_frozen"]
    assert frozen["spec"] is True and "refused /freeze_gc (401)" in frozen["no_spec"]
    # without the option nothing is asked
    again = one_level_bench(spec.base_url, tmp_path / "b2")
    assert again.exit_code == 0, again.output
    assert spec.server.gc_freezes == 1
    assert json.loads((tmp_path / "b2" / "bench.json").read_text())["gc_frozen"] is None


def test_device_timer_and_request_gauges_give_each_level_its_gpu_split_and_batch(
    sim_server_factory, tmp_path: Path
) -> None:
    """Both servers export SGLang's device-timer counter (`--device-timer`); a third does not."""
    speedup = 50.0
    out = tmp_path / "bench"
    result = sweep_two_servers(sim_server_factory, out, speedup, device_timer=True)[2]()
    assert result.exit_code == 0, result.output
    assert "GPU prefill/decode" in flat(result.output)
    rows = list(csv.DictReader((out / "bench.csv").open()))
    assert len(rows) == 6
    for r in rows:
        # Simulated GPU seconds per wall second: at most the clock's speedup, prefill and
        # decode together (the simulated server runs one forward at a time).
        prefill, decode = float(r["gpu_prefill_busy"]), float(r["gpu_decode_busy"])
        assert prefill > 0 and decode > 0, r
        assert (prefill + decode) / speedup <= 1.1, r
        # SGLang's request gauges, read through the window: never more than was sent (often 0
        # here: a sped-up simulator finishes requests faster than the client sends them)
        running, queued = float(r["running_mean"]), float(r["queued_mean"])
        assert 0 <= running <= int(r["concurrency"]) and queued >= 0, r
    # the plain server has no plugin counters: its batch column is the gauge's mean, marked ~
    lines = result.output.splitlines()
    assert any(line.split()[:1] == ["no-spec"] and "~" in line for line in lines)

    plain = sim_server_factory(admin_key=KEY, speedup=speedup)
    again = one_level_bench(plain.base_url, tmp_path / "b2")
    assert again.exit_code == 0, again.output
    assert "GPU prefill/decode" not in flat(again.output)
    (row,) = csv.DictReader((tmp_path / "b2" / "bench.csv").open())
    assert row["gpu_prefill_busy"] == row["gpu_decode_busy"] == ""


@pytest.mark.parametrize("sim_server", [{"admin_key": KEY, "speedup": 200}], indirect=True)
def test_clear_errors_for_key_depth_and_url(sim_server, tmp_path: Path) -> None:
    url = sim_server.base_url
    runner = CliRunner()
    base = ["bench", "--url", url, "--concurrency", "1", "--out", str(tmp_path), *FAST]

    missing = runner.invoke(app, base, env={"SPECCTL_ADMIN_KEY": ""})
    assert missing.exit_code == 2
    assert (
        "401 Unauthorized (no admin key was given: pass --admin-key or set SPECCTL_ADMIN_KEY"
        in flat(missing.output)
    )
    wrong = runner.invoke(app, [*base, "--admin-key", "nope"])
    assert wrong.exit_code == 2 and "the key given was refused" in flat(wrong.output)

    depth = runner.invoke(app, [*base, "--admin-key", KEY, "--depths", "1,7"])
    assert depth.exit_code == 2
    assert "--depths 7: tiers[0].depth: depth 7 was not captured by the server" in flat(
        depth.output
    )
    unreachable = runner.invoke(app, [*base, "--url", "http://127.0.0.1:9", "--admin-key", KEY])
    assert unreachable.exit_code == 2
    assert "cannot reach http://127.0.0.1:9" in flat(unreachable.output)
    assert state_of(url)["source"] == "none"  # nothing was left behind
    assert not list(tmp_path.iterdir())  # and no report of a sweep that never ran
    # Forced depths skip nothing: the server is reached before the --out folder is made.
    folder = tmp_path / "never"
    forced = runner.invoke(app, ["bench", "--url", "http://127.0.0.1:9", "--admin-key", KEY,
                                 "--depths", "0", "--concurrency", "1", "--out", str(folder),
                                 *FAST])  # fmt: skip
    assert forced.exit_code == 2 and "cannot reach http://127.0.0.1:9" in flat(forced.output)
    assert not folder.exists()


@pytest.mark.parametrize("sim_server", [{"admin_key": KEY}], indirect=True)
def test_a_refused_push_reports_the_servers_field(sim_server) -> None:
    """The server's own 400 (not the client's pre-check) reaches the user with its field."""
    bad = parse_table({"tiers": [{"min_batch": 1, "depth": 9}]})
    with ServerClient(sim_server.base_url, KEY) as client, pytest.raises(ServerError) as err:
        client.push(bad)
    assert "specctl_t0_depth: depth 9 was not captured" in str(err.value)


def test_a_server_without_the_plugin_is_named(tmp_path: Path) -> None:
    """A plain FastAPI app stands in for SGLang without the plugin (no specctl state)."""
    plain = FastAPI()
    plain.get("/server_info")(lambda: {"internal_states": [{"last_gen_throughput": 0.0}]})
    config = uvicorn.Config(plain, host="127.0.0.1", port=0, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        result = CliRunner().invoke(
            app, ["bench", "--url", f"http://127.0.0.1:{port}", "--admin-key", "k", *FAST]
        )
    finally:
        server.should_exit = True
        thread.join(5)
    assert result.exit_code == 2
    assert "the specctl plugin is not loaded on this server" in flat(result.output)


@pytest.mark.parametrize("sim_server", [{"admin_key": KEY, "speedup": 20}], indirect=True)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupting_a_sweep_restores_the_table(sim_server, tmp_path: Path, sig) -> None:
    url = sim_server.base_url
    push_before(url)
    proc = subprocess.Popen(
        [sys.executable, "-m", "controller.cli", "bench", "--url", url, "--admin-key", KEY,
         "--depths", "1,3", "--concurrency", "2,4", "--duration-per-level", "30",
         "--out", str(tmp_path / "b")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    try:
        # A generous wait, not a speed check: on a loaded two-core machine the bench's start
        # (imports, its checks of the server) took over 20 s once.
        deadline = time.monotonic() + 90
        while state_of(url)["version"] == BEFORE.version:  # wait for the forced depth
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        time.sleep(0.5)  # mid-level, with streams in flight
        proc.send_signal(sig)
        output, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, output
    assert "interrupted" in output
    after = state_of(url)
    assert after["table"] == BEFORE.to_json() and after["version"] == BEFORE.version
