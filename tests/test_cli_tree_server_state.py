"""A server that captured draft trees, as read by `specctl status` and by `specctl freeze
--check --url`: the trees are listed, a policy file that names a captured tree passes, one that
names another is refused with the field and the captured trees.

The server is a simulated shape server (`specctl sim serve --shapes`: real loopback HTTP, the
plugin's contract, real Prometheus text) on the profile fitted to run 30's real bench of
shapes; the plugin's own report of a shape server on the GPU (run 34) is read by the last test."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from controller.bench.server_client import ServerClient
from controller.cli import COMMAND_MODULES, app
from sglang_hooks.contract import parse_table

for _module in COMMAND_MODULES:
    importlib.import_module(_module)

PROFILE = str(Path(__file__).resolve().parents[1] / "benchmarks" / "results"
              / "shape_sim_run30.yaml")  # fmt: skip
TABLE = parse_table({"version": 3, "tiers": [
    {"min_batch": 1, "depth": 3, "topk": 4, "draft_tokens": 16},
    {"min_batch": 32, "depth": 3}]})  # fmt: skip
# the plugin's report of a shape server, as run 34's read (benchmarks/results/gpu/)
SHAPES = {"startup": "3x4x16", "live": "3x1x4", "switches": 2032,
          "captured": {"3x4x16": {"capture_s": 0.0, "memory_gb": None,
                                  "target_topk": 4, "mask_read": True},
                       "3x1x4": {"capture_s": 8.42, "memory_gb": 0.23,
                                 "target_topk": 1, "mask_read": False}},
          "refused": {}}  # fmt: skip


def _tree_server(factory: Any) -> str:
    handle = factory(profile=PROFILE, shapes=["3x4x16", "3x1x4"], admin_key="k")
    with ServerClient(handle.base_url, "k") as client:
        client.push(TABLE)
    return str(handle.base_url)


def flat(text: str) -> str:
    return " ".join(text.split())


def freeze_check(policy: Path, text: str, url: str) -> Any:
    """`specctl freeze --check` of a policy file holding `text`, against the server at `url`."""
    policy.write_text(text)
    return CliRunner().invoke(app, ["freeze", "--check", str(policy), "--url", url])


def test_status_lists_the_trees_and_reads_the_tree_table(sim_server_factory: Any) -> None:
    url = _tree_server(sim_server_factory)
    res = CliRunner().invoke(app, ["status", "--url", url, "--json"])
    assert res.exit_code == 0, res.output
    (server,) = json.loads(res.output)["servers"]
    assert server["captured_depths"] == [3] and server["captured_trees"] == ["3x4x16"]
    assert server["shapes"]["startup"] == "3x4x16"
    res = CliRunner().invoke(app, ["status", "--url", url], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    text = flat(res.output)
    assert "captured depths [3], trees ['3x4x16']" in text
    assert "(started at 3x4x16)" in text and " switches" in text
    assert "1-31: 3x4x16 | 32+: d3" in text


def test_freeze_check_holds_a_tree_table_to_the_servers_trees(
    sim_server_factory: Any, tmp_path: Path
) -> None:
    url = _tree_server(sim_server_factory)
    res = freeze_check(tmp_path / "good.yaml", "table: {tiers: [{min_batch: 1, depth: 3, topk: 4, "
                       "draft_tokens: 16}, {min_batch: 64, depth: 3}]}\n", url)  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "(captured: [3], trees ['3x4x16'])" in flat(res.output)
    res = freeze_check(tmp_path / "bad.yaml",
                       "table: {tiers: [{min_batch: 1, depth: 5, topk: 8, draft_tokens: 32}]}\n",
                       url)  # fmt: skip
    assert res.exit_code == 2
    assert ("table.tiers[0]: tree 5x8x32 was not captured by the server (captured trees: "
            "3x4x16); use a captured shape") in flat(res.output)
    res = freeze_check(tmp_path / "off.yaml", "table: {tiers: [{min_batch: 1, depth: 3, topk: 4, "
                       "draft_tokens: 16}, {min_batch: 64, depth: 0}]}\n", url)  # fmt: skip
    assert res.exit_code == 2, res.output
    assert ("table.tiers[1].depth: off (depth 0) is captured on a shape server only when plain "
            "is listed; restart it with plain added to `specctl serve --shapes`") \
        in flat(res.output)


def test_a_shape_server_started_with_plain_holds_off(
    sim_server_factory: Any, tmp_path: Path
) -> None:
    """Plain listed: depth 0 is among the captured depths, a table may turn drafting off,
    and status names off where it runs."""
    handle = sim_server_factory(profile=PROFILE, shapes=["3x4x16", "3x1x4", "plain"],
                                admin_key="k")  # fmt: skip
    url = str(handle.base_url)
    res = freeze_check(tmp_path / "off.yaml", "table: {version: 4, tiers: [{min_batch: 1, "
                       "depth: 3, topk: 4, draft_tokens: 16}, {min_batch: 21, depth: 3}, "
                       "{min_batch: 101, depth: 0}]}\n", url)  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "(captured: [0, 3], trees ['3x4x16'])" in flat(res.output)
    with ServerClient(url, "k") as client:
        client.push(parse_table({"version": 4, "tiers": [{"min_batch": 1, "depth": 0}]}))
    res = CliRunner().invoke(app, ["status", "--url", url], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    text = flat(res.output)
    assert "table 1+: off" in text and "captured depths [0, 3], trees ['3x4x16']" in text


def test_a_garbled_shapes_report_is_left_out_not_fatal() -> None:
    """`shapes` in a server's state is the plugin's own report: one that does not have its
    form is not shown (and a capture cost that is not a number is dropped), the rest is read."""
    from controller.bench.server_client import _shapes

    good = SHAPES
    assert _shapes({"shapes": good}) == {**good, "captured": {
        "3x4x16": {"capture_s": 0.0, "memory_gb": None},
        "3x1x4": {"capture_s": 8.42, "memory_gb": 0.23}}}
    for bad in ("x", {**good, "switches": "many"}, {**good, "live": None}, {"live": "3x1x4"}):
        assert _shapes({"shapes": bad}) is None
    odd = _shapes({"shapes": {**good, "captured": {"3x1x4": {"capture_s": "slow"}}}})
    assert odd is not None and odd["captured"] == {}

