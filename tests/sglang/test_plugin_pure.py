"""Plugin parts that need no SGLang: launch command, policy file, counters, GPU timing, hook
safety, the smoke test's checks.

These run in the main venv (the smoke test against the simulator uses tests/conftest.py). The
GPU timer test uses a stand-in event (`_Event`) because no CUDA device exists here; it checks
the never-block contract. Other stand-ins are named in their tests' docstrings.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from sglang_hooks import launch, smoke
from sglang_hooks.contract import PolicyError
from sglang_hooks.counters import DepthCounters
from sglang_hooks.gpu_timer import CudaEventTimer, HostIntervalTimer
from sglang_hooks.policy_file import load_policy_file
from sglang_hooks.runtime import SchedulerRuntime

EAGLE = ["--model-path", "m", "--speculative-algorithm", "EAGLE3"]


def test_serve_adds_what_the_plugin_needs_and_keeps_user_flags(tmp_path: Path) -> None:
    argv, env, notes = launch.build_command(
        ["--model-path", "m", "--speculative-algorithm", "EAGLE3", "--port", "31000"],
        tmp_path / "cfg.json",
    )
    # SGLANG_PLUGINS unset: SGLang loads every installed plugin, specctl too; no plugin variable
    assert env == {}
    assert not any("SPECCTL_" in n for n in notes)
    assert "--speculative-adaptive" in argv and "--enable-metrics" in argv
    assert argv[argv.index("--speculative-adaptive-config") + 1] == str(tmp_path / "cfg.json")
    # SGLang would lower the cap to 48 with speculation: serve passes the plain server's cap
    assert argv[argv.index("--max-running-requests") + 1] == str(launch.PLAIN_REQUEST_CAP)
    assert any("added --max-running-requests 4096" in n and "48" in n for n in notes)
    argv, _, notes = launch.build_command([*EAGLE, "--max-running-requests=96"], Path("c.json"))
    assert argv.count("--max-running-requests") == 0 and "--max-running-requests=96" in argv
    assert not any("max-running-requests" in n for n in notes)
    assert launch.admin_url(["--port", "31000", "--host", "0.0.0.0"]) == "http://127.0.0.1:31000"
    with pytest.raises(ValueError, match="--speculative-algorithm"):
        launch.build_command(["--model-path", "m"], tmp_path / "cfg.json")


@pytest.mark.parametrize(
    ("current", "expected"),
    [(None, {}), ("", {}), (" , ", {}), ("other", {"SGLANG_PLUGINS": "other,specctl"}),
     ("a, specctl", {}), ("a,b", {"SGLANG_PLUGINS": "a,b,specctl"})],
)  # fmt: skip
def test_serve_appends_to_the_users_plugin_list(current: str | None,
                                                expected: dict[str, str]) -> None:
    user_env = {"SPECCTL_OFF_PATH": "sglang"}  # the user's own setting, inherited as it is
    if current is not None:
        user_env["SGLANG_PLUGINS"] = current
    _, env, notes = launch.build_command(EAGLE, Path("cfg.json"), current_env=user_env)
    assert env == expected
    assert not any("SPECCTL_" in n for n in notes)


@pytest.mark.parametrize(
    ("flags", "note"),
    [([], "set --cuda-graph-max-bs-decode"),
     (["--cuda-graph-max-bs-decode", "256"], None),
     (["--cuda-graph-max-bs-decode=256"], None),
     (["--cuda-graph-bs-decode", "1", "8", "64"], None),
     (["--cuda-graph-max-bs", "256"], "--cuda-graph-max-bs is a deprecated alias"),
     (["--cuda-graph-bs", "1", "8"], "use --cuda-graph-bs-decode")],
)  # fmt: skip
def test_serve_recommends_the_decode_graph_flag_sglang_still_accepts(
    flags: list[str], note: str | None
) -> None:
    _, _, notes = launch.build_command([*EAGLE, *flags], Path("cfg.json"))
    graph_notes = [n for n in notes if "cuda-graph" in n]
    if note is None:
        assert graph_notes == []
    else:
        [only] = graph_notes
        assert note in only


def test_serve_checks_the_initial_depth_is_captured() -> None:
    launch.check_num_steps([*EAGLE, "--speculative-num-steps", "3"], [0, 1, 3])
    launch.check_num_steps(EAGLE, [0, 1, 3])  # absent: SGLang picks a captured one
    with pytest.raises(ValueError, match=r"--speculative-num-steps 5 is not one of --depths "
                       r"\[0, 1, 3\].*add 5 to --depths"):
        launch.check_num_steps([*EAGLE, "--speculative-num-steps=5"], [3, 1, 0])
    with pytest.raises(ValueError, match="expected an integer"):
        launch.check_num_steps([*EAGLE, "--speculative-num-steps", "x"], [0])


def test_serve_command_refuses_an_uncaptured_initial_depth() -> None:
    from typer.testing import CliRunner

    import controller.cli.serve  # noqa: F401  (registers the command)
    from controller.cli import app

    bad = CliRunner().invoke(app, ["serve", "--dry-run", "--depths", "0,1,2", "--", *EAGLE,
                                   "--speculative-num-steps", "3"])
    assert bad.exit_code == 2
    assert "error: --speculative-num-steps 3 is not one of --depths [0, 1, 2]" in bad.output
    ok = CliRunner().invoke(app, ["serve", "--dry-run", "--depths", "0,1,3", "--", *EAGLE,
                                  "--speculative-num-steps", "3"])
    assert ok.exit_code == 0, ok.output


def test_serve_warns_that_every_node_needs_the_same_policy_file(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    import controller.cli.serve  # noqa: F401  (registers the command)
    from controller.cli import app
    from sglang_hooks.policy_file import table_fingerprint

    policy = tmp_path / "policy.yaml"
    policy.write_text("table:\n  version: 3\n  tiers: [{min_batch: 1, depth: 1}]\n")
    args = ["serve", "--dry-run", "--depths", "0,1", "--policy-file", str(policy), "--", *EAGLE]
    one = CliRunner().invoke(app, args)
    two = CliRunner().invoke(app, [*args, "--nnodes", "2", "--node-rank", "0"])
    assert one.exit_code == 0 and two.exit_code == 0, two.output
    fingerprint = table_fingerprint(load_policy_file(policy))
    assert fingerprint.startswith("v3/") and fingerprint in one.output
    assert "every node" not in one.output
    assert "copy the same file there on every node" in " ".join(two.output.split())


def test_adaptive_config_captures_every_depth_in_one_slot() -> None:
    assert launch.adaptive_config([3, 0, 1, 3]) == {"1": {"candidate_steps": [0, 1, 3]}}


def test_policy_file_reads_table_and_tolerates_provenance(tmp_path: Path) -> None:
    p = tmp_path / "policy.yaml"
    p.write_text("provenance: {learned_from: bench}\ntable:\n  version: 2\n  tiers:\n"
                 "    - {min_batch: 1, depth: 3}\n")
    assert load_policy_file(p).version == 2
    with pytest.raises(PolicyError, match="not captured"):
        load_policy_file(p, captured_depths={0, 1})
    p.write_text("tiers: []\n")
    with pytest.raises(PolicyError, match="table"):
        load_policy_file(p)
    with pytest.raises(PolicyError, match="cannot read"):
        load_policy_file(tmp_path / "missing.yaml")


def test_counters_bucket_and_drain_once() -> None:
    c = DepthCounters()
    c.record(3, 12, 40, 0.02, explore=True)
    c.record(3, 13, 41, 0.02, explore=False)
    c.record(0, 5000, 5000, 0.1, explore=False)
    out = c.drain()
    assert out[(3, 12)] == [2, 25, 81, 0.04, 1]
    assert (0, 1024) in out
    assert c.drain() == {} and c.totals[(3, 12)][0] == 2


class _Event:
    """Stand-in for torch.cuda.Event: completes when the test says so."""

    clock = 0.0

    def __init__(self) -> None:
        self.t: float | None = None
        self.done = False

    def record(self) -> None:
        self.t = _Event.clock

    def query(self) -> bool:
        return self.done

    def elapsed_time(self, other: _Event) -> float:
        assert self.done and other.done, "elapsed_time on an incomplete event would block"
        assert self.t is not None and other.t is not None
        return (other.t - self.t) * 1000.0


def test_cuda_timer_never_blocks_and_parks_unfinished_pairs() -> None:
    timer = CudaEventTimer(_Event, pool_size=1)
    rt = SchedulerRuntime(timer=timer)
    rt.activate({3}, None)
    token = timer.begin()
    _Event.clock = 0.25
    pair = timer.end(token)
    rt.record_result(3, 4, 10, (False, pair))  # end event not complete: parked, not read
    assert rt.parked and rt.counters.pending == {}
    pair[0].done = pair[1].done = True
    rt.record_result(3, 4, 10, None)  # next result: the parked pair is read now
    assert not rt.parked
    assert rt.counters.pending[(3, 4)][3] == pytest.approx(0.25)
    assert rt.unattributed_results == 1


def test_host_timer_ignores_idle_gaps() -> None:
    now = [0.0]
    timer = HostIntervalTimer(max_gap_s=1.0, clock=lambda: now[0])
    assert timer.seconds(None) == 0.0
    now[0] = 0.03
    assert timer.seconds(None) == pytest.approx(0.03)
    now[0] = 5.0
    assert timer.seconds(None) == 0.0


# ----------------------------------------------------------------------------- hook safety


class _FailingTimer(HostIntervalTimer):
    """A timer whose `fail` method raises, as a broken CUDA event pool would."""

    def __init__(self, fail: str) -> None:
        super().__init__()
        self.fail = fail

    def begin(self) -> object:
        if self.fail == "begin":
            raise RuntimeError("event pool broken")
        return "token"

    def discard(self, token: object) -> None:
        if self.fail == "discard":
            raise RuntimeError("event pool broken")


@pytest.mark.parametrize("fail", ["begin", "discard"])
def test_a_failing_launch_timer_never_stops_a_launch(
    fail: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Stand-in launch (`forward`): EAGLEWorkerV2 needs a GPU; only the hook's wrapping is
    under test. The depth choice runs inside the launch, as SGLang's worker calls it."""
    from types import SimpleNamespace

    from sglang_hooks import hooks

    rt = SchedulerRuntime(timer=_FailingTimer(fail))
    rt.activate({1, 3}, None)
    monkeypatch.setattr(hooks, "RUNTIME", rt)
    monkeypatch.setattr(hooks, "_failed", set())

    def forward(worker: object, batch: object, decode: bool) -> SimpleNamespace:
        if decode:
            rt.choose(4)
        return SimpleNamespace()

    for decode in (True, False, True, False):
        result = hooks.time_launch(forward, None, None, decode)
        # begin failed: the launch runs untimed (its result will count as unattributed)
        assert hasattr(result, "specctl_launch") == (decode and fail != "begin")
    assert rt.iteration == 2
    failures = [r for r in caplog.records if "hook time_launch failed" in r.getMessage()]
    assert len(failures) == 1


class _BrokenExporter:
    def __init__(self) -> None:
        self.calls = 0

    def export(self, runtime: SchedulerRuntime) -> None:
        self.calls += 1
        raise OSError(28, "No space left on device")


def test_a_failing_metrics_write_does_not_undo_a_table(caplog: pytest.LogCaptureFixture) -> None:
    """Stand-in exporter that fails like a full PROMETHEUS_MULTIPROC_DIR."""
    from sglang_hooks.contract import PolicyTable, Tier

    rt = SchedulerRuntime()
    rt.exporter = _BrokenExporter()
    rt.activate({1, 3}, None)
    table = PolicyTable.build([Tier(1, 3)], version=4)
    rt.commit(table)  # would raise into SGLang's request handler before
    assert rt.table == table and rt.report()["version"] == 4
    rt.record_result(3, 4, 10, (False, None), now=100.0)
    assert rt.exporter.calls == 3
    assert sum("per-depth metrics failed" in r.getMessage() for r in caplog.records) == 1


def test_repushing_the_same_tiers_keeps_hysteresis_and_draws() -> None:
    from sglang_hooks.contract import PolicyTable, Tier

    tiers = [Tier(1, 3, explore_share=0.5, explore_depths=(1, 2)), Tier(8, 1, hysteresis=3)]
    batches = [8, 7, 6, 5, 6, 2, 9, 6, 1, 3, 5, 7, 8]

    def run(repush_at: int | None) -> list[tuple[int, bool]]:
        rt = SchedulerRuntime()
        rt.activate({1, 2, 3}, None)
        rt.commit(PolicyTable.build(tiers, version=1))
        picks = []
        for i, bs in enumerate(batches):
            if i == repush_at:
                rt.commit(PolicyTable.build(tiers, version=2))
                assert rt.table is not None and rt.table.version == 2
            depth = rt.choose(bs)
            assert depth is not None
            picks.append((depth, rt.launch_explore))
        return picks

    assert run(repush_at=2) == run(repush_at=None)
    # Another table restarts from the plain reading: at batch 6, tier 0 (no memory of tier 1).
    rt = SchedulerRuntime()
    rt.activate({1, 2, 3}, None)
    rt.commit(PolicyTable.build(tiers, version=1))
    rt.choose(8)
    rt.commit(PolicyTable.build([tiers[0], Tier(8, 2, hysteresis=3)], version=2))
    assert rt.selector is not None and rt.selector.tier is None


# ----------------------------------------------------------------------------- smoke


def test_smoke_depth_check_tolerates_one_straggler_per_replica() -> None:
    ok, what = smoke.depth_check(3, {"1": 50, "3": 10}, {"1": 51, "3": 90}, stragglers=1)
    assert ok and "tolerated: 1 iteration(s) on other depths" in what
    ok, _ = smoke.depth_check(3, {"1": 50, "3": 10}, {"1": 52, "3": 90}, stragglers=1)
    assert not ok  # two iterations at depth 1 on a one-replica server: the push did not hold
    ok, what = smoke.depth_check(3, {"1": 50, "3": 10}, {"1": 50, "3": 90}, stragglers=1)
    assert ok and "tolerated" not in what
    ok, _ = smoke.depth_check(3, {"3": 10}, {"3": 10}, stragglers=1)
    assert not ok  # the forced depth itself must move


def test_smoke_load_backs_off_and_says_why() -> None:
    """httpx's MockTransport stands in for a server with --api-key that refuses the request
    (the back-off schedule is what is under test, and it must not wait for real)."""
    import httpx

    stop = threading.Event()
    statuses = iter([401, 401, 401, 200, 503])
    waits: list[float] = []

    def answer(request: httpx.Request) -> httpx.Response:
        status = next(statuses, None)
        if status is None:
            stop.set()
            status = 200
        return httpx.Response(status, json={})

    errors = smoke.LoadErrors()
    client = httpx.Client(base_url="http://server", transport=httpx.MockTransport(answer))
    smoke._load(client, stop, errors, wait=waits.append)
    assert waits == [0.5, 1.0, 2.0, 0.5]  # doubling, reset by a success
    assert errors.count == 4
    assert errors.last == "HTTP 503 from /generate"
    first = smoke.LoadErrors()
    first.add(httpx.HTTPStatusError("401", request=httpx.Request("POST", "http://s/generate"),
                                    response=httpx.Response(401)))
    assert first.last is not None and "--api-key" in first.last


def test_smoke_sends_each_route_its_key(sim_server_factory: Any,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Against the simulator (real HTTP; SGLang's auth rule, checked against SGLang's own code
    in test_real_admin.py). It has no /generate, so the load threads are replaced by a
    recorder of the key they would send; its background clients decode meanwhile."""
    sim = sim_server_factory(api_key="api", admin_key="admin", concurrency=4, speedup=50)
    sent: list[str | None] = []
    monkeypatch.setattr(smoke, "_load", lambda client, *rest: sent.append(
        client.headers.get("authorization")))
    code = smoke.main(["--url", sim.base_url, "--api-key", "api", "--admin-key", "admin",
                       "--concurrency", "2", "--seconds-per-depth", "0.5"])
    assert code == 0
    assert sent == ["Bearer api", "Bearer api"]
