"""Every command, given bad values: one `error:` line naming the option (or the file and field)
and the fix, exit status 2, no traceback, and nothing created or started.

The cases run through the real root command (`OneLineErrors.main`, what the console script
runs) in-process; a few run the console script itself in a subprocess, as a user's shell does.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from controller.cli import load_commands

app = load_commands()

URL = "http://127.0.0.1:9"  # nothing listens there: every case must fail before connecting
BAD_YAML = "targets:\n  - name: a\n    url: [http://x\nstore: {path: x}\n"
POLICY = "table:\n  version: 1\n  tiers: [{min_batch: 1, depth: 1}]\n"


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bad-input")
    bad_yaml = root / "bad.yaml"
    bad_yaml.write_text(BAD_YAML)
    policy = root / "policy.yaml"
    policy.write_text(POLICY)
    return {"bad_yaml": bad_yaml, "policy": policy, "root": root}


# (arguments, what the one line must contain); {bad_yaml}, {policy}, {root} are files above.
CASES: list[tuple[list[str], list[str]]] = [
    # bench
    (["bench", "--url", URL, "--concurrency", "1,,4"], ["--concurrency:", "empty item"]),
    (["bench", "--url", URL, "--concurrency", "1,4,"], ["--concurrency:", "empty item"]),
    (["bench", "--url", URL, "--request-rate", "0,2"], ["--request-rate:", "must be > 0"]),
    (["bench", "--url", URL, "--request-rate", "x"], ["--request-rate:", "not a number"]),
    (["bench", "--url", URL, "--request-rate", "2", "--concurrency", "4"],
     ["--request-rate:", "not both"]),
    (["bench", "--url", URL, "--burstiness", "0.5"], ["--burstiness:", "add --request-rate"]),
    (["bench", "--url", URL, "--max-concurrency", "8"],
     ["--max-concurrency:", "add --request-rate"]),
    (["bench", "--url", URL, "--request-rate", "2", "--burstiness", "0"],
     ["--burstiness:", "must be > 0"]),
    (["bench", "--url", URL, "--request-rate", "2", "--max-concurrency", "0"],
     ["--max-concurrency:", "must be >= 1, got 0"]),
    (["bench", "--url", URL, "--warmup-per-level", "-1"],
     ["--warmup-per-level:", "must be >= 0"]),
    (["bench", "--url", URL, "--goodput", "ttfx:500"], ["--goodput:", "ttft, tpot, e2el"]),
    (["bench", "--url", URL, "--goodput", "ttft:0"], ["--goodput:", "must be > 0 ms"]),
    (["bench", "--url", URL, "--requests-per-level", "1", "--duration-per-level", "1"],
     ["--requests-per-level:", "not both"]),
    (["bench", "--url", URL, "--dataset", "{root}/none.jsonl"],
     ["--dataset:", "dataset not found"]),
    (["bench", "--url", URL, "--dataset", "{policy}"],
     ["--dataset:", "policy.yaml:1: not valid JSON"]),
    (["bench", "--url", "127.0.0.1:9"], ["--url:", "add http://"]),
    (["bench", "--url", URL, "--client-processes", "0"],
     ["--client-processes:", "must be >= 1, got 0"]),
    (["bench", "--url", URL, "--client-processes", "-2"],
     ["--client-processes:", "must be >= 1, got -2"]),
    (["bench", "--url", URL, "--client-bound-share", "0"],
     ["--client-bound-share:", "must be > 0"]),
    (["bench"], ["Missing option '--url'", "specctl bench --help"]),
    # status
    (["status", "--url", "127.0.0.1:9"], ["--url:", "add http://"]),
    (["status", "--url", URL, "--window", "0.1"], ["--window:", "must be >= 0.5, got 0.1"]),
    # curves / freeze
    (["curves", "--store", "{root}/none.sqlite"], ["--store", "store not found"]),
    (["curves", "--plot", "{root}/x.bmp"], ["--plot", "unsupported format '.bmp'"]),
    (["curves", "--store", "{root}/a.sqlite", "--config", "{bad_yaml}"],
     ["--config:", "not both"]),
    (["curves", "--config", "{bad_yaml}"], ["bad.yaml: line 4, column 6: not valid YAML"]),
    (["freeze", "--out", "{root}/nodir/policy.yaml"], ["--out", "does not exist"]),
    (["freeze", "--out", "{root}"], ["--out", "is a folder"]),
    (["freeze", "--check", "{bad_yaml}"], ["bad.yaml: line 4, column 6: not valid YAML"]),
    (["freeze", "--check", "{policy}", "--url", "x"], ["--url:", "add http://"]),
    # release
    (["release", "--url", "127.0.0.1:9"], ["--url:", "add http://"]),
    (["release"], ["Missing option '--url'", "specctl release --help"]),
    # serve
    (["serve", "--dry-run", "--depths", "1,,2", "--", "--model-path", "m"],
     ["--depths:", "empty item"]),
    (["serve", "--dry-run", "--policy-file", "{bad_yaml}", "--", "--model-path", "m",
      "--speculative-algorithm", "EAGLE3"], ["--policy-file", "not valid YAML (line 4"]),
    # daemon
    (["daemon", "--config", "{bad_yaml}"], ["bad.yaml: line 4, column 6: not valid YAML"]),
    (["daemon", "--config", "{root}/none.yaml"], ["config file not found"]),
    # demo
    (["demo", "--scenario", "nope"], ["--scenario:", "unknown scenario 'nope'"]),
    (["demo", "--scenario", "{policy}"],
     ["--scenario:", "policy.yaml", "pass a built-in scenario"]),
    (["demo", "--scenario", "{bad_yaml}"], ["--scenario:", "line 4, column 6: not valid YAML"]),
    (["demo", "--freeze", "{root}/nodir/x.yaml"], ["--freeze", "does not exist"]),
    (["demo", "--seed", "x"], ["--seed:", "must be an integer, got x"]),
    # sim
    (["sim", "profiles", "--nope"], ["No such option: --nope"]),
    (["sim", "fit", "{root}/none.json", "--out", "{root}/p.yaml"], ["no such file"]),
    (["sim", "fit", "{policy}", "--out", "{root}/p.txt"], ["--out", ".yaml"]),
    (["sim", "fit", "{policy}", "--out", "{root}/p.yaml", "--base", "nope"],
     ["--base:", "unknown profile 'nope'"]),
    (["sim", "fit", "{policy}", "--out", "{root}/p.yaml", "--off-path", "fast"],
     ["--off-path:", "'fast' is not one of sglang, specctl"]),
    (["sim", "replay", "{root}/none.json", "--profile", "h200-llama8b-eagle3"],
     ["no such file"]),
    (["sim", "replay", "{policy}", "--profile", "nope"], ["--profile:", "unknown profile 'nope'"]),
    (["sim", "replay", "{policy}", "--profile", "h200-llama8b-eagle3", "--off-path", "fast"],
     ["--off-path:", "'fast' is not one of sglang, specctl"]),
    (["sim", "scenarios", "--nope"], ["No such option: --nope"]),
    (["sim", "sweep", "--profile", "nope"], ["--profile:", "unknown profile 'nope'"]),
    (["sim", "sweep", "--profile", "{bad_yaml}"], ["--profile:", "line 4, column 6"]),
    (["sim", "sweep", "--profile", "h200-llama8b-eagle3", "--concurrency", "1,,4"],
     ["--concurrency:", "empty item"]),
    (["sim", "sweep", "--profile", "h200-llama8b-eagle3", "--duration", "0"],
     ["--duration:", "must be a finite number > 0"]),
    (["sim", "sweep", "--profile", "h200-llama8b-eagle3", "--duration", "nan"],
     ["--duration:", "must be a finite number > 0"]),
    (["sim", "sweep", "--profile", "h200-llama8b-eagle3", "--prompt-tokens", "-3"],
     ["--prompt-tokens:", "must be >= 1, got -3"]),
    (["sim", "sweep", "--profile", "h200-llama8b-eagle3", "--prompt-tokens", "0"],
     ["--prompt-tokens:", "must be >= 1, got 0"]),
    (["sim", "sweep", "--profile", "h200-llama8b-eagle3", "--prompt-tokens", "10000000"],
     ["--prompt-tokens:", "exceed the profile's context length"]),
    (["sim", "sweep", "--profile", "h200-llama8b-eagle3", "--output-tokens", "-5"],
     ["--output-tokens:", "give a token count N >= 1"]),
    (["sim", "sweep", "--profile", "h200-llama8b-eagle3", "--seed", "-1"],
     ["--seed:", "must be >= 0, got -1"]),
    (["sim", "sweep", "--profile", "h200-llama8b-eagle3", "--warmup", "-1"],
     ["--warmup:", "must be >= 0"]),
    (["sim", "serve", "--profile", "h200-llama8b-eagle3", "--seed", "-1", "--port", "0"],
     ["--seed:", "must be >= 0, got -1"]),
    (["sim", "serve", "--profile", "h200-llama8b-eagle3", "--speedup", "inf", "--port", "0"],
     ["--speedup:", "must be a finite number > 0"]),
    (["sim", "serve", "--profile", "h200-llama8b-eagle3", "--concurrency", "inf", "--port", "0"],
     ["--concurrency:", "must be a finite number"]),
    (["sim", "evaluate", "--seed", "-2"], ["--seed:", "must be >= 0, got -2"]),
    (["sim", "evaluate", "--http", "inf"], ["--http:", "must run > 0 times wall time"]),
    (["sim", "fit", "{policy}", "--out", "{root}/p.yaml", "--jobs", "0"],
     ["--jobs:", "must be >= 1, got 0"]),
    (["sim", "replay", "{policy}", "--profile", "h200-llama8b-eagle3", "--jobs", "-1"],
     ["--jobs:", "must be >= 1, got -1"]),
    (["demo", "--seed", "-1"], ["--seed:", "must be >= 0, got -1"]),
    (["bench", "--url", URL, "--seed", "-1"], ["--seed:", "must be >= 0, got -1"]),
    (["bench", "--url", URL, "--repeats", "0"], ["--repeats:", "must be >= 1, got 0"]),
    (["bench", "--url", URL, "--prompt-tokens", "0"], ["--prompt-tokens:", "must be >= 1, got 0"]),
    (["sim", "serve", "--profile", "h200-llama8b-eagle3", "--concurrency", "-3", "--port", "0"],
     ["--concurrency:", "must be >= 0, got -3"]),
    (["sim", "serve", "--profile", "h200-llama8b-eagle3", "--speedup", "0", "--port", "0"],
     ["--speedup:", "must be a finite number > 0"]),
    (["sim", "serve", "--profile", "h200-llama8b-eagle3", "--port", "70000"],
     ["--port:", "must be <= 65535, got 70000"]),
    (["sim", "serve", "--profile", "h200-llama8b-eagle3", "--scenario", "{policy}", "--port",
      "0"], ["--scenario:", "pass a built-in scenario"]),
    (["sim", "serve", "--profile", "h200-llama8b-eagle3", "--policy-file", "{bad_yaml}",
      "--port", "0"], ["--policy-file:", "not valid YAML (line 4"]),
    (["sim", "evaluate", "--http", "0"], ["--http:", "must run > 0 times wall time"]),
    (["sim", "evaluate", "--http", "-1"], ["--http:", "must run > 0 times wall time"]),
    (["sim", "evaluate", "--scenario", "{policy}"], ["--scenario:", "pass a built-in scenario"]),
    (["sim", "evaluate", "--profile", "nope"], ["--profile:", "unknown profile 'nope'"]),
    (["sim", "evaluate", "--seed-bench", "{root}/no-bench"],
     ["--seed-bench {root}/no-bench:", "no bench.json there"]),
    (["sim", "shapes", "--profile", "h200-llama8b-eagle3"],
     ["--profile:", "describes no draft shapes", "sim fit --shapes"]),
    (["sim", "fit", "--shapes", "{root}/none", "--out", "{root}/p.yaml"],
     ["--shapes:", "no such folder"]),
    # the root
    (["nope"], ["No such command 'nope'"]),
]  # fmt: skip


def _ids() -> list[str]:
    return [" ".join(a)[:60] for a, _ in CASES]


def invoke(args: list[str]):  # type: ignore[no-untyped-def]
    result = CliRunner().invoke(app, args)
    # Only typer's exit may end a command: anything else escaped as a traceback.
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    return result


@pytest.mark.parametrize(("args", "expected"), CASES, ids=_ids())
def test_bad_input_is_one_error_line_and_exit_2(
    files: dict[str, Path], args: list[str], expected: list[str], monkeypatch
) -> None:
    monkeypatch.setenv("HOME", str(files["root"] / "home"))  # no store of the user's is read
    args = [a.format(**files) for a in args]
    before = sorted(p.name for p in files["root"].iterdir())
    result = invoke(args)
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    for part in expected:
        assert part.format(**files) in lines[0], lines[0]
    assert "<unicode string>" not in lines[0]
    assert sorted(p.name for p in files["root"].iterdir()) == before  # nothing created


def test_every_command_has_a_bad_input_case() -> None:
    root = typer.main.get_command(app)

    def paths(group, prefix=()):  # type: ignore[no-untyped-def]
        for name, cmd in group.commands.items():
            if hasattr(cmd, "commands"):
                yield from paths(cmd, (*prefix, name))
            else:
                yield " ".join((*prefix, name))

    commands = set(paths(root))
    covered = {" ".join(a[:2]) if a[0] == "sim" else a[0] for a, _ in CASES}
    assert commands <= covered, f"no bad-input case for {sorted(commands - covered)}"


@pytest.mark.parametrize(
    "args",
    [
        ["demo", "--scenario", "nope"],
        ["sim", "serve", "--profile", "h200-llama8b-eagle3", "--concurrency", "-3", "--port", "0"],
        ["sim", "evaluate", "--http", "0"],
        ["bench", "--url", URL, "--concurrency", "1,,4"],
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_the_console_script_prints_one_line_in_a_pipe(args: list[str], tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "controller.cli", *args],
        capture_output=True, text=True, timeout=120, cwd=tmp_path,
        env={**os.environ, "COLUMNS": "80", "HOME": str(tmp_path)},
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --"), proc.stderr
    assert list(tmp_path.iterdir()) == []  # nothing written (no demo store, no /nodir)
