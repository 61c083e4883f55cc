"""The best shape per load as a policy table (sims/shape_table.py): tiers at the loads where
the best shape changes, edges where the two shapes' tok/s cross in log load, trees as tree
tiers a server that captured them accepts."""

from __future__ import annotations

from sglang_hooks.contract import parse_table
from sglang_hooks.draft_shape import DraftShape
from sims.shape_table import shape_table

STREAMS = [1, 4, 16, 64, 128, 256]
# Run 30's family b on the H200 (tok/s), rounded: the tree leads to 16 streams, the chain at
# 64, the plain server from 128.
FAMILY_B = {
    "3x1x4": [306, 1200, 4231, 10705, 12856, 14939],
    "3x4x16": [488, 1791, 4679, 6260, 6708, 5976],
    "plain": [203, 789, 2898, 9072, 13974, 19919],
}


def test_the_table_runs_the_best_shape_at_every_measured_load() -> None:
    table = shape_table(STREAMS, FAMILY_B)
    assert table is not None
    assert table.describe() == "1-19: 3x4x16 | 20-101: d3 | 102+: off"
    best = {s: max(FAMILY_B, key=lambda lb: FAMILY_B[lb][i]) for i, s in enumerate(STREAMS)}
    runs = {s: table.tiers[[t.min_batch <= s for t in table.tiers].count(True) - 1].shape
            for s in STREAMS}  # fmt: skip
    label = {DraftShape(3, 1, 4): "3x1x4", DraftShape(3, 4, 16): "3x4x16", None: "plain"}
    assert {s: label[shape] for s, shape in runs.items()} == best
    # The edges lie where the ratios cross: 3x4x16 / 3x1x4 is 1.106 at 16 and 0.585 at 64,
    # so log-linear in load it meets 1 at 19.9 streams; 3x1x4 / plain (1.180 at 64, 0.920 at
    # 128) at 101.4.
    assert [t.min_batch for t in table.tiers] == [1, 20, 102]
    assert [t.hysteresis for t in table.tiers] == [0, 2, 13]


def test_a_server_that_captured_the_shapes_accepts_the_table() -> None:
    table = shape_table(STREAMS, FAMILY_B, version=5)
    assert table is not None and table.version == 5
    again = parse_table(table.to_json(), captured_depths=[0, 3],
                        captured_trees=[DraftShape(3, 4, 16)])  # fmt: skip
    assert again == table


def test_an_unmeasured_side_puts_the_edge_halfway_and_an_unscored_load_gives_none() -> None:
    tok = {"3x4x16": [400.0, None], "3x1x4": [300.0, 900.0]}
    table = shape_table([4, 16], tok)
    assert table is not None and [t.min_batch for t in table.tiers] == [1, 8]
    assert shape_table([4, 16], {"3x1x4": [300.0, None]}) is None
    # One shape best everywhere: one tier.
    single = shape_table([1, 8], {"3x1x4": [3.0, 9.0], "plain": [1.0, 8.0]})
    assert single is not None and single.describe() == "1+: d3"
