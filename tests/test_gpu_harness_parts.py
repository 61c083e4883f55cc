"""Parts of the GPU harness on CPU: greedy comparison, log windows and counts, trimming and
packing, process sessions, memory growth; real loopback HTTP against the simulator."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import httpx
import pytest

from benchmarks.gpu import memory, server_log, servers
from benchmarks.gpu.greedy import (
    GreedyPrompt,
    RunResult,
    compare,
    first_divergence,
    generate_ids,
    word_prompts,
)
from benchmarks.gpu.pack import MAX_LOG_BYTES, pack
from benchmarks.gpu.procs import pid_alive, session_pids, session_rss
from benchmarks.gpu.server_log import (
    RUNTIME_SWITCH,
    SGLANG_OWN_CHOICE,
    ControlMonitor,
    count_lines,
    trim_log,
)
from sglang_hooks.contract import push_body, single_depth_table


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 9, 3]) == 1
    assert first_divergence([1, 2, 3], [1, 2]) == 2
    assert first_divergence([], []) is None


def test_compare_counts_flips_per_prompt():
    prompts = [GreedyPrompt("a", input_ids=(1, 2)), GreedyPrompt("b", text="x")]
    ref = RunResult("plain", outputs=[[5, 6, 7], [8, 9]], pushes_during=[0, 0])
    got = RunResult("spec", outputs=[[5, 6, 7], [8, 4]], pushes_during=[3, 2])
    report = compare(ref, got, prompts)
    assert (report["identical"], report["flips"], report["first_divergences"]) == (1, 1, [1])
    assert report["pushes_during_requests"] == 5
    row = report["per_prompt"][1]
    assert row["reference_ids_from_divergence"] == [9] and row["ids_from_divergence"] == [4]
    assert prompts[0].body(4)["input_ids"] == [1, 2] and prompts[1].body(4)["text"] == "x"
    assert prompts[0].body(4)["sampling_params"] == {
        "temperature": 0, "max_new_tokens": 4, "ignore_eos": True}


def test_word_prompts_are_deterministic_token_ids():
    a, b = word_prompts(3, words=10), word_prompts(3, words=10)
    assert a == b and len({p.input_ids for p in a}) == 3
    assert all(p.length == 10 for p in a)


@pytest.mark.parametrize("sim_server", [{"speedup": 200}], indirect=True)
def test_sim_generate_answers_output_ids_independent_of_depth(sim_server):
    url = sim_server.base_url
    prompt, other = word_prompts(2, words=12)
    with httpx.Client(base_url=url, timeout=30) as client:
        first = generate_ids(client, prompt, 24)
        assert client.post("/set_internal_state",
                           json=push_body(single_depth_table(0, version=5))).json() == [True]
        assert generate_ids(client, prompt, 24) == first and len(first) == 24
        assert generate_ids(client, other, 24) != first
        text = client.post("/generate", json={"text": "hello", "sampling_params": {
            "max_new_tokens": 5}}).json()
        assert len(text["output_ids"]) == 5


def test_count_lines_inside_and_outside_windows(tmp_path):
    log = tmp_path / "spec.log"
    lines = [f"[t] {SGLANG_OWN_CHOICE}: steps 3 -> 2\n", f"[t] {RUNTIME_SWITCH}: 2 -> 0\n",
             "[t] Decode batch\n", f"[t] {RUNTIME_SWITCH}: 0 -> 3\n"]
    log.write_text("".join(lines))
    second = len(lines[0])
    third = second + len(lines[1])
    counts = count_lines(log, [[second, third], [third + len(lines[2]), log.stat().st_size]])
    assert counts[SGLANG_OWN_CHOICE] == {"total": 1, "under_table": 0}
    assert counts[RUNTIME_SWITCH] == {"total": 2, "under_table": 2}
    assert count_lines(tmp_path / "missing.log", [])[RUNTIME_SWITCH]["total"] == 0


@pytest.mark.parametrize("sim_server", [{"speedup": 50}], indirect=True)
def test_control_monitor_marks_only_log_written_while_a_table_is_live(sim_server, tmp_path):
    """The log is written by this test (the simulator logs no SGLang lines); the table state
    is the simulator's, read over HTTP as the monitor reads SGLang's."""
    log = tmp_path / "spec.log"
    log.write_text("start\n")
    url = sim_server.base_url
    monitor = ControlMonitor(url, log, interval_s=0.05).start()

    def write_for(seconds: float, text: str) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            with log.open("a") as fh:
                fh.write(text + "\n")
            time.sleep(0.02)

    with httpx.Client(base_url=url, timeout=10) as client:
        write_for(0.6, f"released {SGLANG_OWN_CHOICE}")
        client.post("/set_internal_state", json=push_body(single_depth_table(3, version=1)))
        time.sleep(0.2)
        write_for(0.6, f"held {RUNTIME_SWITCH}")
        client.post("/set_internal_state", json=push_body(None))
        time.sleep(0.2)
        write_for(0.6, f"released again {SGLANG_OWN_CHOICE}")
    windows = monitor.stop()
    assert windows and monitor.failed_polls == 0
    counts = count_lines(log, windows)
    assert counts[SGLANG_OWN_CHOICE]["under_table"] == 0
    assert counts[SGLANG_OWN_CHOICE]["total"] > 20
    # Lines written right around a push may fall outside a window, never the other way round.
    assert counts[RUNTIME_SWITCH]["under_table"] >= counts[RUNTIME_SWITCH]["total"] - 10 > 0


def test_trim_and_pack_keep_the_folder_small(tmp_path):
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    big = run / "logs" / "spec.log"
    with big.open("w") as fh:
        for i in range(60_000):
            fh.write(f"[2026-01-01 00:00:00] Decode batch. #running-req: {i % 128}, gen "
                     f"throughput (token/s): {i * 1.5:.2f}\n")
    assert big.stat().st_size > MAX_LOG_BYTES
    (run / "summary.md").write_text("# x\n")
    (run / "store.sqlite-wal").write_text("x")
    # Weights and prompt sets (the families beside the models, the draws) stay out; the
    # models' configs and other JSONL files (results) go in.
    seeded = run / "models" / "seeded"
    (seeded / "target").mkdir(parents=True)
    (seeded / "target" / "model-00001-of-00001.safetensors").write_bytes(b"w" * 1000)
    (seeded / "target" / "config.json").write_text("{}")
    drawn = '{"prompt": "' + "word " * 40 + '", "output_tokens": 99}\n'
    (seeded / "family_a.jsonl").write_text(drawn * 10)
    (run / "prompts").mkdir()
    (run / "prompts" / "draw_3.jsonl").write_text(drawn * 6_000)
    (run / "shapes" / "prompts").mkdir(parents=True)
    (run / "shapes" / "prompts" / "a.jsonl").write_text(drawn * 10)
    (run / "levels.jsonl").write_text(drawn)
    short = tmp_path / "short.log"
    info = trim_log(big, short, head=10, tail=20)
    text = short.read_text()
    assert info["left_out"] == 60_000 - 30 and "lines left out" in text
    assert "Decode batch. #running-req: #, gen throughput (token/s): #" in text
    packed = pack(run, tmp_path / "out" / "run.tar.gz")
    with tarfile.open(packed["path"]) as tar:
        names = tar.getnames()
        manifest = tar.extractfile("run/MANIFEST.txt").read().decode()  # type: ignore[union-attr]
    assert "run/logs/spec.log.trimmed" in names and "run/summary.md" in names
    assert "run/logs/spec.log" not in names and "run/store.sqlite-wal" not in names
    assert "logs/spec.log: 60000 lines" in manifest
    assert {"run/models/seeded/target/config.json", "run/levels.jsonl"} <= set(names)
    for left in ("models/seeded/family_a.jsonl", "prompts/draw_3.jsonl",
                 "shapes/prompts/a.jsonl"):
        assert f"run/{left}" not in names
        assert f"{left} (" in manifest and "a prompt set, remade from its seed" in manifest
    assert "run/models/seeded/target/model-00001-of-00001.safetensors" not in names
    assert "model-00001-of-00001.safetensors (1000 bytes; model weights)" in manifest
    assert packed["bytes"] < 200_000


def test_a_server_session_is_found_measured_and_stopped():
    # A stand-in server: a shell in its own session with a child, as SGLang has schedulers.
    proc = subprocess.Popen(["/bin/sh", "-c", "sleep 60 & sleep 60"], start_new_session=True)
    try:
        deadline = time.monotonic() + 5
        while len(session_pids(proc.pid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        members = session_pids(proc.pid)
        assert proc.pid in members and len(members) == 3
        rss = session_rss(proc.pid)
        assert set(rss) == members and all(b > 0 for _, b in rss.values())
        sample = memory.sample(proc.pid, "probe")
        assert sample.rss_mib is not None and sample.rss_mib > 0
        assert servers.stop(proc.pid, timeout_s=5) == "stopped"
        proc.wait(timeout=5)
        assert not any(pid_alive(p) for p in members)
        assert servers.stop(proc.pid) == "not running"
    finally:
        if proc.poll() is None:
            proc.kill()


def test_memory_growth_against_a_limit():
    samples = [memory.MemorySample(0, "a", 100.0, None, 10.0),
               memory.MemorySample(1, "b", 180.0, None, 12.0),
               memory.MemorySample(2, "c", 150.0, None, 11.0)]
    gpu = memory.growth(samples, "gpu_used_mib", 40.0)
    assert (gpu.grew, gpu.peak, gpu.ok) == (50.0, 180.0, False)
    assert memory.growth(samples, "rss_mib", 40.0).ok is True
    unmeasured = memory.growth(samples, "gpu_server_mib", 1.0)
    assert unmeasured.ok is None and "not measured" in unmeasured.describe()


def test_sim_launch_plan_matches_the_sglang_one_in_shape(tmp_path):
    from benchmarks.gpu.model_folders import TINY, build_dummy_folders

    models = build_dummy_folders(tmp_path, TINY)
    opts = servers.ServerOptions(backend="sglang", admin_key="k", spec_port=1, plain_port=2,
                                 extra_args=("--log-level", "info"), python=sys.executable)
    spec, plain = servers.plans(models, opts, tmp_path)
    assert spec.role == "spec" and "--speculative-draft-model-path" in spec.argv
    assert spec.argv[2:5] == ["controller.cli", "serve", "--depths"]
    assert "--mem-fraction-static" in spec.argv and "0.4" in spec.argv
    assert plain.argv[2] == "sglang.launch_server" and "0.6" in plain.argv
    assert not any(a.startswith("--speculative") for a in plain.argv)
    shared = [a for a in plain.argv[3:] if a not in ("0.6", "2")]
    assert all(a in spec.argv for a in shared)  # the same flags minus speculation
    assert "--load-format" in plain.argv and "--log-level" in plain.argv
    # The plain server is stock SGLang unless asked otherwise; the speculative one has its plugin.
    assert plain.env == servers.NO_PLUGINS and spec.env == {servers.OFF_PATH_ENV: "specctl"}
    assert plain.describe().startswith("SGLANG_PLUGINS=none ")
    assert spec.describe().startswith("SPECCTL_OFF_PATH=specctl /")
    with_plugin = servers.ServerOptions(backend="sglang", admin_key="k", spec_port=1,
                                        plain_port=2, plain_with_plugin=True)
    assert [p.env for p in servers.plans(models, with_plugin, tmp_path)] == [
        {servers.OFF_PATH_ENV: "specctl"}, {}]
    order = servers.plans(models, servers.ServerOptions(
        backend="sglang", admin_key="k", spec_port=1, plain_port=2, roles=("plain", "spec")),
        tmp_path)
    assert [p.role for p in order] == ["plain", "spec"] and "0.4" in order[0].argv
    alone = servers.plans(models, servers.ServerOptions(
        backend="sglang", admin_key="k", spec_port=1, plain_port=2, roles=("spec",),
        mem_fraction_first=0.85), tmp_path)
    assert [p.role for p in alone] == ["spec"] and "0.85" in alone[0].argv


def test_the_servers_start_up_settings_are_part_of_each_launch(tmp_path, monkeypatch):
    """SGLang's device timer (both servers) and the plugin's off path (the speculative one)
    are read from the environment at start-up: each launch carries the options' values, so
    that a start with another setting restarts a server instead of reusing it. The plain
    server runs without the plugin, so its launch does not carry the off path."""
    from benchmarks.gpu.model_folders import TINY, build_dummy_folders

    models = build_dummy_folders(tmp_path, TINY)
    monkeypatch.delenv(servers.DEVICE_TIMER_ENV, raising=False)
    opts = servers.ServerOptions(backend="sglang", admin_key="k", spec_port=1, plain_port=2)
    plain = {p.role: p.env for p in servers.plans(models, opts, tmp_path)}
    assert plain == {"spec": {servers.OFF_PATH_ENV: "specctl"}, "plain": servers.NO_PLUGINS}
    timed = servers.ServerOptions(backend="sglang", admin_key="k", spec_port=1, plain_port=2,
                                  device_timer=True, off_path="sglang")
    env = {p.role: p.env for p in servers.plans(models, timed, tmp_path)}
    assert env == {"spec": {servers.DEVICE_TIMER_ENV: "1", servers.OFF_PATH_ENV: "sglang"},
                   "plain": {**servers.NO_PLUGINS, servers.DEVICE_TIMER_ENV: "1"}}
    # an environment the harness runs in does not stand for the options
    monkeypatch.setenv(servers.DEVICE_TIMER_ENV, "1")
    assert {p.role: p.env for p in servers.plans(models, opts, tmp_path)} == plain


def test_sim_stand_ins_follow_the_device_timer_option(tmp_path):
    """SGLang times its forwards with --device-timer; the sim stand-ins of both servers then
    export the same counter, and take no environment settings."""
    from benchmarks.gpu.model_folders import TINY, build_dummy_folders

    models = build_dummy_folders(tmp_path, TINY)
    opts = servers.ServerOptions(backend="sim", admin_key="k", spec_port=1, plain_port=2)
    assert not any("--device-timer" in p.argv for p in servers.plans(models, opts, tmp_path))
    timed = servers.ServerOptions(backend="sim", admin_key="k", spec_port=1, plain_port=2,
                                  device_timer=True)
    plans = servers.plans(models, timed, tmp_path)
    assert all("--device-timer" in p.argv for p in plans)
    assert [p.env for p in plans] == [{}, servers.NO_PLUGINS]


def test_steps_that_need_only_the_speculative_server_run_without_the_plain_one(
    sim_server, tmp_path
):
    """The acceptance step and the daemon talk to the speculative server alone: a plain server
    that is down must stop the steps that compare against it, not these."""
    from benchmarks.gpu.context import Run, StepError
    from benchmarks.gpu.options import Options
    from benchmarks.gpu.state import RunState

    state = RunState(tmp_path)
    state.servers[servers.SPEC] = {"url": sim_server.base_url}
    state.servers[servers.PLAIN] = {"url": "http://127.0.0.1:9"}  # nothing listens there
    run = Run(Options(), state)
    run.require_servers(servers.SPEC)
    with pytest.raises(StepError, match="plain server"):
        run.require_servers()


def _prefill_line(new: int, cached: int, graph: bool) -> str:
    """One "Prefill batch" line as SGLang 0.5.17 logs it."""
    return (f"[2026-12-03 11:01:54] Prefill batch, #new-seq: 1, #new-token: {new}, "
            f"#cached-token: {cached}, token usage: 0.00, #running-req: 0, #queue-req: 0, "
            f"#pending-token: 0, cuda graph: {graph}, input throughput (token/s): 1.14\n")


PREFILL_LINES = "".join([
    _prefill_line(1, 31, False),
    "[2026-12-03 11:01:55] Decode batch, #running-req: 1, #token: 92, token usage: 0.00, "
    "cuda graph: True, gen throughput (token/s): 212.09, #queue-req: 0\n",
    _prefill_line(2, 30, True), _prefill_line(96, 0, True), _prefill_line(9000, 0, False),
])


def test_prefill_batches_are_counted_by_graph_and_one_token_eager_ones_apart(tmp_path, capsys):
    """Lines in the format SGLang 0.5.17 logs them (run 14's plain server): a decode line and
    a long eager prefill are not one-token eager prefills."""
    log = tmp_path / "plain.log"
    log.write_text(PREFILL_LINES)
    assert server_log.prefill_graph_counts(log) == {
        "graphed": 2, "eager": 2, "eager_one_token": 1}
    assert server_log.prefill_graph_counts(tmp_path / "missing.log") == {
        "graphed": 0, "eager": 0, "eager_one_token": 0}
    assert server_log.main([str(log)]) == 0
    assert "2 prefill batches on the CUDA graph, 2 eager (1 of them with one new token)" in (
        capsys.readouterr().out)
    assert server_log.main([str(tmp_path / "missing.log")]) == 2
    assert "no such log" in capsys.readouterr().err


def test_both_servers_capture_their_decode_graphs_at_the_same_batch_sizes(tmp_path):
    """SGLang's default lists differ between a speculative and a plain server; the harness
    gives both one list, unless the caller chose the decode graphs' sizes."""
    from benchmarks.gpu.model_folders import TINY, build_dummy_folders

    def sizes(argv: list[str]) -> list[int]:
        at = argv.index("--cuda-graph-bs-decode") + 1
        return [int(a) for a in argv[at:at + len(servers.SHARED_DECODE_GRAPH_BS)]]

    models = build_dummy_folders(tmp_path, TINY)
    opts = servers.ServerOptions(backend="sglang", admin_key="k", spec_port=1, plain_port=2)
    spec, plain = servers.plans(models, opts, tmp_path)
    assert sizes(spec.argv) == sizes(plain.argv) == list(servers.SHARED_DECODE_GRAPH_BS)
    assert max(servers.SHARED_DECODE_GRAPH_BS) == 128  # the runs' --cuda-graph-max-bs-decode
    for chosen in (("--cuda-graph-bs-decode", "1", "8"), ("--cuda-graph-max-bs-decode=256",),
                   ("--cuda-graph-config", "{}")):
        own = servers.ServerOptions(backend="sglang", admin_key="k", spec_port=1, plain_port=2,
                                    extra_args=chosen)
        for plan in servers.plans(models, own, tmp_path):
            assert plan.argv.count("--cuda-graph-bs-decode") == chosen.count(
                "--cuda-graph-bs-decode")


def test_both_servers_get_one_kv_pool_size_unless_the_caller_sets_one(tmp_path):
    """Each server sizes its KV pool from its share of GPU memory, so the two pools differ
    (the twenty-sixth run: 305,491 tokens against 265,545); the harness caps both at one size,
    unless the caller's arguments name their own."""
    from benchmarks.gpu.model_folders import TINY, build_dummy_folders

    models = build_dummy_folders(tmp_path, TINY)
    opts = servers.ServerOptions(backend="sglang", admin_key="k", spec_port=1, plain_port=2)
    for plan in servers.plans(models, opts, tmp_path):
        at = plan.argv.index("--max-total-tokens")
        assert plan.argv[at + 1] == str(servers.SHARED_KV_TOKENS), plan.role
        assert plan.argv.count("--max-total-tokens") == 1
    for own in (("--max-total-tokens", "100000"), ("--max-total-tokens=100000",)):
        mine = servers.ServerOptions(backend="sglang", admin_key="k", spec_port=1,
                                     plain_port=2, extra_args=own)
        for plan in servers.plans(models, mine, tmp_path):
            flags = [a for a in plan.argv if a.startswith("--max-total-tokens")]
            assert flags == [own[0]], plan.role
            assert str(servers.SHARED_KV_TOKENS) not in plan.argv


def test_start_warns_when_the_kv_pools_differ_and_names_the_cap_that_evens_them():
    """SGLang lowers a cap its memory share cannot hold, so on a smaller card the one cap
    leaves two pool sizes; the setup step's note names the smaller as the cap to pass."""
    from benchmarks.gpu.server_info import kv_pool_note

    even = {"spec": {"max_total_num_tokens": 65536}, "plain": {"max_total_num_tokens": 65536}}
    assert kv_pool_note(even) is None
    uneven = {"spec": {"max_total_num_tokens": 110_912},
              "plain": {"max_total_num_tokens": 83_204}}
    note = kv_pool_note(uneven)
    assert note is not None
    assert "spec 110,912" in note and "plain 83,204" in note
    assert "--max-total-tokens 83204" in note
    # a server that did not answer /server_info leaves nothing to compare
    assert kv_pool_note({"spec": {"error": "ConnectError"},
                         "plain": {"max_total_num_tokens": 1}}) is None


def test_the_plugins_depth_0_blocks_are_reported_as_the_plugin_gives_them():
    """Whatever /server_info's specctl state holds under off_path and plain_decode goes into
    the summary whole, fields the harness has never seen included; other plugin fields stay
    out, and a server without the plugin's block shows none."""
    from benchmarks.gpu import summary
    from benchmarks.gpu.server_info import plugin_state

    specctl = {"active": True, "inactive_reason": None, "captured_depths": [0, 1, 3],
               "source": "push", "off_path": {"path": "specctl", "new_field": [1, 2]},
               "plain_decode": {"launches": 7}, "skipped_draft_extends": 12}
    state = plugin_state(specctl)
    assert state == {"active": True, "inactive_reason": None, "captured_depths": [0, 1, 3],
                     "source": "push", "off_path": {"path": "specctl", "new_field": [1, 2]},
                     "plain_decode": {"launches": 7}}
    assert plugin_state({"active": False}) == {"active": False}
    text = summary.markdown({"run_dir": "/tmp/run", "steps": {}, "server_info": {
        "spec": {"max_running_requests": 128, "specctl": state},
        "plain": {"max_running_requests": 128}}})
    assert '- spec: {"active": true, "captured_depths": [0, 1, 3], "inactive_reason": null, ' \
        '"off_path": {"new_field": [1, 2], "path": "specctl"}, "plain_decode": {"launches": ' \
        '7}, "source": "push"}' in text
    assert "- plain:" not in text and "| specctl |" not in text


@pytest.mark.slow
def test_a_background_harness_command_is_waited_on_and_packed(tmp_path):
    """benchmarks/gpu/staging/background.sh as a GPU session runs it, on two `specctl sim
    serve` stand-ins: `start` returns while the command may still run, `wait` packs its end."""
    from ports import free_ports

    run_dir, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    spec, plain = free_ports(2)
    env = {**os.environ, "OUT": str(out),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    script = ["bash", "benchmarks/gpu/staging/background.sh"]
    args = ["setup", "summary", "stop", "--run-dir", str(run_dir), "--tiny", "--backend", "sim",
            "--sim-speedup", "20", "--spec-port", str(spec), "--plain-port", str(plain)]
    started = subprocess.run([*script, "start", "0", "--", *args], env=env, text=True,
                             capture_output=True, timeout=60)  # fmt: skip
    assert started.returncode == 0, started.stderr
    assert "background: " in started.stdout and (out / "run.tar.gz").is_file()
    waited = subprocess.run([*script, "wait", "120", str(run_dir)], env=env, text=True,
                            capture_output=True, timeout=180)  # fmt: skip
    assert waited.stdout.rstrip().endswith("background: done"), waited.stdout[-2000:]
    assert "== step stop: ok" in (out / "background.log").read_text()
    with tarfile.open(out / "run.tar.gz") as tar:
        assert "run/summary.md" in tar.getnames()
    bad = subprocess.run([*script, "start", "0", "--", "setup"], env=env, text=True,
                         capture_output=True, timeout=30)  # fmt: skip
    assert bad.returncode == 2 and "give --run-dir DIR" in bad.stdout


def test_a_shape_run_starts_its_speculative_server_through_serve_shapes(tmp_path):
    """--spec-shapes: the speculative server's launch goes through `specctl serve --shapes`,
    which (run here with --dry-run, the real CLI) starts SGLang at the dominating tree without
    adaptive mode and hands the list to the plugin; the harness refuses a list serve would."""
    from benchmarks.gpu.model_folders import TINY, build_dummy_folders
    from benchmarks.gpu.options import OptionError, Options, validate

    models = build_dummy_folders(tmp_path, TINY)
    opts = servers.ServerOptions(backend="sglang", admin_key="k", spec_port=1, plain_port=2,
                                 python=sys.executable, shapes="3x4x16,3x1x4")
    spec, plain = servers.plans(models, opts, tmp_path)
    assert spec.argv[2:6] == ["controller.cli", "serve", "--shapes", "3x4x16,3x1x4"]
    assert "--speculative-eagle-topk" not in spec.argv
    assert not any(a.startswith("--speculative") for a in plain.argv)
    at = spec.argv.index("serve") + 1
    dry = subprocess.run([*spec.argv[:at], "--dry-run", *spec.argv[at:]], capture_output=True,
                         text=True, timeout=60, check=False)
    assert dry.returncode == 0, dry.stderr
    [line] = [ln for ln in dry.stdout.splitlines() if "sglang.launch_server" in ln]
    assert line.startswith("SPECCTL_SHAPES=3x4x16,3x1x4 ")
    assert "--speculative-eagle-topk 4 --speculative-num-draft-tokens 16" in line
    assert "--speculative-adaptive" not in line
    for value, words in (("plain,3x1x4", "--spec-shapes: shapes plain,3x1x4 are chains only"),
                         ("3x1x4", "--spec-shapes: shapes 3x1x4 are chains only")):
        with pytest.raises(OptionError, match=re.escape(words)):
            validate(Options(spec_shapes=value))
    # plain beside a tree is off on the shape server: static:0 holds it, and needs it listed
    validate(Options(spec_shapes="3x4x16,3x1x4,plain", trace_policies="static:0 static:3"))
    with pytest.raises(OptionError, match=re.escape("static:0 needs plain in --spec-shapes")):
        validate(Options(spec_shapes="3x4x16,3x1x4", trace_policies="static:0"))
    # a kept treeswitch server is the trace's: its shapes are those the policies are checked on
    kept = {"switch_keep_server": True, "switch_reference": "r.json", "switch_bench_shapes": ""}
    validate(Options(spec_shapes="3x1x4,plain,3x4x16", switch_shapes="3x4x16,3x1x4,plain",
                     **kept))
    with pytest.raises(OptionError, match=re.escape("--spec-shapes 3x4x16,3x1x4,plain must")):
        validate(Options(spec_shapes="3x4x16,3x1x4,plain", **kept))
    # the stand-in: a simulated shape server, the list passed as it is
    validate(Options(spec_shapes="3x4x16,3x1x4", backend="sim"))
    sim = servers.ServerOptions(backend="sim", admin_key="k", spec_port=1, plain_port=2,
                                python=sys.executable, shapes="3x4x16,3x1x4")
    spec, plain = servers.plans(None, sim, tmp_path)
    assert spec.argv[-2:] == ["--shapes", "3x4x16,3x1x4"] and "--shapes" not in plain.argv
