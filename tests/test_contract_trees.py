"""Tree tiers in the contract: a tier that names a draft tree (`topk`, `draft_tokens`) and tree
probes (`explore_trees`) are validated against the trees a server captured, round-trip through
the numeric admin RPC, read back from `server_state`, and leave a chain table's form, wire body
and fingerprint as they were. Also the shape a shape list must start SGLang at."""

from __future__ import annotations

import copy

import pytest

from sglang_hooks.contract import (
    PolicyError,
    PolicyTable,
    TierSelector,
    decode_table,
    encode_table,
    parse_table,
    read_server_state,
    server_state,
    state_trees,
)
from sglang_hooks.draft_shape import (
    DraftShape,
    ShapeError,
    dominating,
    kv_slots_per_request,
    parse_shape,
    parse_shapes,
)

TREE = DraftShape(3, 4, 16)
WIDE = DraftShape(5, 8, 32)
DEPTHS = [0, 1, 3]
TREE_TABLE = {
    "version": 7,
    "tiers": [
        {"min_batch": 1, "depth": 3, "topk": 4, "draft_tokens": 16, "explore_share": 0.1,
         "explore_depths": [3], "explore_trees": ["5x8x32"]},
        {"min_batch": 16, "depth": 3, "hysteresis": 2},
        {"min_batch": 96, "depth": 0, "explore_share": 0.05, "explore_trees": ["3x4x16"]},
    ],
}  # fmt: skip


def tree_table() -> PolicyTable:
    return parse_table(TREE_TABLE, captured_depths=DEPTHS, captured_trees=[TREE, WIDE])


def test_a_tree_tier_runs_its_shape_and_reads_as_one() -> None:
    t = tree_table()
    assert t.tiers[0].shape == TREE and t.tiers[1].shape == DraftShape(3, 1, 4)
    assert t.tiers[2].shape is None
    assert t.tiers[0].explore_shapes == (DraftShape(3, 1, 4), WIDE)
    assert t.depths == {0, 3} and t.trees == {TREE, WIDE}
    assert t.describe() == "1-15: 3x4x16 (probes) | 16-95: d3 | 96+: off (probes)"


def test_tree_tables_round_trip_through_the_numeric_rpc() -> None:
    t = tree_table()
    args = encode_table(t)
    assert all(isinstance(v, (int, float)) for v in args.values())
    assert args["specctl_t0_topk"] == 4 and args["specctl_t0_draft"] == 16
    assert args["specctl_t0_explore_trees"] == 1 and args["specctl_t0_x0_draft"] == 32
    assert "specctl_t1_topk" not in args and "specctl_t1_explore_trees" not in args
    assert decode_table(args, captured_depths=DEPTHS, captured_trees=[TREE, WIDE]) == t


def test_a_chain_table_is_written_and_fingerprinted_as_before_trees() -> None:
    """The wire keys and JSON of a chain table carry no tree field, so a plugin that predates
    trees accepts what today's daemon pushes, and stored fingerprints still match."""
    chain_only = {"version": 1, "tiers": [{"min_batch": 1, "depth": 3},
                                          {"min_batch": 8, "depth": 0}]}  # fmt: skip
    t = parse_table(chain_only, captured_depths=DEPTHS)
    assert set(encode_table(t)) == {"specctl_version", "specctl_tiers"} | {
        f"specctl_t{i}_{f}" for i in (0, 1)
        for f in ("min_batch", "depth", "hysteresis", "explore_share", "explore_mask")
    }  # fmt: skip
    assert set(t.to_json()["tiers"][0]) == {"min_batch", "depth", "hysteresis", "explore_share",
                                            "explore_depths"}  # fmt: skip
    assert t.fingerprint == "2f9e5bec"  # as computed before tree tiers existed
    # A chain written out in full is the same table.
    full = copy.deepcopy(chain_only)
    full["tiers"][0].update(topk=1, draft_tokens=4)
    assert parse_table(full, captured_depths=DEPTHS) == t


def test_a_server_that_captured_no_tree_refuses_one_and_says_how_to_get_it() -> None:
    with pytest.raises(PolicyError) as info:
        parse_table(TREE_TABLE, captured_depths=DEPTHS)
    assert info.value.field == "tiers[0]"
    assert info.value.message.endswith("(captured trees: none); use a captured shape")
    with pytest.raises(PolicyError) as info:
        parse_table(TREE_TABLE, captured_depths=DEPTHS, captured_trees=[TREE])
    assert info.value.field == "tiers[0].explore_trees[0]"
    assert "5x8x32" in info.value.message and "captured trees: 3x4x16" in info.value.message
    # A server not known (no captured depths given): only the shape rules apply.
    assert parse_table(TREE_TABLE).trees == {TREE, WIDE}


@pytest.mark.parametrize(
    ("mutate", "field", "words"),
    [
        (lambda d: d["tiers"][0].update(draft_tokens=40), "tiers[0].draft_tokens", "2..37"),
        (lambda d: d["tiers"][0].pop("draft_tokens"), "tiers[0].draft_tokens", "needs"),
        (lambda d: d["tiers"][0].update(topk=0), "tiers[0].topk", "[1, 15]"),
        (lambda d: d["tiers"][1].update(draft_tokens=9), "tiers[1].draft_tokens", "drop"),
        (lambda d: d["tiers"][1].update(depth="3", draft_tokens=4), "tiers[1].depth", "integer"),
        (lambda d: d["tiers"][0].update(explore_trees=["3x4x16"]), "tiers[0].explore_trees[0]",
         "own shape"),
        (lambda d: d["tiers"][2].update(explore_trees=["3x1x4"]), "tiers[2].explore_trees[0]",
         "explore_depths"),
        (lambda d: d["tiers"][2].update(explore_trees=["3x4"]), "tiers[2].explore_trees[0]",
         "STEPSxTOPKxDRAFT"),
        (lambda d: d["tiers"][2].update(explore_trees="3x4x16"), "tiers[2].explore_trees",
         "list"),
        (lambda d: d["tiers"][2].update(explore_trees=["3x4x16", "3x4x16"]),
         "tiers[2].explore_trees", "repeat"),
    ],
)
def test_bad_tree_tiers_name_the_field(mutate, field, words) -> None:  # type: ignore[no-untyped-def]
    data = copy.deepcopy(TREE_TABLE)
    mutate(data)
    with pytest.raises(PolicyError) as info:
        parse_table(data, captured_depths=DEPTHS, captured_trees=[TREE, WIDE])
    assert info.value.field == field and words in info.value.message


def test_a_bad_tree_on_the_wire_names_the_key_the_sender_set() -> None:
    args = encode_table(tree_table())
    args["specctl_t0_draft"] = 99
    with pytest.raises(PolicyError) as info:
        decode_table(args, captured_depths=DEPTHS, captured_trees=[TREE, WIDE])
    assert info.value.field == "specctl_t0_draft"
    args = encode_table(tree_table())
    args["specctl_t0_x0_steps"] = 2  # 2x8x32 was not captured
    with pytest.raises(PolicyError) as info:
        decode_table(args, captured_depths=DEPTHS, captured_trees=[TREE, WIDE])
    assert info.value.field == "specctl_t0_x0_steps"
    args = encode_table(tree_table())
    args["specctl_t2_x1_topk"] = 4  # a probe beyond the count
    with pytest.raises(PolicyError, match="specctl_t2_x1_topk: unknown key"):
        decode_table(args)
    args = encode_table(tree_table())
    args["specctl_t2_explore_trees"] = 9
    with pytest.raises(PolicyError, match=r"specctl_t2_explore_trees: must be in \[0, 4\]"):
        decode_table(args)


def test_server_state_reports_captured_trees_only_where_there_are_some() -> None:
    with_trees = server_state(tree_table(), DEPTHS, source="push", captured_trees=[WIDE, TREE])
    assert with_trees["captured_trees"] == ["3x4x16", "5x8x32"]
    (state,) = read_server_state({"internal_states": [{"specctl": with_trees}]})
    assert state_trees(state) == (TREE, WIDE)
    assert parse_table(state["table"], DEPTHS, state_trees(state)) == tree_table()
    assert "captured_trees" not in server_state(None, DEPTHS, source="none")
    with pytest.raises(PolicyError, match="captured_trees: 3x1x4 is not a tree"):
        state_trees({"captured_trees": ["3x1x4"]})


def test_the_selector_still_answers_depths_for_a_tree_table() -> None:
    """The selector's hot path is unchanged; a tree tier answers its steps (the plugin's shape
    runtime reads the tier's shape)."""
    sel = TierSelector(tree_table())
    assert sel.select(20) == (3, False) and sel.tier == 1
    assert sel.select(2)[0] == 3 and sel.table.tiers[0].shape == TREE


def test_the_dominating_shape_is_the_largest_in_what_sglang_sizes_once() -> None:
    assert dominating(parse_shapes("plain,3x1x4,3x4x16,1x1x2")) == TREE
    assert dominating(parse_shapes("plain,3x1x4,5x1x6")) == DraftShape(5, 1, 6)
    assert dominating(parse_shapes("plain")) is None
    # 5x2x12 has the most draft tokens, 3x4x8 the widest top-k and most draft slots (12 each).
    with pytest.raises(ShapeError, match=r"add 3x4x12$"):
        dominating(parse_shapes("3x4x8,5x2x12"))
    # The covering tree must score enough candidates: 1x4x5 holds at most 5 tokens.
    with pytest.raises(ShapeError, match=r"add 2x4x9$"):
        dominating(parse_shapes("1x4x5,8x1x9"))
    assert kv_slots_per_request(TREE) == 32 and kv_slots_per_request(parse_shape("3x1x4")) == 8
    assert kv_slots_per_request(None) == 0
