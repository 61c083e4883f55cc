"""A server that reports captured draft trees, as read by `specctl status` and by
`specctl freeze --check --url`: the trees are listed, a policy file that names a captured tree
passes, one that names another is refused with the field and the captured trees.

The server is a stand-in: a real loopback HTTP server answering `/server_info` with the
contract's own `server_state` (trees captured) and `/metrics` with real Prometheus text. The
plugin captures trees on a GPU only (`specctl serve --shapes`) and the simulator captures none,
so no real server can answer here."""

from __future__ import annotations

import importlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from loopback_http import QuietHandler, serving
from typer.testing import CliRunner

from controller.cli import COMMAND_MODULES, app
from sglang_hooks.contract import parse_table, server_state
from sglang_hooks.draft_shape import DraftShape

for _module in COMMAND_MODULES:
    importlib.import_module(_module)

TABLE = parse_table({"version": 3, "tiers": [
    {"min_batch": 1, "depth": 3, "topk": 4, "draft_tokens": 16},
    {"min_batch": 32, "depth": 3},
    {"min_batch": 128, "depth": 0}]})  # fmt: skip
STATE = {**server_state(TABLE, [0, 3], source="push", captured_trees=[DraftShape(3, 4, 16)]),
         # the plugin's report of a shape server, as run 34's read (benchmarks/results/gpu/)
         "shapes": {"startup": "3x4x16", "live": "3x1x4", "switches": 2032,
                    "captured": {"3x4x16": {"capture_s": 0.0, "memory_gb": None,
                                            "target_topk": 4, "mask_read": True},
                                 "3x1x4": {"capture_s": 8.42, "memory_gb": 0.23,
                                           "target_topk": 1, "mask_read": False}},
                    "refused": {}}}
METRICS = "# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 0\n"


class _TreeServer(QuietHandler):
    def do_GET(self) -> None:
        if self.path.startswith("/server_info"):
            self.reply(json.dumps({"internal_states": [{"specctl": STATE}]}).encode())
        elif self.path.startswith("/metrics"):
            self.reply(METRICS.encode())
        else:
            self.reply(b"", status=404)


@pytest.fixture
def tree_server() -> Iterator[str]:
    with serving(_TreeServer) as url:
        yield url


def flat(text: str) -> str:
    return " ".join(text.split())


def test_status_lists_the_trees_and_reads_the_tree_table(tree_server: str) -> None:
    res = CliRunner().invoke(app, ["status", "--url", tree_server, "--json"])
    assert res.exit_code == 0, res.output
    (server,) = json.loads(res.output)["servers"]
    assert server["captured_depths"] == [0, 3] and server["captured_trees"] == ["3x4x16"]
    assert server["shapes"]["live"] == "3x1x4" and server["shapes"]["switches"] == 2032
    res = CliRunner().invoke(app, ["status", "--url", tree_server], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    text = flat(res.output)
    assert "captured depths [0, 3], trees ['3x4x16']" in text
    assert ("shapes live 3x1x4 (started at 3x4x16), 2,032 switches; captured 3x1x4 8.42 s / "
            "0.23 GB") in text
    assert "1-31: 3x4x16 | 32-127: d3 | 128+: off" in text


def test_freeze_check_holds_a_tree_table_to_the_servers_trees(
    tree_server: str, tmp_path: Path
) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("table: {tiers: [{min_batch: 1, depth: 3, topk: 4, draft_tokens: 16},"
                    " {min_batch: 64, depth: 0}]}\n")
    res = CliRunner().invoke(app, ["freeze", "--check", str(good), "--url", tree_server])
    assert res.exit_code == 0, res.output
    assert "(captured: [0, 3], trees ['3x4x16'])" in flat(res.output)
    bad = tmp_path / "bad.yaml"
    bad.write_text("table: {tiers: [{min_batch: 1, depth: 5, topk: 8, draft_tokens: 32}]}\n")
    res = CliRunner().invoke(app, ["freeze", "--check", str(bad), "--url", tree_server])
    assert res.exit_code == 2
    assert ("table.tiers[0]: tree 5x8x32 was not captured by the server (captured trees: "
            "3x4x16); use a captured shape") in flat(res.output)


def test_a_garbled_shapes_report_is_left_out_not_fatal() -> None:
    """`shapes` in a server's state is the plugin's own report: one that does not have its
    form is not shown (and a capture cost that is not a number is dropped), the rest is read."""
    from controller.bench.server_client import _shapes

    good = STATE["shapes"]
    assert _shapes({"shapes": good}) == {**good, "captured": {
        "3x4x16": {"capture_s": 0.0, "memory_gb": None},
        "3x1x4": {"capture_s": 8.42, "memory_gb": 0.23}}}
    for bad in ("x", {**good, "switches": "many"}, {**good, "live": None}, {"live": "3x1x4"}):
        assert _shapes({"shapes": bad}) is None
    odd = _shapes({"shapes": {**good, "captured": {"3x1x4": {"capture_s": "slow"}}}})
    assert odd is not None and odd["captured"] == {}

