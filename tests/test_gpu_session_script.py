"""benchmarks/gpu/seeded/h200_session.sh run for real (bash and this Python) where no server
runs, or against a served simulator that refuses a push: every command of a step that fails
must be named and the step exit 1 rather than pack what it has and exit 0, so that a caller
chaining steps sees the loss."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu" / "seeded" / "h200_session.sh"


def _step(tmp_path: Path, step: str, **env: str) -> subprocess.CompletedProcess[str]:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    full_env = {
        **os.environ, "R": str(tmp_path / "run"), "PY": sys.executable,
        "PYTHONPATH": str(ROOT), **env,
    }
    return subprocess.run(
        ["bash", str(SCRIPT), step, str(out)], cwd=ROOT, env=full_env,
        capture_output=True, text=True, timeout=120,
    )


def test_a_step_whose_commands_fail_exits_1_and_names_each_failure(tmp_path: Path) -> None:
    done = _step(tmp_path, "hostwatch", WARM="0", HOST_STREAMS="4")
    assert done.returncode == 1, done.stdout + done.stderr
    failures = [line for line in done.stderr.splitlines()
                if line.startswith("h200_session.sh: failed (exit 1) at line ")]
    assert len(failures) == 2, done.stderr  # host_watch of depth 0, then of the plain server


def test_a_bad_setting_is_refused_before_any_work(tmp_path: Path) -> None:
    done = _step(tmp_path, "series", ORDER="sideways")
    assert done.returncode == 2
    assert "ORDER: expected alternate, spec-first or plain-first, got sideways" in done.stderr
    assert not (tmp_path / "run").exists()


def test_the_plain_decode_ab_needs_the_graphs_captured_at_start_up(tmp_path: Path) -> None:
    done = _step(tmp_path, "plainab", SPECCTL_PLAIN_DECODE="0")
    assert done.returncode == 2
    assert "plainab: start the spec server with SPECCTL_PLAIN_DECODE=1" in done.stderr
    assert not (tmp_path / "run").exists()


def test_a_later_plain_decode_ab_call_numbers_its_rounds_on(tmp_path: Path) -> None:
    """Round 1 is in the run folder: the next call's round is 2, an even one, so the path-off
    arm goes first. No server runs here, so every bench fails and the step exits 1."""
    for arm in ("on", "off"):
        (tmp_path / "run" / f"plainab_{arm}_1").mkdir(parents=True)
    done = _step(tmp_path, "plainab", SPECCTL_PLAIN_DECODE="1", WARM="0", AB_ROUNDS="1")
    assert done.returncode == 1, done.stdout + done.stderr
    rounds = [line.split(" ", 2)[2] for line in done.stdout.splitlines()
              if line.startswith("== ") and " round " in line]
    assert [r.split(":")[0] for r in rounds] == ["round 2", "round 2"]
    assert "path off" in rounds[0] and "path on" in rounds[1]


def test_a_tagged_plain_decode_ab_keeps_its_rounds_apart(tmp_path: Path) -> None:
    """With AB_TAG the untagged rounds in the run folder are not counted: the tagged set starts
    at round 1 (odd: the path-on arm first) and its verdict files carry the tag."""
    for arm in ("on", "off"):
        (tmp_path / "run" / f"plainab_{arm}_1").mkdir(parents=True)
    done = _step(tmp_path, "plainab", SPECCTL_PLAIN_DECODE="1", WARM="0", AB_ROUNDS="1",
                 AB_TAG="flush")  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    rounds = [line.split(" ", 2)[2] for line in done.stdout.splitlines()
              if line.startswith("== ") and " round " in line]
    assert [r.split(":")[0] for r in rounds] == ["round 1", "round 1"]
    assert "path on" in rounds[0] and "path off" in rounds[1]
    assert (tmp_path / "run" / "parity_plain_flush_on.txt").exists()


def test_a_one_arm_ab_on_another_key_benches_that_key_on_each_round(tmp_path: Path) -> None:
    """AB_KEY names the switch and AB_ARMS=on leaves out the off arm: two rounds, one bench
    each, both with the key on (the plain server first in the even round)."""
    (tmp_path / "run").mkdir()
    done = _step(tmp_path, "plainab", SPECCTL_PLAIN_DECODE="1", WARM="0", AB_ROUNDS="2",
                 AB_KEY="specctl_lean_host", AB_ARMS="on")  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    rounds = [line.split(" ", 2)[2] for line in done.stdout.splitlines()
              if line.startswith("== ") and " round " in line]
    assert [r.split(":")[0] for r in rounds] == ["round 1", "round 2"]
    assert all("specctl_lean_host on" in r for r in rounds), rounds
    assert (tmp_path / "run" / "parity_plain_on.txt").exists()
    assert not (tmp_path / "run" / "parity_plain_off.txt").exists()  # no off arm benched
    bad = _step(tmp_path, "plainab", SPECCTL_PLAIN_DECODE="1", AB_ARMS="off")
    assert bad.returncode == 2 and "AB_ARMS: expected on,off or on, got off" in bad.stderr


def test_a_refused_plugin_setting_fails_the_step(tmp_path: Path, sim_server_factory) -> None:
    """Against a served simulator, which has no DECODE graphs and answers
    `specctl_plain_decode: 1` with a 400: the step names the refused push on stderr and exits 1
    (it once went on green with the setting unchanged). No bench dataset is there, so the
    benches fail too; the push's own line is what is checked."""
    spec = sim_server_factory(admin_key="k")
    run = tmp_path / "run"
    run.mkdir()
    state = {"admin_key": "k", "servers": {"spec": {"url": spec.base_url, "pid": 0},
                                           "plain": {"url": spec.base_url, "pid": 0}}}
    (run / "state.json").write_text(json.dumps(state))
    done = _step(tmp_path, "plainab", SPECCTL_PLAIN_DECODE="1", WARM="0", AB_ROUNDS="1",
                 STREAMS="2")  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "plugin_setting: specctl_plain_decode=1 answered 400" in done.stderr
    assert "plugin_setting: specctl_plain_decode=0 answered" not in done.stderr  # 0 applied
    assert "1 needs the DECODE graphs" in done.stdout  # the server's own reason, shown


def test_the_copy_probe_step_runs_the_probe_and_fails_without_a_gpu(tmp_path: Path) -> None:
    """No CUDA here: the probe exits 2 saying where to run it, and the step names that and
    exits 1 after packing what it has."""
    done = _step(tmp_path, "h2dprobe", PROBE_SIZES="4")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "the probe needs a CUDA GPU" in done.stderr
    assert "h200_session.sh: failed (exit 2) at line " in done.stderr
    assert (tmp_path / "run" / "h2d_probe.txt").exists()
