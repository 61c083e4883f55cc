"""The `treeswitch` step's planning, on CPU: the start-up shape and the tables it pushes, read
back through the contract as a shape server would read them. The step itself needs SGLang's
draft shapes on a GPU (benchmarks/results/gpu/)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from benchmarks.gpu.context import StepError
from benchmarks.gpu.steps.treeswitch import (
    held_table,
    held_tables,
    plan_shapes,
    push,
    switching_table,
    table_vs_best,
)
from controller.bench.server_client import ServerClient
from sglang_hooks.contract import PolicyError, TierSelector, decode_table, encode_table
from sglang_hooks.draft_shape import DraftShape
from sglang_hooks.policy_file import load_policy_file

TREE, CHAIN = DraftShape(3, 4, 16), DraftShape(3, 1, 4)


def test_the_start_up_shape_is_the_dominating_one_whatever_the_order() -> None:
    assert plan_shapes("3x1x4,3x4x16") == (TREE, [CHAIN])
    assert plan_shapes("3x4x16,3x1x4,2x4x8") == (TREE, [CHAIN, DraftShape(2, 4, 8)])
    assert plan_shapes("plain,3x1x4,3x4x16") == (TREE, [None, CHAIN])  # plain: off, captured


@pytest.mark.parametrize(("text", "message"), [
    ("3x4x8,5x2x12", "add 3x4x12"),
    ("plain", "list a drafting shape to start at"),
    ("plain,3x1x4", "plain goes with a tree"),
    ("3x4", "STEPSxTOPKxDRAFT"),
])  # fmt: skip
def test_a_list_the_server_cannot_start_at_is_refused_naming_the_fix(text: str,
                                                                     message: str) -> None:
    with pytest.raises(StepError, match=message):
        plan_shapes(text)


def test_the_tables_reach_a_shape_server_intact_and_switch_between_the_shapes() -> None:
    table = switching_table(TREE, [CHAIN], version=5)
    wire = encode_table(table)
    decoded = decode_table(wire, captured_depths={3}, captured_trees={TREE})
    assert decoded == table
    selector = TierSelector(decoded)
    drawn = [selector.select_shape(8) for _ in range(400)]
    probes = [shape for shape, probe in drawn if probe]
    assert set(probes) == {CHAIN} and 120 < len(probes) < 280  # share 0.5
    assert {shape for shape, probe in drawn if not probe} == {TREE}
    held = decode_table(encode_table(held_table(CHAIN, 2)), captured_depths={3},
                        captured_trees={TREE})
    assert held is not None and TierSelector(held).select_shape(64) == (CHAIN, False)


def test_plain_is_held_as_an_off_tier_and_probed_as_depth_0_beside_the_tree() -> None:
    """Off on a shape server that captured plain (depth 0 among its captured depths): held as
    a one-tier off table, and one of the switching table's probes."""
    held = decode_table(encode_table(held_table(None, 3)), captured_depths={0, 3},
                        captured_trees={TREE})
    assert held is not None and held.describe() == "1+: off"
    assert TierSelector(held).select_shape(200) == (None, False)
    table = switching_table(TREE, [CHAIN, None], version=4)
    assert table.tiers[0].explore_depths == (0, 3)
    decoded = decode_table(encode_table(table), captured_depths={0, 3}, captured_trees={TREE})
    assert decoded == table
    selector = TierSelector(decoded)
    probes = {shape for shape, probe in (selector.select_shape(8) for _ in range(400)) if probe}
    assert probes == {CHAIN, None}
    with pytest.raises(PolicyError, match="depth 0 was not captured"):
        decode_table(encode_table(table), captured_depths={3}, captured_trees={TREE})


def test_a_server_that_captured_no_tree_refuses_the_switching_table() -> None:
    with pytest.raises(PolicyError, match="captured trees: none"):
        decode_table(encode_table(switching_table(TREE, [CHAIN], 1)), captured_depths={3})


RUN34 = Path(__file__).parent.parent / "benchmarks/results/gpu/h100-sglang-0.5.17-seeded-8b-run34"


def test_the_held_benches_give_the_table_a_shape_server_runs(tmp_path: Path) -> None:
    """Run 34's benches of its shape server held at each shape (H100, family a): the tree at
    one stream, the chain at 16 and 64 (the tree's 64-stream level finished too few requests to
    decide either way). The table comes back as a policy file the shape server accepts."""
    held = tmp_path / "held"
    for shape in ("3x4x16", "3x1x4"):
        (held / shape).mkdir(parents=True)
        shutil.copy(RUN34 / "treeswitch" / f"held-{shape}" / "a.json", held / shape / "a.json")
    lines = held_tables(held, [TREE, CHAIN])
    assert lines == {"a": "1-6: 3x4x16 | 7+: d3"}  # tok/s cross near 7 streams in log load
    table = load_policy_file(held / "table_a.json", captured_depths={3}, captured_trees={TREE})
    assert TierSelector(table).select_shape(1) == (TREE, False)
    assert TierSelector(table).select_shape(64) == (CHAIN, False)
    assert (held / "shapes.txt").is_file()


RUN30 = Path(__file__).parent.parent / "benchmarks/results/gpu/h200-sglang-0.5.17-seeded-8b-run30"


def test_plain_held_beside_the_shapes_gives_the_table_an_off_tier(tmp_path: Path) -> None:
    """Run 30's static servers of family b (H200) as if held on one shape server with plain:
    the tree at 1-16 streams, the chain at 64, plain at 128 and 256. The table's off tier is
    what a shape server that captured plain (depth 0) accepts."""
    held = tmp_path / "held"
    for shape in ("3x4x16", "3x1x4", "plain"):
        (held / shape).mkdir(parents=True)
        shutil.copy(RUN30 / "shapes" / shape / "b.json", held / shape / "b.json")
    lines = held_tables(held, [TREE, CHAIN, None])
    assert lines == {"b": "1-19: 3x4x16 | 20-100: d3 | 101+: off"}
    table = load_policy_file(held / "table_b.json", captured_depths={0, 3},
                             captured_trees={TREE})
    assert TierSelector(table).select_shape(256) == (None, False)
    assert "plain" in (held / "shapes.txt").read_text()


def test_the_table_is_judged_against_the_best_held_shape_at_each_load(tmp_path: Path) -> None:
    """Run 34's held benches; the table's bench here is the held chain's own file, as if the
    table had run the chain throughout: level for level it matches the best where the chain is
    best (16 streams) and loses the tree's margin at one stream. The tree's 64-stream level
    finished too few requests: the chain is the only scored shape there."""
    for shape in ("3x4x16", "3x1x4"):
        (tmp_path / "held" / shape).mkdir(parents=True)
        shutil.copy(RUN34 / "treeswitch" / f"held-{shape}" / "a.json",
                    tmp_path / "held" / shape / "a.json")
    (tmp_path / "table").mkdir()
    shutil.copy(RUN34 / "treeswitch" / "held-3x1x4" / "a.json", tmp_path / "table" / "a.json")
    rows = {r["streams"]: r for r in table_vs_best(tmp_path, "a")}
    tok = {shape: {lv["concurrency"]: lv["output_tok_per_s"] for lv in json.loads(
        (RUN34 / "treeswitch" / f"held-{shape}" / "a.json").read_text())["levels"]}
        for shape in ("3x4x16", "3x1x4")}  # fmt: skip
    assert rows[1]["best_shape"] == "3x4x16" and rows[1]["best"] == tok["3x4x16"][1]
    assert rows[1]["ratio"] == round(tok["3x1x4"][1] / tok["3x4x16"][1], 3) < 0.9
    assert rows[16]["best_shape"] == "3x1x4" and rows[16]["ratio"] == 1.0
    assert rows[64]["best_shape"] == "3x1x4" and rows[64]["ratio"] == 1.0


def test_the_step_pushes_through_the_bench_client_and_says_what_was_refused(
    sim_server_factory,  # type: ignore[no-untyped-def]
) -> None:
    """A real `specctl sim serve` over loopback: a chain held, read back live; a tree the server
    did not capture refused with the server's own reason, as a step error."""
    server = sim_server_factory(admin_key="k", speedup=1.0)
    push(server.base_url, "k", held_table(CHAIN, 7))
    with ServerClient(server.base_url, "k") as client:
        assert client.state().table == held_table(CHAIN, 7)
    with pytest.raises(StepError, match="captured trees: none"):
        push(server.base_url, "k", held_table(TREE, 8))
