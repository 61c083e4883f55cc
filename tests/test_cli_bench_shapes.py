"""`specctl bench --shapes` against a simulated shape server (`specctl sim serve --shapes`, real
loopback HTTP, the plugin's contract) on the profile fitted to run 30's real bench of shapes:
each captured shape held in turn and benched, the table restored, the best shape per load
written as a policy file the server accepts, and its one-line errors."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from controller.bench.server_client import ServerClient
from controller.cli import COMMAND_MODULES, app
from controller.daemon.policy_file import load
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
    res = CliRunner().invoke(app, ["bench", "--url", server.base_url, "--admin-key", KEY,
                                   "--shapes", "3x4x16,3x1x4", "--concurrency", "1,4",
                                   "--out", str(out), *FAST])  # fmt: skip
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


@pytest.mark.parametrize(("args", "expected"), [
    (["--shapes", "3x4x16", "--depths", "3"],
     "error: --shapes: holds each captured shape in turn on one server, closed loop, once: "
     "drop --depths"),
    (["--shapes", "3x4x16,plain"], "error: --shapes: plain is not held on a shape server"),
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
    res = CliRunner().invoke(app, ["bench", "--url", server.base_url, "--admin-key", KEY,
                                   "--out", str(out), *args])  # fmt: skip
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert flat(lines[0]).startswith(expected), lines[0]
    assert not out.exists()
