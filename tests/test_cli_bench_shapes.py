"""`specctl bench --shapes` against a simulated shape server (`specctl sim serve --shapes`, real
loopback HTTP, the plugin's contract) on the profile fitted to run 30's real bench of shapes:
each captured shape held in turn and benched, the table restored, the best shape per load
written as a policy file the server accepts, and its one-line errors."""

from __future__ import annotations

import importlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from controller.bench.loadgen import StopRule
from controller.bench.prompts import synthetic_prompts
from controller.bench.server_client import ServerClient
from controller.bench.shape_sweep import ShapeSweepOutcome
from controller.bench.sweep import LevelResult, SweepPlan
from controller.cli import COMMAND_MODULES, app
from controller.cli.bench_shapes import _write
from controller.daemon.policy_file import PolicyFileError, load
from sglang_hooks.contract import PolicyTable, Tier, shape_tier
from sglang_hooks.draft_shape import DraftShape

for _module in COMMAND_MODULES:
    importlib.import_module(_module)

PROFILE = str(Path(__file__).resolve().parents[1] / "benchmarks" / "results"
              / "shape_sim_run30.yaml")  # fmt: skip
KEY = "k"
TREE = DraftShape(3, 4, 16)
BEFORE = PolicyTable.build([shape_tier(1, TREE), Tier(32, 3)], version=7)
FAST = ["--requests-per-level", "8", "--output-tokens", "48", "--prompt-tokens", "32",
        "--client-bound-share", "100"]  # fmt: skip


def bench(url: str, out: Path, *args: str) -> Any:
    """`specctl bench` of the server at `url` with the admin key, its results in `out`."""
    return CliRunner().invoke(app, ["bench", "--url", url, "--admin-key", KEY, "--out", str(out),
                                    *args])  # fmt: skip


def flat(text: str) -> str:
    return " ".join(text.split())


def test_each_shape_is_held_and_benched_and_the_table_restored(
    sim_server_factory: Any, tmp_path: Path
) -> None:
    server = sim_server_factory(profile=PROFILE, shapes=["3x4x16", "3x1x4"], admin_key=KEY,
                                speedup=10.0)  # fmt: skip
    with ServerClient(server.base_url, KEY) as client:
        client.push(BEFORE)
    out = tmp_path / "bench"
    res = bench(server.base_url, out, "--shapes", "3x4x16,3x1x4", "--concurrency", "1,4", *FAST)
    assert res.exit_code == 0, res.output
    text = flat(res.output)
    assert "holding 3x4x16: 1+: 3x4x16" in text and "holding 3x1x4: 1+: d3" in text
    assert f"server table restored: {BEFORE.describe()}" in text
    with ServerClient(server.base_url, KEY) as client:
        assert client.state().table == BEFORE
    doc = json.loads((out / "shapes.json").read_text())
    assert doc["shapes"] == ["3x4x16", "3x1x4"]
    for shape, (low, high) in (("3x4x16", (3.3, 4.0)), ("3x1x4", (2.5, 3.2))):
        levels = doc["levels"][shape]
        assert [lv["concurrency"] for lv in levels] == [1, 4]
        # the tree's accept length read from its own series, the chain's from its depth's
        assert all(low < lv["accept_length"] < high for lv in levels), (shape, levels)
        assert all(lv["series"] == shape and lv["output_tok_per_s"] > 0 for lv in levels)
    assert [b["streams"] for b in doc["best"]] == [1, 4]
    # the closed loop 1, 4, 1: each shape held throughout, and the best one at every step
    tok = {s: {lv["concurrency"]: lv["output_tok_per_s"] for lv in doc["levels"][s]}
           for s in doc["shapes"]}
    held = {s: (2 * t[1] + t[4]) / 3 for s, t in tok.items()}
    best = (2 * max(t[1] for t in tok.values()) + max(t[4] for t in tok.values())) / 3
    bound = doc["closed_loop_bound"]
    assert bound["steps"] == [1, 4, 1] and bound["held_tok_per_s"] == pytest.approx(held)
    assert bound["gain"] == pytest.approx(best / max(held.values())) and bound["gain"] >= 1
    assert f"x{bound['gain']:.3f} the best single one ({bound['best_single']})" in text
    assert (out / "shapes.png").stat().st_size > 10_000
    if doc["recommended_table"] is not None:  # every load decided something
        policy = load(out / "shapes-table.yaml", captured_depths=[3], captured_trees=[TREE])
        assert policy.table.to_json() == doc["recommended_table"]
        assert policy.provenance.model_dump()["created_by"] == "specctl bench --shapes"
        check = CliRunner().invoke(app, ["freeze", "--check", str(out / "shapes-table.yaml"),
                                         "--url", server.base_url])  # fmt: skip
        assert check.exit_code == 0, check.output


def test_plain_is_held_as_off_where_the_server_captured_it(
    sim_server_factory: Any, tmp_path: Path
) -> None:
    """A shape server started with plain: off held by a one-tier table like any shape, its
    accept length from depth 0's series, plain in the closed-loop bound, and the table written
    may turn drafting off; the server's own table comes back."""
    server = sim_server_factory(profile=PROFILE, shapes=["3x4x16", "3x1x4", "plain"],
                                admin_key=KEY, speedup=10.0)  # fmt: skip
    with ServerClient(server.base_url, KEY) as client:
        assert 0 in client.state().captured_depths
        client.push(BEFORE)
    out = tmp_path / "bench"
    res = bench(server.base_url, out, "--shapes", "3x4x16,3x1x4,plain", "--concurrency", "1,16",
                *FAST)
    assert res.exit_code == 0, res.output
    text = flat(res.output)
    assert "benching 3x4x16, 3x1x4, plain held in turn" in text
    assert "holding plain: 1+: off" in text
    assert f"server table restored: {BEFORE.describe()}" in text
    with ServerClient(server.base_url, KEY) as client:
        assert client.state().table == BEFORE
    doc = json.loads((out / "shapes.json").read_text())
    assert doc["shapes"] == ["3x4x16", "3x1x4", "plain"]
    levels = doc["levels"]["plain"]
    assert [lv["concurrency"] for lv in levels] == [1, 16]
    assert all(lv["series"] == "plain" and lv["output_tok_per_s"] > 0 for lv in levels)
    assert all(lv["accept_length"] == pytest.approx(1.0) for lv in levels), levels
    assert set(doc["closed_loop_bound"]["held_tok_per_s"]) == {"3x4x16", "3x1x4", "plain"}
    assert (out / "shapes.png").stat().st_size > 10_000
    if doc["recommended_table"] is not None:  # every load decided something
        policy = load(out / "shapes-table.yaml", captured_depths=[0, 3], captured_trees=[TREE])
        assert policy.table.to_json() == doc["recommended_table"]
        check = CliRunner().invoke(app, ["freeze", "--check", str(out / "shapes-table.yaml"),
                                         "--url", server.base_url])  # fmt: skip
        assert check.exit_code == 0, check.output
    # The best shape per load as a table holds off where plain was fastest.
    best = {b["streams"]: b["shape"] for b in doc["best"]}
    if best.get(16) == "plain" and doc["recommended_table"] is not None:
        assert doc["recommended"].endswith(": off")


def _level(name: str, streams: int, tok_s: float) -> LevelResult:
    return LevelResult(
        series=name, depth=None, concurrency=streams, requests=8, errors=0, elapsed_s=1.0,
        output_tok_per_s=tok_s, ttft_p50_ms=1.0, ttft_p90_ms=2.0, tpot_p50_ms=1.0,
        tpot_p90_ms=2.0, mean_batch=float(streams), accept_length=1.0, client_cpu_share=0.1,
    )  # fmt: skip


def test_where_plain_is_fastest_the_written_table_turns_drafting_off(tmp_path: Path) -> None:
    """The best shape per load as a policy file: plain as an off tier, which a server that
    captured depth 0 accepts; the closed-loop bound counts plain too."""
    plan = SweepPlan(url="http://127.0.0.1:1", depths=(), concurrencies=(1, 16, 64),
                     stop=StopRule(duration_s=10), prompts=synthetic_prompts(1, 8, 8),
                     prompt_source="t")  # fmt: skip
    tok = {"3x4x16": (1400, 5600, 4400), "3x1x4": (2500, 4600, 4900), "plain": (1300, 2000, 9000)}
    outcome = ShapeSweepOutcome(plan, [TREE, DraftShape(3, 1, 4), None], results={
        name: [_level(name, c, t) for c, t in zip((1, 16, 64), figures, strict=True)]
        for name, figures in tok.items()})  # fmt: skip
    _write(outcome, tmp_path, Console(file=io.StringIO()))
    doc = json.loads((tmp_path / "shapes.json").read_text())
    assert doc["shapes"] == ["3x4x16", "3x1x4", "plain"]
    assert doc["best"][-1] == {"streams": 64, "shape": "plain"}
    assert doc["recommended"].endswith(": off")
    assert doc["closed_loop_bound"]["held_tok_per_s"]["plain"] == pytest.approx(
        (2 * 1300 + 2 * 2000 + 9000) / 5)
    policy = load(tmp_path / "shapes-table.yaml", captured_depths=[0, 3], captured_trees=[TREE])
    assert policy.table.tiers[-1].shape is None
    assert policy.table.to_json() == doc["recommended_table"]
    with pytest.raises(PolicyFileError, match="depth 0 was not captured"):
        load(tmp_path / "shapes-table.yaml", captured_depths=[3], captured_trees=[TREE])
    assert (tmp_path / "shapes.png").stat().st_size > 10_000


@pytest.mark.parametrize(("args", "expected"), [
    (["--shapes", "3x4x16", "--depths", "3"],
     "error: --shapes: holds each captured shape in turn on one server, closed loop, once: "
     "drop --depths"),
    (["--shapes", "3x4x16,plain"],
     "error: --shapes: plain (off) was not captured by the server (it holds d3, 3x4x16); start "
     "it with `specctl serve --shapes 3x4x16,3x1x4,plain`"),
    (["--shapes", "3x4"], "error: --shapes: shape '3x4': write STEPSxTOPKxDRAFT"),
    (["--shapes", "5x8x32"],
     "error: --shapes: 5x8x32 was not captured by the server (it holds d3, 3x4x16); start it "
     "with `specctl serve --shapes`"),
])  # fmt: skip
def test_a_shape_list_the_server_cannot_hold_is_one_line(
    sim_server_factory: Any, tmp_path: Path, args: list[str], expected: str
) -> None:
    server = sim_server_factory(profile=PROFILE, shapes=["3x4x16", "3x1x4"], admin_key=KEY)
    out = tmp_path / "never"
    res = bench(server.base_url, out, *args)
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert flat(lines[0]).startswith(expected), lines[0]
    assert not out.exists()
