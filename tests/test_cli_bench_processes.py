"""`specctl bench --client-processes N` and the client-bound flag, over loopback against the
served simulator: a level split across worker processes counts every request the server served
as one process does; levels whose client ran at the client-bound share are flagged, explained
and left out. The simulator serves from the test's own process, so
the one-process client's CPU share counts the server's work too (another reason to split)."""

from __future__ import annotations

import asyncio
import csv
import importlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from controller.bench.load_processes import LoadProcesses, merge, peak_in_flight, split_shape
from controller.bench.loadgen import (
    ClosedLoop,
    LevelLoad,
    OpenLoop,
    RequestResult,
    ShareLoad,
    StopRule,
    make_client,
    run_level,
)
from controller.bench.metrics import parse_scrape
from controller.bench.prompts import synthetic_prompts
from controller.bench.report import suggested_processes
from controller.cli import COMMAND_MODULES, app
from sglang_hooks.contract import read_server_state

for _module in COMMAND_MODULES:
    importlib.import_module(_module)

KEY = "processes-key"
OUTPUT_TOKENS = 64


def flat(text: str) -> str:
    return " ".join(text.split())


def rows_of(out: Path) -> dict[tuple[str, str], dict[str, str]]:
    return {(r["series"], r["concurrency"]): r for r in csv.DictReader((out / "bench.csv").open())}


def busy(url: str) -> float:
    gauges = parse_scrape(httpx.get(f"{url}/metrics", timeout=5).text).gauges
    return gauges["sglang:num_running_reqs"] + gauges.get("sglang:num_queue_reqs", 0.0)


def wait_idle(url: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while busy(url) != 0:
        assert time.monotonic() < deadline, f"{url} still busy after {timeout_s} s"
        time.sleep(0.05)


def result(start: float, end: float, complete: bool = True) -> RequestResult:
    return RequestResult(start, end, 0.01, end, 4, complete)


# ----------------------------------------------------------------------------- the parts


def test_streams_caps_and_arrivals_are_dealt_evenly() -> None:
    assert [s.concurrency for s in split_shape(ClosedLoop(64), 3)] == [22, 21, 21]  # type: ignore[union-attr]
    capped = split_shape(OpenLoop(8.0, 0.5, max_concurrency=5), 2)
    assert [(s.rate, s.burstiness, s.max_concurrency) for s in capped] == [  # type: ignore[union-attr]
        (8.0, 0.5, 3), (8.0, 0.5, 2),
    ]  # fmt: skip
    assert [s.max_concurrency for s in split_shape(OpenLoop(8.0), 4)] == [None] * 4  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="2 streams for 3 processes"):
        split_shape(ClosedLoop(2), 3)


def test_shares_are_merged_on_one_clock() -> None:
    """Two shares whose windows opened 0.3 s apart on their own clocks: after the merge each
    request sits where it was relative to its share's window, and every count adds up."""
    # (Their own peaks are ignored: the merge counts open streams from the requests.)
    a = ShareLoad(window_start_s=1.0, elapsed_s=2.0, tokens=40, cpu_s=0.5, peak_in_flight=9,
                  started=3, requests=(result(0.2, 0.9), result(1.1, 2.5), result(2.6, 3.2, False)))
    b = ShareLoad(window_start_s=1.3, elapsed_s=2.0, tokens=60, cpu_s=0.7, peak_in_flight=9,
                  started=2, requests=(result(1.4, 2.0), result(1.9, 3.5, False)))  # fmt: skip
    load = merge(OpenLoop(4.0), [a, b], window_start_s=1.0, elapsed_s=2.0)
    assert isinstance(load, LevelLoad)
    assert load.tokens == 100 and load.client_cpu_s == pytest.approx(1.2)
    assert load.process_cpu_s == (0.5, 0.7)
    assert len(load.requests) == 5
    # b's requests moved 0.3 s earlier: (1.1, 1.7) and (1.6, 3.2), the second cut.
    assert sorted((round(r.start_s, 3), round(r.end_s, 3)) for r in load.completed) == [
        (1.1, 1.7), (1.1, 2.5),
    ]  # fmt: skip
    assert load.concurrency == 3  # at 1.6: a's (1.1, 2.5) and both of b's
    assert load.output_tok_per_s == pytest.approx(50.0)


def test_peak_in_flight_counts_overlaps_inside_the_window_only() -> None:
    requests = [result(0.0, 1.5), result(0.5, 0.8), result(1.2, 2.0), result(2.5, 3.0)]
    assert peak_in_flight(requests, 1.0, 2.2) == 2  # open at 1.0: the first; then the third
    assert peak_in_flight(requests, 0.0, 3.0) == 2
    assert peak_in_flight(requests, 2.1, 2.4) == 0
    # An end and a start at the same instant are not both open.
    assert peak_in_flight([result(0.0, 1.0), result(1.0, 2.0)], 0.5, 1.5) == 1


def test_the_suggested_process_count_leaves_room_and_fits_the_machine() -> None:
    assert suggested_processes(0.95, 1, 0.7, cores=16) == 3  # each under 0.35 of a core
    assert suggested_processes(0.72, 1, 0.7, cores=16) == 3
    assert suggested_processes(0.75, 2, 0.7, cores=16) == 3  # one more than now at least
    assert suggested_processes(0.95, 1, 0.7, cores=2) == 2  # no more than the cores
    assert suggested_processes(1.8, 2, 0.7, cores=2) == 3  # unless that is not even one more


# ----------------------------------------------------------------------------- over loopback


def _one_process(url: str, shape: ClosedLoop | OpenLoop, stop: StopRule, seed: int) -> LevelLoad:
    prompts = synthetic_prompts(512, 32, OUTPUT_TOKENS)

    async def go() -> LevelLoad:
        async with make_client(url, 16) as http:
            return await run_level(http, prompts, shape, stop, seed=seed)

    return asyncio.run(go())


@pytest.mark.parametrize("sim_server", [{"speedup": 5}], indirect=True)
def test_two_processes_count_every_request_the_server_served(sim_server) -> None:
    url, server = sim_server.base_url, sim_server.server
    prompts = synthetic_prompts(512, 32, OUTPUT_TOKENS)
    shape, stop = ClosedLoop(4), StopRule(duration_s=2.0, warmup_s=0.5)
    with LoadProcesses(2, prompts) as processes:
        started = processes.start()  # both workers up before the first level, as a trace needs
        assert len(started) == 2 and os.getpid() not in started
        before = server.stats()
        load, next_offset = asyncio.run(processes.run_level(url, shape, stop, prompt_offset=7))
        wait_idle(url)
        after = server.stats()
        # The next level on the same processes: the window's count ends it this time.
        counted, _ = asyncio.run(
            processes.run_level(url, shape, StopRule(requests=6, warmup_s=0.2))
        )
    served = after.completed_requests - before.completed_requests
    reached = after.submitted_requests - before.submitted_requests
    complete = [r for r in load.requests if r.complete]
    cut = [r for r in load.requests if not r.complete and r.error is None]
    assert not [r for r in load.requests if r.error is not None]
    assert len(load.process_cpu_s) == 2 and all(cpu > 0 for cpu in load.process_cpu_s)
    # Each of the 4 streams had at most one request open at the cut; every request the server
    # finished was read to its end, except those it finished as the client cut them.
    assert len(cut) <= 4
    assert len(complete) <= served <= len(complete) + len(cut)
    assert len(load.requests) - len(cut) <= reached <= len(load.requests)
    assert all(r.output_tokens == OUTPUT_TOKENS for r in complete)
    assert len(load.completed) >= 8 and load.concurrency == 4
    assert all(r.start_s >= load.warmup_s for r in load.completed)
    # The warm-up and the window as asked; their ends slip on a loaded machine (up to 0.8 s
    # seen beside a full test run), so only a gross overrun fails.
    assert 0.4 <= load.warmup_s <= 1.5
    assert 2.0 <= load.elapsed_s <= 3.0
    # Prompts: past every one either process sent (they take every other one).
    assert next_offset >= 7 + len(load.requests) and next_offset % 2 == 1
    assert 6 <= len(counted.completed) <= 6 + 3  # the other streams' last chunk may race it


@pytest.mark.parametrize("sim_server", [{"speedup": 5}], indirect=True)
def test_split_arrivals_are_the_arrivals_of_one_process(sim_server) -> None:
    """The same seed gives the same arrival schedule: two processes dealing it send about as
    many requests in the same window as one process does (each sending all would double it).
    Not exactly as many: arrivals at either edge of the window, and on a two-core machine
    the processes' start-up delays the schedule (33 sent against 28 in one run here, 7 apart
    in another), so the counts are held to a ratio half-way to the doubling this catches."""
    url = sim_server.base_url
    shape, stop = OpenLoop(rate=12.0, burstiness=0.5), StopRule(duration_s=2.0, warmup_s=0.3)
    one = _one_process(url, shape, stop, seed=11)
    wait_idle(url)
    with LoadProcesses(2, synthetic_prompts(512, 32, OUTPUT_TOKENS)) as processes:
        two, _ = asyncio.run(processes.run_level(url, shape, stop, seed=11))
    sent_one = [r for r in one.requests if r.start_s < one.warmup_s + one.elapsed_s]
    sent_two = [r for r in two.requests if r.start_s < two.warmup_s + two.elapsed_s]
    assert len(sent_one) >= 10
    assert 0.6 * len(sent_one) <= len(sent_two) <= 1.5 * len(sent_one)


def test_the_split_sweep_counts_what_the_server_served(sim_server_factory, tmp_path):  # type: ignore[no-untyped-def]
    """The same sweep with one and with two client processes, without warm-up: in both, the
    bench counts at most what each server finished during the sweep, and of what the server
    finished beyond the one-stream level's requests (that level, too small to split, runs in
    the bench's own process) at least 0.7. Losing one process's share of the split levels would
    count at most half. The rest are requests finished outside the window: at its cut, and in
    a split level before the later process started (measured beside three busy processes on
    two cores: 0.95-0.97 counted in one process, 0.89-0.93 in two). Held to the server's own
    count, not to the other sweep's tok/s: the simulated servers run on the wall clock in this
    test's process, and on a busy two-core machine the plain server's 4-stream level read 392
    tok/s in one sweep and 775 in the other."""
    servers = {"d3": sim_server_factory(admin_key=KEY, speedup=5),
               "no-spec": sim_server_factory(speedup=5, speculative=False)}  # fmt: skip
    levels = (1, 2, 4)
    args = ["bench", "--url", servers["d3"].base_url, "--admin-key", KEY, "--depths", "3",
            "--concurrency", ",".join(map(str, levels)), "--no-spec-url",
            servers["no-spec"].base_url, "--duration-per-level", "4", "--warmup-per-level", "0",
            "--output-tokens", str(OUTPUT_TOKENS), "--prompt-tokens", "32"]  # fmt: skip
    runner = CliRunner()
    rows: dict[str, dict[tuple[str, str], dict[str, str]]] = {}
    for run, extra in (("one", []), ("two", ["--client-processes", "2"])):
        before = {name: sim.server.stats().completed_requests for name, sim in servers.items()}
        res = runner.invoke(app, [*args, *extra, "--out", str(tmp_path / run)])
        assert res.exit_code == 0, res.output
        rows[run] = rows_of(tmp_path / run)
        for name, sim in servers.items():
            served = sim.server.stats().completed_requests - before[name]
            counted = sum(int(r["requests"]) for (s, _), r in rows[run].items() if s == name)
            alone = int(rows[run][(name, "1")]["requests"])
            assert counted <= served, (run, name, counted, served)
            assert counted - alone >= 0.7 * (served - alone), (run, name, counted, served, alone)
        if run == "two":
            assert "load split across 2 client processes" in flat(res.output)
    a, b = rows["one"], rows["two"]
    assert list(a) == list(b) == [(s, c) for s in ("d3", "no-spec") for c in ("1", "2", "4")]
    for key in a:
        split = "1" if key[1] == "1" else "2"
        assert a[key]["client_processes"] == "1" and b[key]["client_processes"] == split
        assert int(b[key]["errors"]) == 0 and int(b[key]["requests"]) >= 5
        # The busiest process carries about half of two processes' CPU time: at least half,
        # up to the CSV's rounding of both figures to 3 decimals.
        share = float(b[key]["client_cpu_share"])
        if split == "2":
            assert share / 2 - 0.001 <= float(b[key]["client_process_cpu_share"]) < share
    report = json.loads((tmp_path / "two" / "bench.json").read_text())
    assert report["client_processes"] == 2 and report["client_bound_share"] == 0.7


@pytest.mark.parametrize("sim_server", [{"admin_key": KEY, "speedup": 20}], indirect=True)
def test_client_bound_levels_are_flagged_named_and_left_out(sim_server, tmp_path: Path) -> None:
    """A threshold every level's client exceeds flags them all: the `left out` column, the
    per-level line, one hint naming levels, shares and the fix, bench.json, no recommendation."""
    out = tmp_path / "bench"
    res = CliRunner().invoke(
        app,
        ["bench", "--url", sim_server.base_url, "--admin-key", KEY, "--depths", "1,3",
         "--concurrency", "2", "--requests-per-level", "5", "--warmup-per-level", "0.2",
         "--output-tokens", "32", "--prompt-tokens", "32", "--client-processes", "2",
         "--client-bound-share", "0.001", "--out", str(out)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    text = flat(res.output)
    assert "client-bound: its busiest load process used" in text  # the per-level line
    hint = next(line for line in res.output.splitlines() if "client-bound: the busiest" in line)
    assert "the busiest of the load generator's 2 processes used" in hint
    assert "at d1 c=2" in hint and "at d3 c=2" in hint and "(at or above 0.001)" in hint
    assert "left out of the recommendation; rerun with --client-processes " in hint
    rows = rows_of(out)
    shares = [float(rows[k]["client_process_cpu_share"]) for k in (("d1", "2"), ("d3", "2"))]
    assert all(s >= 0.001 for s in shares)
    # The hint prints the raw share to 2 decimals, the CSV keeps 3: compare within that rounding.
    shown = re.search(r"used (\d+\.\d\d) of a core at d1 c=2", hint)
    assert shown is not None and abs(float(shown.group(1)) - shares[0]) <= 0.0051
    assert all(r["client_bound"] == "True" for r in rows.values())
    levels_table = res.output.split("latency (ms)")[0]  # not the latency table's rows
    table_rows = [row for row in map(str.split, levels_table.splitlines()) if row[:2] in (
        ["d1", "2"], ["d3", "2"])]  # fmt: skip
    assert [row[-1] for row in table_rows] == ["client-bound", "client-bound"]
    report = json.loads((out / "bench.json").read_text())
    assert report["flagged_levels"] == [
        {"series": "d1", "level": 2, "flags": ["client-bound"]},
        {"series": "d3", "level": 2, "flags": ["client-bound"]},
    ]
    assert report["client_bound_share"] == 0.001
    assert report["recommended_table"] is None and report["recommendation"] is None
    assert "recommended table" not in text


@pytest.mark.parametrize("sim_server", [{"admin_key": KEY, "speedup": 20}], indirect=True)
def test_the_default_threshold_flags_nothing_on_a_slow_server(sim_server, tmp_path) -> None:  # type: ignore[no-untyped-def]
    res = CliRunner().invoke(
        app,
        ["bench", "--url", sim_server.base_url, "--admin-key", KEY, "--depths", "3",
         "--concurrency", "2", "--requests-per-level", "5", "--output-tokens", "32",
         "--prompt-tokens", "32", "--client-processes", "2", "--out", str(tmp_path)],
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    (row,) = rows_of(tmp_path).values()
    assert float(row["client_process_cpu_share"]) < 0.7 and row["client_bound"] == "False"
    assert "client-bound" not in res.output and "recommended table" in flat(res.output)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")  # a zombie has exited, only its parent has not reaped it


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == pid:
                out.append(int(entry.name))
    return out


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
@pytest.mark.parametrize("sim_server", [{"admin_key": KEY, "speedup": 5}], indirect=True)
@pytest.mark.parametrize("how", ["ctrl-c", "sigkill"])
def test_no_load_outlives_the_sweep(sim_server, tmp_path: Path, how: str) -> None:
    """Ctrl-C on a terminal reaches the whole process group (the workers ignore it, the sweep
    ends them and restores the table); SIGKILL leaves the workers to notice on their own."""
    url = sim_server.base_url
    proc = subprocess.Popen(
        [sys.executable, "-m", "controller.cli", "bench", "--url", url, "--admin-key", KEY,
         "--depths", "1", "--concurrency", "4", "--duration-per-level", "30",
         "--output-tokens", "4000", "--client-processes", "2", "--out", str(tmp_path / "b")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        env={**os.environ, "COLUMNS": "200"},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while busy(url) < 4:  # both processes' streams are on the server
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        workers = _children(proc.pid)
        assert len([w for w in workers if _alive(w)]) >= 2
        if how == "ctrl-c":
            os.killpg(proc.pid, signal.SIGINT)
            output, _ = proc.communicate(timeout=30)
            assert proc.returncode == 130, output
            state = read_server_state(httpx.get(f"{url}/server_info", timeout=5).json())[0]
            assert state["source"] == "none"  # the forced depth was taken back
        else:
            proc.kill()
            proc.communicate(timeout=10)
        wait_idle(url, timeout_s=10)  # the workers closed their streams
        submitted = sim_server.server.stats().submitted_requests
        time.sleep(1.0)
        assert sim_server.server.stats().submitted_requests == submitted  # and send no more
        deadline = time.monotonic() + 10
        while any(_alive(w) for w in workers):
            assert time.monotonic() < deadline, "a load-generator process outlived the sweep"
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            proc.kill()
