"""A simulated shape server switching among captured shapes (`sims.shape_server.switching_server`,
`sims.shape_switch`), on the profile fitted to run 30's real bench of shapes (checked in by
benchmarks/shape_sim_check.py): a shape held inside it runs as its own static server, off
(plain captured) as the plain server plus spec-v2's scheduling, a table runs each load's shape,
the closed loop compares it with every static shape, and `specctl sim shapes` prints and writes
it."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from controller.cli import load_commands
from sglang_hooks.contract import PolicyTable, Tier, parse_table, shape_tier
from sglang_hooks.draft_shape import parse_shape
from sims.engine import TREE_LANE_BASE, Engine
from sims.policies import FixedDepthPolicy, ShapeTablePolicy
from sims.profile import load_profile
from sims.shape_server import OFF_LANE, ShapeQuestionError, shape_server, switching_server
from sims.shape_switch import TABLE, closed_loop, staircase
from sims.workload import Workload

app = load_commands()
PROFILE = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "shape_sim_run30.yaml"
SHAPES = ["3x1x4", "3x4x16", "5x8x32", "plain"]


@pytest.fixture(scope="module")
def profile():  # type: ignore[no-untyped-def]
    return load_profile(PROFILE)


def _tok_per_s(engine: Engine, warmup: float, seconds: float) -> float:
    engine.run_until(warmup)
    start = engine.stats.copy()
    engine.run_until(warmup + seconds)
    return engine.stats.tok_per_s_since(start)


def _load(streams: int, phase: str = "b") -> Workload:
    return Workload.closed(streams, prompt_tokens=1024, output_tokens=(128, 384), phase=phase)


@pytest.mark.parametrize("name", ["3x1x4", "3x4x16", "5x8x32"])
@pytest.mark.parametrize("streams", [1, 32])
def test_a_shape_held_inside_a_shape_server_runs_as_its_static_server(
    profile, name: str, streams: int,  # type: ignore[no-untyped-def]
) -> None:
    """Same seed, same load: held at one lane, the switching server's run is the static shape
    server's, token for token (the lane's cost and acceptance are the shape's)."""
    server = switching_server(profile, ["3x1x4", "3x4x16", "5x8x32"])
    static = shape_server(profile, name)
    assert static.depth is not None
    held = Engine(server.profile, _load(streams), seed=3, lanes=server.lanes,
                  policy=FixedDepthPolicy(server.keys[name]))  # fmt: skip
    alone = Engine(static.profile, _load(streams), seed=3, policy=FixedDepthPolicy(static.depth))
    assert _tok_per_s(held, 5, 20) == _tok_per_s(alone, 5, 20) > 0
    assert held.stats.accept_length == alone.stats.accept_length > 1


def test_lanes_key_chains_by_depth_and_trees_apart(profile) -> None:  # type: ignore[no-untyped-def]
    server = switching_server(profile, ["3x4x16", "3x1x4"])
    assert server.keys == {"3x4x16": TREE_LANE_BASE, "3x1x4": 3}
    assert {k: lane.steps for k, lane in server.lanes.items()} == {TREE_LANE_BASE: 3, 3: 3}
    assert server.profile.full_depth == 3


@pytest.mark.parametrize(("names", "message"), [
    (["plain"], "at least one drafting shape"),
    (["3x1x4", "4x2x8"], "shape 4x2x8 is not in profile"),
    ([], "at least one drafting shape"),
])  # fmt: skip
def test_a_shape_server_of_what_it_cannot_capture_is_refused(profile, names: list[str],
                                                             message: str) -> None:  # fmt: skip
    with pytest.raises(ShapeQuestionError, match=message):
        switching_server(profile, names)


def test_a_table_naming_an_uncaptured_shape_or_off_is_refused(profile) -> None:  # type: ignore[no-untyped-def]
    """As the plugin refuses it: a shape server runs the shapes it captured, off only when it
    captured plain."""
    server = switching_server(profile, ["3x4x16", "3x1x4"])
    off = PolicyTable.build([shape_tier(1, parse_shape("3x4x16")), Tier(16, 0)])
    with pytest.raises(ValueError, match=r"runs plain, which the server did not capture"):
        ShapeTablePolicy(off, random.Random(0), server.keys)
    deeper = PolicyTable.build([shape_tier(1, parse_shape("3x4x16")), Tier(16, 5)])
    with pytest.raises(ValueError, match="runs 5x1x6"):
        ShapeTablePolicy(deeper, random.Random(0), server.keys)


def test_plain_is_off_lane_0_costed_as_the_plain_server_plus_spec_scheduling(
    profile,  # type: ignore[no-untyped-def]
) -> None:
    """Off is a lane of 0 steps keyed 0 (a chain's key is its depth), reported among the
    captured depths; at every batch and context it costs the static plain server's iteration
    plus `draft.spec_sched_ms`, and the view runs it with the extend skipped and the draft's
    prefill kept, as the plugin's off on a shape server."""
    server = switching_server(profile, ["3x4x16", "3x1x4", "plain"])
    assert server.keys == {"3x4x16": TREE_LANE_BASE, "3x1x4": 3, "plain": OFF_LANE} \
        and OFF_LANE == 0
    off = server.lanes[OFF_LANE]
    assert (off.label, off.steps) == ("plain", 0)
    assert server.profile.captured_depths == [0, 3] and server.profile.full_depth == 3
    draft = server.profile.draft
    assert (draft.extend_at_depth0, draft.plain_decode_at_depth0, draft.prefill_at_depth0) == (
        False, False, True)
    plain = shape_server(profile, "plain").profile
    batch, context = np.array([1.0, 16, 64, 128, 256]), np.array([96.0, 500, 2000, 96, 4000])
    extra = off.cost_ms(batch, context) - plain.iteration_ms(None, batch, context)
    assert extra == pytest.approx([profile.draft.spec_sched_ms] * 5) and extra[0] > 0.1


def test_a_profile_without_plain_cannot_capture_off_and_says_how_to_get_it(
    profile,  # type: ignore[no-untyped-def]
) -> None:
    shapes = {k: v for k, v in profile.shapes.items() if k != "plain"}
    drafting = profile.model_copy(update={"shapes": shapes})
    with pytest.raises(ShapeQuestionError) as err:
        switching_server(drafting, ["3x4x16", "plain"])
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"profile {profile.name} has no plain shape")
    assert "fit the profile from a bench of shapes that includes plain: specctl sim fit" in message
    assert set(switching_server(drafting, ["3x4x16", "3x1x4"]).keys) == {"3x4x16", "3x1x4"}


@pytest.mark.parametrize("streams", [64, 256])
def test_an_off_tier_runs_depth_0_at_the_plain_server_s_tok_per_s_less_the_modelled_overhead(
    profile, streams: int,  # type: ignore[no-untyped-def]
) -> None:
    """A table `1-20: 3x4x16 | 21+: off`: under load every decode is off (lane 0, nothing
    accepted), and its tok/s is the static plain server's less what the switching server pays
    more, from the profile by hand: spec_sched_ms per decode and the draft's prefill_ms per
    prefill, over the plain server's own iterations in the same window."""
    server = switching_server(profile, ["3x4x16", "3x1x4", "plain"])
    table = PolicyTable.build([shape_tier(1, parse_shape("3x4x16")), shape_tier(21, None)])
    assert table.describe() == "1-20: 3x4x16 | 21+: off"
    switching = Engine(server.profile, _load(streams), seed=1, lanes=server.lanes,
                       policy=ShapeTablePolicy(table, random.Random(0), server.keys))  # fmt: skip
    static = shape_server(profile, "plain")
    alone = Engine(static.profile, _load(streams), seed=1, speculative=False)
    tok = _tok_per_s(switching, 5, 20)
    alone.run_until(5)
    start = alone.stats.copy()
    alone.run_until(25)
    end = alone.stats
    assert set(switching.stats.iterations_per_depth) == {OFF_LANE}
    assert switching.stats.accept_length == 1.0
    draft = profile.draft
    more_ms = ((end.decode_iterations - start.decode_iterations) * draft.spec_sched_ms
               + (end.prefill_iterations - start.prefill_iterations) * draft.prefill_ms)
    expected = 1 / (1 + more_ms / 1000 / (end.now - start.now))
    assert 0.94 < expected < 0.98
    assert tok / end.tok_per_s_since(start) == pytest.approx(expected, abs=0.01)


def test_a_table_runs_each_load_s_shape(profile) -> None:  # type: ignore[no-untyped-def]
    """Tree below 8 streams, chain from 8: at 1 stream the table's run is the tree's, at 64
    the chain's (the batch never crosses the edge there), and the iterations say which lane."""
    server = switching_server(profile, ["3x4x16", "3x1x4"])
    table = PolicyTable.build([shape_tier(1, parse_shape("3x4x16")),
                               shape_tier(8, parse_shape("3x1x4"))])  # fmt: skip
    for streams, shape in ((1, "3x4x16"), (64, "3x1x4")):
        policy = ShapeTablePolicy(table, random.Random(0), server.keys)
        switching = Engine(server.profile, _load(streams), seed=1, lanes=server.lanes,
                           policy=policy)  # fmt: skip
        static = shape_server(profile, shape)
        assert static.depth is not None
        alone = Engine(static.profile, _load(streams), seed=1,
                       policy=FixedDepthPolicy(static.depth))  # fmt: skip
        assert _tok_per_s(switching, 5, 20) == _tok_per_s(alone, 5, 20)
        assert set(switching.stats.iterations_per_depth) == {server.keys[shape]}


def test_the_closed_loop_steps_up_and_down_and_the_table_beats_the_drafting_shapes(
    profile,  # type: ignore[no-untyped-def]
) -> None:
    """On family b the tree wins at one stream, the chain at 64: the table, switching, beats
    both held alone over a 1-64 staircase, and stays under the best shape per step."""
    assert staircase([16, 1, 4]) == [1, 4, 16, 4, 1]
    table = PolicyTable.build([shape_tier(1, parse_shape("3x4x16")),
                               shape_tier(20, parse_shape("3x1x4"))])  # fmt: skip
    loop = closed_loop(profile, ["3x1x4", "3x4x16", "plain"], table, "b", [1, 64], 20.0,
                       1024, (128, 384), 0)  # fmt: skip
    assert loop.steps == [1, 64, 1]
    assert [r.label for r in loop.runs] == ["3x1x4", "3x4x16", "plain", TABLE]
    assert all(len(r.per_step) == 3 and r.completed > 0 for r in loop.runs)
    ratios = loop.ratios()
    assert ratios["3x1x4"] > 1.0 and ratios["3x4x16"] > 1.0
    assert loop.run(TABLE).tok_per_s <= loop.envelope() * 1.02
    tree, chain = loop.run("3x4x16").per_step, loop.run("3x1x4").per_step
    table_steps = loop.run(TABLE).per_step
    assert table_steps[0] > chain[0] and table_steps[1] > tree[1]
    doc = loop.to_json()
    assert set(doc["table_over"]) == {"3x1x4", "3x4x16", "plain"}
    assert doc["best_static_per_step_tok_per_s"] == round(loop.envelope(), 2)


def test_the_closed_loop_s_table_turns_drafting_off_where_plain_is_best(
    profile,  # type: ignore[no-untyped-def]
) -> None:
    """Family b, plain captured: the table's off tier at 128 streams runs near the plain
    server and ahead of the chain there, and the report compares it with plain too."""
    table = PolicyTable.build([shape_tier(1, parse_shape("3x4x16")), shape_tier(21, None)])
    loop = closed_loop(profile, ["3x1x4", "3x4x16", "plain"], table, "b", [1, 128], 20.0,
                       1024, (128, 384), 0)  # fmt: skip
    off, plain, chain = (loop.run(label).per_step[1] for label in (TABLE, "plain", "3x1x4"))
    assert 0.93 * plain < off < plain and off > chain
    tree = loop.run("3x4x16").per_step
    assert loop.run(TABLE).per_step[0] == pytest.approx(tree[0], rel=0.02)
    assert set(loop.ratios()) == {"3x1x4", "3x4x16", "plain"}


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["sim", "shapes", "--profile", str(PROFILE), *args])
    assert result.exception is None or isinstance(result.exception, SystemExit)
    return result.exit_code, result.output


def test_the_shapes_command_runs_the_table_on_a_shape_server_and_a_closed_loop(
    tmp_path: Path,
) -> None:
    code, out = _cli("--phase", "b", "--streams", "1,128", "--duration", "20", "--warmup", "4",
                     "--output-tokens", "128:384", "--closed-loop", "10", "--json",
                     "--policy-out", str(tmp_path / "b.yaml"))  # fmt: skip
    assert code == 0, out
    doc = json.loads(out[out.index("{"):])
    # family b: plain is best at 128 streams; every shape ran, plain among them, so the shape
    # server captured off and runs the best table, off tier and all, as the policy file holds
    best = parse_table(doc["tables"]["b"])
    switching = parse_table(doc["switch_tables"]["b"])
    assert switching == best and best.tiers[-1].depth == 0
    assert switching.tiers[0].shape == parse_shape("3x4x16")
    written = (tmp_path / "b.yaml").read_text()
    assert "3x4x16" in written and "depth: 0" in written
    assert [(p["shape"], p["concurrency"]) for p in doc["switched"]] == [
        (TABLE, 1), (TABLE, 128)]
    plain = next(p for p in doc["points"] if p["shape"] == "plain" and p["concurrency"] == 128)
    off = doc["switched"][1]
    assert 0.93 * plain["tok_per_s"] < off["tok_per_s"] < plain["tok_per_s"]
    loop = doc["closed_loop"]["b"]
    assert loop["steps"] == [1, 128, 1] and set(loop["table_over"]) == set(SHAPES)
    code, out = _cli("--phase", "b", "--streams", "1,128", "--duration", "20", "--warmup", "4",
                     "--closed-loop", "10")  # fmt: skip
    flat = " ".join(out.split())
    assert code == 0 and "as a table: 1-12: 3x4x16 | 13+: off" in flat
    assert "on a shape server" not in flat  # the same table
    assert "closed loop over 1, 128, 1 streams (10 s each), phase b" in flat
    assert "table (switching)" in flat and "switched for free" in flat


def test_without_plain_the_shapes_command_s_table_drafts_at_every_load() -> None:
    """Plain not listed: the server captured no off, so where plain would be best the table
    runs the best drafting shape."""
    code, out = _cli("--phase", "b", "--streams", "1,128", "--duration", "20", "--warmup", "4",
                     "--shapes", "3x4x16,3x1x4", "--json")  # fmt: skip
    assert code == 0, out
    doc = json.loads(out[out.index("{"):])
    switching = parse_table(doc["switch_tables"]["b"])
    assert switching.describe() == parse_table(doc["tables"]["b"]).describe()
    assert [t.depth for t in switching.tiers] == [3, 3] and switching.tiers[1].topk == 1


@pytest.mark.parametrize("value", ["-1", "inf", "nan"])
def test_a_closed_loop_of_no_sense_is_one_line(value: str) -> None:
    code, out = _cli("--closed-loop", value)
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1, out
    assert lines[0].startswith("error: --closed-loop: must be >= 0 simulated seconds per load")
