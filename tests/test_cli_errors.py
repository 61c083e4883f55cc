"""Bad input to the commands: one `error:` line (or a usage error naming the option), exit 2,
no traceback, nothing lost; checked before any long work starts."""

from __future__ import annotations

import importlib
import json
import socket

import httpx
import pytest
from typer.testing import CliRunner

from controller.bench import sweep as bench_sweep
from controller.cli import COMMAND_MODULES, app, serve
from sglang_hooks import smoke
from sglang_hooks.contract import parse_table, push_body, read_server_state

for _module in COMMAND_MODULES:
    importlib.import_module(_module)

EAGLE = ["--", "--model-path", "m", "--speculative-algorithm", "EAGLE3"]
FAST_BENCH = ["--requests-per-level", "3", "--output-tokens", "8", "--prompt-tokens", "16"]


def run(*args: str):  # type: ignore[no-untyped-def]
    result = CliRunner().invoke(app, list(args))
    assert "Traceback" not in result.output
    assert not isinstance(result.exception, Exception) or isinstance(
        result.exception, SystemExit
    ), repr(result.exception)
    return result


def flat(text: str) -> str:
    """Output as one line: typer's usage-error box and rich's wrapping undone."""
    for ch in "│╭╮╰╯─":
        text = text.replace(ch, " ")
    return " ".join(text.split())


def error_lines(output: str) -> list[str]:
    return [ln for ln in output.splitlines() if ln.startswith("error:")]


def state_of(url: str) -> dict:
    return read_server_state(httpx.get(f"{url}/server_info", timeout=5).json())[0]


# ----------------------------------------------------------------------------- bench


def test_bench_refuses_an_unwritable_out_before_the_first_push(sim_server, tmp_path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = blocker / "bench"  # a folder under a regular file: cannot be created
    result = run("bench", "--url", sim_server.base_url, "--depths", "1", "--concurrency", "1",
                 "--out", str(out), *FAST_BENCH)  # fmt: skip
    assert result.exit_code == 2
    [line] = error_lines(result.output)
    assert f"--out {out}: cannot write there" in line
    state = state_of(sim_server.base_url)
    assert state["version"] == 0 and state["source"] == "none"  # nothing was pushed


def test_bench_error_stays_on_one_line_in_a_pipe() -> None:
    result = run("bench", "--url", "http://127.0.0.1:9", "--concurrency", "1")
    assert result.exit_code == 2
    [line] = error_lines(result.output)
    assert "cannot reach http://127.0.0.1:9" in line and "is --url right" in line


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--depths", "0,99"], "--depths: 99 is out of range: values must be between 0 and 15"),
        (["--depths", "0,a"], "--depths: 'a' is not an integer"),
        (["--concurrency", "0,4"], "--concurrency: 0 is out of range: values must be >= 1"),
        (["--url", "127.0.0.1:9"], "add http:// (e.g. http://127.0.0.1:9)"),
    ],
)
def test_bench_option_errors_name_the_option(args: list[str], expected: str) -> None:
    base = {"--url": "http://127.0.0.1:9"}
    for i in range(0, len(args), 2):
        base[args[i]] = args[i + 1]
    result = run("bench", *[x for kv in base.items() for x in kv])
    assert result.exit_code == 2
    assert expected in flat(result.output)


@pytest.mark.parametrize("sim_server", [{"concurrency": 6, "speedup": 50}], indirect=True)
def test_bench_warns_and_flags_levels_measured_with_foreign_traffic(
    sim_server, tmp_path, monkeypatch
) -> None:
    monkeypatch.setattr(bench_sweep, "DRAIN_TIMEOUT_S", 0.5)  # the sim's own clients never stop
    out = tmp_path / "b"
    result = run("bench", "--url", sim_server.base_url, "--depths", "1", "--concurrency", "1",
                 "--out", str(out), *FAST_BENCH)  # fmt: skip
    assert result.exit_code == 0, result.output
    text = flat(result.output)
    assert "warning:" in text and "and still was after 0.5 s; another client is using it" in text
    assert "batch above concurrency: other traffic on the server" in text
    [level] = json.loads((out / "bench.json").read_text())["results"]
    assert level["foreign_traffic"] is True and level["mean_batch"] > 3


# At 20x a TTFT stall hint (100 ms of server time) needs 5 ms of wall-clock delay, which a
# busy test machine can still give a 50x simulator now and then.
@pytest.mark.parametrize("sim_server", [{"speedup": 20}], indirect=True)
def test_bench_on_an_idle_server_flags_nothing(sim_server, tmp_path) -> None:
    out = tmp_path / "b"
    result = run("bench", "--url", sim_server.base_url, "--depths", "1", "--concurrency", "1,2",
                 "--out", str(out), *FAST_BENCH)  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "warning" not in result.output and "other traffic" not in result.output
    levels = json.loads((out / "bench.json").read_text())["results"]
    assert [r["foreign_traffic"] for r in levels] == [False, False]


# ----------------------------------------------------------------------------- serve


@pytest.mark.parametrize(
    ("depths", "expected"),
    [
        ("-1,2", "--depths: -1 is out of range: values must be between 0 and 15"),
        (",", "--depths: expected comma-separated integers like 1,2,4, got ','"),
        ("0,a", "--depths: 'a' is not an integer"),
        ("1,99", "--depths: 99 is out of range"),
    ],
)
def test_serve_depths_errors_name_the_flag(depths: str, expected: str) -> None:
    result = run("serve", "--dry-run", "--depths", depths, *EAGLE)
    assert result.exit_code == 2
    assert expected in flat(result.output)


def test_serve_checks_the_policy_file_against_the_captured_depths(tmp_path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("table:\n  version: 1\n  tiers: [{min_batch: 1, depth: 5}]\n")
    result = run("serve", "--dry-run", "--depths", "0,1,3", "--policy-file", str(policy), *EAGLE)
    assert result.exit_code == 2
    [line] = error_lines(result.output)
    assert f"--policy-file {policy}: table.tiers[0].depth" in line and "not captured" in line

    ok = run("serve", "--dry-run", "--depths", "0,1,5", "--policy-file", str(policy), *EAGLE)
    assert ok.exit_code == 0, ok.output
    assert f"SPECCTL_POLICY_FILE={policy.resolve()}" in ok.output

    missing = run("serve", "--dry-run", "--policy-file", str(tmp_path / "no.yaml"), *EAGLE)
    assert missing.exit_code == 2 and "no.yaml: no such file" in missing.output


def test_serve_keeps_the_users_adaptive_config_and_ignores_depths(tmp_path) -> None:
    own = tmp_path / "own.json"
    own.write_text('{"1": {"candidate_steps": [0, 1, 5]}, "32": {"candidate_steps": [0, 1]}}')
    policy = tmp_path / "policy.yaml"
    policy.write_text("table:\n  version: 1\n  tiers: [{min_batch: 1, depth: 5}]\n")
    args = ["serve", "--dry-run", "--depths", "0,3", *EAGLE, "--speculative-adaptive-config",
            str(own)]  # fmt: skip
    result = run(*args)
    assert result.exit_code == 0, result.output
    assert "--depths is ignored" in result.output and "[0, 1]" in result.output
    assert "# adaptive config" not in result.output
    assert f"--speculative-adaptive-config {own}" in result.output
    # The policy file is checked against what that config captures in every slot.
    refused = run(*args[:2], "--policy-file", str(policy), *args[2:])
    assert refused.exit_code == 2 and "captured: [0, 1]" in flat(refused.output)


def test_serve_sets_no_plugin_variable_whatever_sglang_it_launches(tmp_path, monkeypatch) -> None:
    """The plugin runs the same code however it was loaded: `specctl serve` sets no SPECCTL_*
    variable (SPECCTL_POLICY_FILE only for --policy-file), found SGLang or not. SGLang 0.5.17
    cannot be installed on a CPU machine: a package holding its version file alone, first on
    sys.path, stands in for it."""
    absent = run("serve", "--dry-run", *EAGLE)
    assert absent.exit_code == 0, absent.output
    package = tmp_path / "sglang"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "_version.py").write_text('__version__ = "0.5.17"\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    found = run("serve", "--dry-run", *EAGLE)
    assert found.exit_code == 0, found.output
    for result in (absent, found):
        assert "SPECCTL_" not in result.output


def test_serve_shapes_starts_sglang_static_at_the_dominating_tree(tmp_path) -> None:
    """`--shapes`: no adaptive mode, the dominating shape's size flags and FA3 added, the list
    for the plugin in SPECCTL_SHAPES, a start-up table checked against the listed shapes."""
    result = run("serve", "--dry-run", "--shapes", "3x1x4,3x4x16", *EAGLE)
    assert result.exit_code == 0, result.output
    [command] = [ln for ln in result.output.splitlines() if "sglang.launch_server" in ln]
    assert command.startswith("SPECCTL_SHAPES=3x1x4,3x4x16 ")
    assert ("--speculative-num-steps 3 --speculative-eagle-topk 4 "
            "--speculative-num-draft-tokens 16 --attention-backend fa3") in command
    assert "--speculative-adaptive" not in command and "--enable-metrics" in command
    policy = tmp_path / "policy.yaml"
    policy.write_text("table:\n  version: 1\n  tiers: [{min_batch: 1, depth: 3, topk: 4, "
                      "draft_tokens: 16}, {min_batch: 16, depth: 3}]\n")
    ok = run("serve", "--dry-run", "--shapes", "3x1x4,3x4x16", "--policy-file", str(policy),
             *EAGLE)
    assert ok.exit_code == 0, ok.output
    assert "1-15: 3x4x16 | 16+: d3" in ok.output and f"SPECCTL_POLICY_FILE={policy.resolve()}" \
        in ok.output
    refused = run("serve", "--dry-run", "--shapes", "2x1x3,3x4x16", "--policy-file", str(policy),
                  *EAGLE)
    assert refused.exit_code == 2
    assert "--policy-file" in flat(refused.output) and "tiers[1].depth" in flat(refused.output)


def test_serve_shapes_with_plain_captures_off_beside_the_tree(tmp_path) -> None:
    """`plain` among the shapes: SGLang still starts at the tree, SPECCTL_SHAPES keeps plain,
    and a start-up table may turn drafting off only when plain is listed."""
    result = run("serve", "--dry-run", "--shapes", "3x4x16,3x1x4,plain", *EAGLE)
    assert result.exit_code == 0, result.output
    [command] = [ln for ln in result.output.splitlines() if "sglang.launch_server" in ln]
    assert command.startswith("SPECCTL_SHAPES=3x4x16,3x1x4,plain ")
    assert "--speculative-eagle-topk 4 --speculative-num-draft-tokens 16" in command
    assert "draft extend skipped" in flat(result.output)
    policy = tmp_path / "policy.yaml"
    policy.write_text("table:\n  version: 1\n  tiers: [{min_batch: 1, depth: 3, topk: 4, "
                      "draft_tokens: 16}, {min_batch: 21, depth: 3}, {min_batch: 101, "
                      "depth: 0}]\n")
    ok = run("serve", "--dry-run", "--shapes", "3x4x16,3x1x4,plain", "--policy-file",
             str(policy), *EAGLE)
    assert ok.exit_code == 0, ok.output
    assert "1-20: 3x4x16 | 21-100: d3 | 101+: off" in ok.output
    refused = run("serve", "--dry-run", "--shapes", "3x4x16,3x1x4", "--policy-file",
                  str(policy), *EAGLE)
    assert refused.exit_code == 2
    [line] = error_lines(refused.output)
    assert line == (f"error: --policy-file {policy}: table.tiers[2].depth: off (depth 0) is "
                    f"captured on a shape server only when plain is listed; add plain to "
                    f"--shapes")
    policy.write_text("table:\n  version: 1\n  tiers: [{min_batch: 1, depth: 3, "
                      "explore_share: 0.1, explore_depths: [0]}]\n")
    probe = run("serve", "--dry-run", "--shapes", "3x4x16,3x1x4", "--policy-file",
                str(policy), *EAGLE)
    assert probe.exit_code == 2 and "tiers[0].explore_depths[0]: off" in flat(probe.output)


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        (["--shapes", "3x4x8,5x2x12,plain"], "error: --shapes: shapes 3x4x8,5x2x12,plain: no "
                                             "listed shape"),
        (["--shapes", "3x4"], "error: --shapes: shape '3x4': write STEPSxTOPKxDRAFT"),
        (["--shapes", "3x1x4,1x1x2"], "error: --shapes: shapes 3x1x4,1x1x2 are chains only: "
                                      "pass --depths 1,3"),
        (["--shapes", "3x4x16", "--depths", "0,3"], "error: --shapes replaces --depths"),
    ],
)
def test_serve_shapes_errors_are_one_line_and_exit_2(extra: list[str], expected: str) -> None:
    result = run("serve", "--dry-run", *extra, *EAGLE)
    assert result.exit_code == 2
    [line] = error_lines(result.output)
    assert line.startswith(expected), line


def test_serve_writes_a_new_adaptive_config_per_launch(tmp_path) -> None:
    a = serve._write_config(None, [0, 1, 3])
    b = serve._write_config(None, [0, 2])
    try:
        assert a != b
        assert json.loads(a.read_text()) == {"1": {"candidate_steps": [0, 1, 3]}}
        assert json.loads(b.read_text()) == {"1": {"candidate_steps": [0, 2]}}
    finally:
        a.unlink()
        b.unlink()
    chosen = serve._write_config(tmp_path / "cfg.json", [1])
    assert chosen == tmp_path / "cfg.json"


# ----------------------------------------------------------------------------- curves / freeze


@pytest.mark.parametrize(
    ("name", "expected"),
    [("x.bmp", "unsupported format '.bmp'; use one of .png, .svg, .pdf"),
     ("nodir/x.png", "does not exist")],
)  # fmt: skip
def test_curves_checks_the_plot_path_before_any_work(tmp_path, name: str, expected: str) -> None:
    # The store does not exist either: the plot path is checked first.
    result = run("curves", "--store", str(tmp_path / "none.sqlite"), "--plot",
                 str(tmp_path / name))  # fmt: skip
    assert result.exit_code == 2
    [line] = error_lines(result.output)
    assert expected in line


def test_freeze_check_of_a_missing_file_says_so(tmp_path) -> None:
    missing = tmp_path / "missing.yaml"
    result = run("freeze", "--check", str(missing))
    assert result.exit_code == 2
    assert error_lines(result.output) == [f"error: {missing}: no such file"]


# ----------------------------------------------------------------------------- status


def test_status_refuses_short_windows_and_urls_without_scheme() -> None:
    short = run("status", "--url", "http://127.0.0.1:9", "--window", "0")
    assert short.exit_code == 2 and "--window" in short.output
    bare = run("status", "--url", "127.0.0.1:9")
    assert bare.exit_code == 2
    assert "add http:// (e.g. http://127.0.0.1:9)" in flat(bare.output)


def test_status_shows_an_inactive_plugin(sim_server) -> None:
    """The simulator's plugin is always active, so its state is overridden in-process to what
    the real plugin reports when it cannot steer; the HTTP round trip is real."""
    real = sim_server.server.specctl_state()
    assert real["active"] is True and real["inactive_reason"] is None
    assert {"iteration", "unattributed_results"} <= set(real)
    reason = "speculative_adaptive is off (start with --speculative-adaptive)"
    sim_server.server.specctl_state = lambda: {**real, "active": False, "inactive_reason": reason}
    doc = run("status", "--url", sim_server.base_url, "--window", "0.5", "--json")
    assert doc.exit_code == 0, doc.output
    [server] = json.loads(doc.stdout)["servers"]
    assert server["active"] is False and server["inactive_reason"] == reason
    panel = run("status", "--url", sim_server.base_url, "--window", "0.5")
    assert f"inactive: {reason}" in flat(panel.output)


# ----------------------------------------------------------------------------- sim


def test_sim_sweep_short_runs_do_not_score_points_without_decode() -> None:
    result = run("sim", "sweep", "--profile", "kimi-k25-8x-rtxpro6000-pcie", "--depths", "1",
                 "--concurrency", "1,250", "--duration", "60", "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    nospec = {r["concurrency"]: r for r in doc["rows"] if r["mode"] == "nospec"}
    assert nospec[250]["decode_iterations"] == 0 and nospec[250]["step_ms"] is None
    assert not nospec[250]["scored"] and nospec[1]["scored"]
    assert doc["unscored_concurrency"] == [250]
    assert "C=250 not scored" in doc["warnings"][0]
    assert doc["crossover_concurrency"] is None

    table = run("sim", "sweep", "--profile", "kimi-k25-8x-rtxpro6000-pcie", "--depths", "1",
                "--concurrency", "1,250", "--duration", "60")  # fmt: skip
    assert table.exit_code == 0
    text = flat(table.output)
    assert "not scored: C=250" in text and "warning: C=250 not scored" in text
    assert "│ 250 │" in table.output and "- │" in table.output


def test_sim_sweep_refuses_a_warmup_longer_than_the_run() -> None:
    result = run("sim", "sweep", "--profile", "kimi-k25-8x-rtxpro6000-pcie", "--warmup", "20",
                 "--duration", "10")  # fmt: skip
    assert result.exit_code == 2
    assert "--warmup" in result.output and "shorter than --duration" in flat(result.output)


def test_sim_sweep_depths_are_range_checked() -> None:
    result = run("sim", "sweep", "--profile", "kimi-k25-8x-rtxpro6000-pcie", "--depths", "1,x")
    assert result.exit_code == 2 and "--depths: 'x' is not an integer" in flat(result.output)


@pytest.mark.parametrize(
    ("value", "message"),
    [("0", "give a token count N >= 1"), ("192:64", "LOW must not exceed HIGH"),
     ("a:b", "give a token count N or a range LOW:HIGH"),
     ("1:2:3", "give a token count N >= 1 or a range")],
)  # fmt: skip
def test_sim_sweep_output_lengths_are_checked(value: str, message: str) -> None:
    result = run("sim", "sweep", "--profile", "kimi-k25-8x-rtxpro6000-pcie", "--output-tokens",
                 value)  # fmt: skip
    assert result.exit_code == 2 and f"--output-tokens: '{value}': {message}" in flat(
        result.output)


def test_sim_sweep_draws_output_lengths_over_a_range() -> None:
    """64:192 replays a bench with spread outputs: the same mean length as 128, requests that
    end one by one; the range is in the title and the JSON."""
    args = ["sim", "sweep", "--profile", "h200-sglang-llama8b-seeded", "--depths", "3",
            "--concurrency", "64", "--duration", "12", "--warmup", "1.5"]  # fmt: skip
    spread = run(*args, "--output-tokens", "64:192", "--json")
    assert spread.exit_code == 0, spread.output
    doc = json.loads(spread.stdout)
    assert doc["output_tokens"] == [64, 192]
    equal = json.loads(run(*args, "--output-tokens", "128", "--json").stdout)
    assert equal["output_tokens"] == 128
    d3 = [next(r for r in d["rows"] if r["mode"] == "spec") for d in (doc, equal)]
    assert d3[0]["tok_per_s"] != d3[1]["tok_per_s"]  # other requests, other waves
    assert d3[0]["tok_per_s"] == pytest.approx(d3[1]["tok_per_s"], rel=0.25)
    table = run(*args, "--output-tokens", "64:192")
    assert "64-192 output" in flat(table.output)


def test_sim_serve_on_a_taken_port_says_so() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run("sim", "serve", "--profile", "kimi-k25-8x-rtxpro6000-pcie", "--port",
                     str(port))  # fmt: skip
    assert result.exit_code == 2
    [line] = error_lines(result.output)
    assert f"cannot listen on 127.0.0.1:{port}" in line and "--port" in line


# ----------------------------------------------------------------------------- daemon


def test_daemon_with_an_unusable_store_path_exits_2(tmp_path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cfg = tmp_path / "controller.yaml"
    cfg.write_text(
        "targets: [{name: s, simulated: {}}]\nschedule: {clock: simulated, duration_s: 60}\n"
        f"store: {{path: '{blocker / 'store.sqlite'}'}}\nmetrics: {{enabled: false}}\n"
    )
    result = run("daemon", "--config", str(cfg))
    assert result.exit_code == 2
    [line] = error_lines(result.output)
    assert f"store.path {blocker / 'store.sqlite'}: cannot open the store" in line


# ----------------------------------------------------------------------------- smoke


@pytest.mark.parametrize("sim_server", [{"concurrency": 4, "speedup": 50}], indirect=True)
def test_smoke_restores_the_table_that_was_live_before(sim_server, monkeypatch) -> None:
    """The simulator has no /generate, so the smoke's own load threads are replaced by the
    simulator's background clients (which decode all along); everything else is real HTTP."""
    monkeypatch.setattr(smoke, "_load", lambda *args: None)
    before = parse_table(
        {"version": 7, "tiers": [{"min_batch": 1, "depth": 3}, {"min_batch": 16, "depth": 1}]}
    )
    httpx.post(f"{sim_server.base_url}/set_internal_state", json=push_body(before), timeout=5)
    code = smoke.main(["--url", sim_server.base_url, "--seconds-per-depth", "0.5"])
    assert code == 0
    assert parse_table(state_of(sim_server.base_url)["table"]) == before


def test_smoke_reads_the_admin_key_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("SPECCTL_ADMIN_KEY", "from-env")
    seen: dict[str, object] = {}

    class Stop(Exception):
        pass

    def fake_client(**kwargs: object) -> None:
        seen.update(kwargs)
        raise Stop

    monkeypatch.setattr(smoke.httpx, "Client", fake_client)
    with pytest.raises(Stop):
        smoke.main([])
    assert seen["headers"] == {"Authorization": "Bearer from-env"}


def test_cli_args_helper_sorts_and_dedups() -> None:
    from controller.cli.args import parse_int_list

    assert parse_int_list(" 4, 1,2,4 ", "--x", 0) == (1, 2, 4)
