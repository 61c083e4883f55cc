"""The contract: table validation, lookup with hysteresis, exploration, RPC encoding."""

from __future__ import annotations

import random

import pytest

from sglang_hooks.contract import (
    BS_BUCKET_EDGES,
    PolicyError,
    PolicyTable,
    Tier,
    TierSelector,
    bs_bucket,
    bucket_upper,
    decode_table,
    encode_table,
    lookup,
    parse_rejection,
    parse_table,
    push_body,
    read_server_state,
    rejection_body,
    server_state,
    single_depth_table,
    split_policy_keys,
)

THREE_TIERS = {
    "version": 4,
    "tiers": [
        {"min_batch": 1, "depth": 3},
        {"min_batch": 8, "depth": 1, "hysteresis": 2, "explore_share": 0.05,
         "explore_depths": [0, 3]},
        {"min_batch": 32, "depth": 0, "hysteresis": 4},
    ],
}  # fmt: skip


def table() -> PolicyTable:
    return parse_table(THREE_TIERS, captured_depths=[0, 1, 3])


def test_plain_reading_partitions_batch_sizes() -> None:
    t = table()
    assert [t.depth_for(b) for b in (1, 7, 8, 31, 32, 500)] == [3, 3, 1, 1, 0, 0]
    assert t.describe() == "1-7: d3 | 8-31: d1 (probes) | 32+: off"
    split = PolicyTable.build([Tier(1, 2), Tier(4, 2, explore_share=0.01, explore_depths=(1,)),
                               Tier(9, 1)])
    assert split.describe() == "1-8: d2 (probes) | 9+: d1"
    assert t.depths == {0, 1, 3}


def test_hysteresis_enters_at_threshold_and_leaves_below_band() -> None:
    t = table()
    tier = None
    seen = []
    for b in (5, 8, 7, 6, 5, 9, 32, 29, 28, 27, 40):
        tier = lookup(t, b, tier)
        seen.append(tier)
    # up at 8; stays in tier 1 at 7 and 6 (band 6..7), leaves at 5; up at 32; stays at 29/28;
    # leaves tier 2 at 27 (< 32-4) into tier 1.
    assert seen == [0, 1, 1, 1, 0, 1, 2, 2, 2, 1, 2]


def test_lookup_can_fall_several_tiers_at_once() -> None:
    assert lookup(table(), 1, 2) == 0
    assert lookup(table(), 6, 2) == 1  # inside tier 1's band: stops there


def test_selector_is_deterministic_under_a_seed_and_explores_at_the_share() -> None:
    runs = []
    for _ in range(2):
        sel = TierSelector(table(), rng=random.Random(7))
        runs.append([sel.select(10) for _ in range(20000)])
    assert runs[0] == runs[1]
    probes = [d for d, explored in runs[0] if explored]
    assert 0.04 < len(probes) / 20000 < 0.06
    assert set(probes) == {0, 3}
    assert all(d == 1 for d, explored in runs[0] if not explored)


def test_selector_never_explores_in_tiers_without_share() -> None:
    sel = TierSelector(table(), rng=random.Random(1))
    assert all(sel.select(2) == (3, False) for _ in range(5000))


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d["tiers"][0].update(min_batch=2), "tiers[0].min_batch"),
        (lambda d: d["tiers"][1].update(min_batch=-3), "tiers[1].min_batch"),
        (lambda d: d["tiers"][2].update(min_batch=8), "tiers[2].min_batch"),
        (lambda d: d["tiers"][1].update(depth=5), "tiers[1].depth"),
        (lambda d: d["tiers"][1].update(depth="3"), "tiers[1].depth"),
        (lambda d: d["tiers"][2].update(hysteresis=24), "tiers[2].hysteresis"),
        (lambda d: d["tiers"][0].update(hysteresis=1), "tiers[0].hysteresis"),
        (lambda d: d["tiers"][1].update(explore_share=1.5), "tiers[1].explore_share"),
        (lambda d: d["tiers"][1].update(explore_share=float("nan")), "tiers[1].explore_share"),
        (lambda d: d["tiers"][1].update(explore_depths=[1]), "tiers[1].explore_depths[0]"),
        (lambda d: d["tiers"][1].update(explore_depths=[]), "tiers[1].explore_depths"),
        (lambda d: d["tiers"][1].update(explore_depths=[7]), "tiers[1].explore_depths[0]"),
        (lambda d: d["tiers"][1].update(speed=3), "tiers[1].speed"),
        (lambda d: d["tiers"][1].pop("depth"), "tiers[1].depth"),
        (lambda d: d.update(version=-1), "version"),
        (lambda d: d.update(tiers=[]), "tiers"),
    ],
)
def test_bad_tables_name_the_field(mutate, field) -> None:  # type: ignore[no-untyped-def]
    import copy

    data = copy.deepcopy(THREE_TIERS)
    mutate(data)
    with pytest.raises(PolicyError) as info:
        parse_table(data, captured_depths=[0, 1, 3])
    assert info.value.field == field
    assert field in str(info.value)


def test_uncaptured_depth_message_lists_the_captured_ones() -> None:
    with pytest.raises(PolicyError, match=r"captured: \[0, 1, 3\]"):
        single_depth_table(5).__class__.build([Tier(1, 5)], captured_depths=[0, 1, 3])


def test_rpc_encoding_round_trips_with_numbers_only() -> None:
    t = table()
    body = push_body(t)
    assert all(isinstance(v, (int, float)) for v in body["server_args"].values())
    assert decode_table(body["server_args"], captured_depths=[0, 1, 3]) == t
    assert decode_table(encode_table(None)) is None


def test_rpc_decode_names_the_wire_key() -> None:
    args = encode_table(table())
    args["specctl_t1_depth"] = 5
    with pytest.raises(PolicyError) as info:
        decode_table(args, captured_depths=[0, 1, 3])
    assert info.value.field == "specctl_t1_depth"
    args = encode_table(table())
    args["specctl_t0_depth"] = "three"
    with pytest.raises(PolicyError, match="specctl_t0_depth: must be a number"):
        decode_table(args)
    args = encode_table(table())
    del args["specctl_t2_hysteresis"]
    with pytest.raises(PolicyError, match="specctl_t2_hysteresis: is required"):
        decode_table(args)
    args = encode_table(table())
    args["specctl_t9_depth"] = 1
    with pytest.raises(PolicyError, match="specctl_t9_depth: unknown key"):
        decode_table(args)


def test_split_keeps_other_sglang_keys_untouched() -> None:
    args = {**encode_table(table()), "pp_max_micro_batch_size": 8}
    ours, rest = split_policy_keys(args)
    assert rest == {"pp_max_micro_batch_size": 8}
    assert "pp_max_micro_batch_size" not in ours


def test_server_state_reads_back() -> None:
    info = {"internal_states": [{"foo": 1, "specctl": server_state(table(), [0, 1, 3],
                                                                  source="push")}]}
    (state,) = read_server_state(info)
    assert parse_table(state["table"]) == table()
    with pytest.raises(PolicyError, match="plugin is not loaded"):
        read_server_state({"internal_states": [{"foo": 1}]})


def test_buckets_cover_every_batch_size() -> None:
    for b in range(1, 1100):
        lo = bs_bucket(b)
        assert lo <= b <= bucket_upper(lo)
    assert [bs_bucket(b) for b in (1, 8, 9, 10, 33, 250)] == [1, 8, 8, 10, 32, 224]
    assert list(BS_BUCKET_EDGES) == sorted(set(BS_BUCKET_EDGES))


def test_rejection_body_round_trips_in_both_shapes() -> None:
    err = PolicyError("specctl_t1_depth", "depth 5 was not captured")
    body = rejection_body(err)
    assert body["code"] == 400 and isinstance(body["message"], str)
    for shape in (body, err.to_json()):
        back = parse_rejection(shape)
        assert back is not None
        assert (back.field, back.message) == (err.field, err.message)
    assert parse_rejection({"object": "error", "message": "Bad Request", "code": 400}) is None
    assert parse_rejection([False]) is None


def test_fingerprint_names_the_tiers_not_the_version():
    a = PolicyTable.build([Tier(1, 3), Tier(16, 1, hysteresis=2)], version=7)
    b = PolicyTable.build([Tier(1, 3), Tier(16, 1, hysteresis=2)], version=12)
    c = PolicyTable.build([Tier(1, 3), Tier(17, 1, hysteresis=2)], version=7)
    assert a.fingerprint == b.fingerprint != c.fingerprint
    assert len(a.fingerprint) == 8 and int(a.fingerprint, 16) >= 0
    assert a.label() == f"v7 #{a.fingerprint}"
