"""A simulated shape server switching among captured shapes (`sims.shape_server.switching_server`,
`sims.shape_switch`), on the profile fitted to run 30's real bench of shapes (checked in by
benchmarks/shape_sim_check.py): a shape held inside it runs as its own static server, a table
runs each load's shape, the closed loop compares it with every static shape, and `specctl sim
shapes` prints and writes it."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from controller.cli import load_commands
from sglang_hooks.contract import PolicyTable, Tier, parse_table, shape_tier
from sglang_hooks.draft_shape import parse_shape
from sims.engine import TREE_LANE_BASE, Engine
from sims.policies import FixedDepthPolicy, ShapeTablePolicy
from sims.profile import load_profile
from sims.shape_server import ShapeQuestionError, shape_server, switching_server
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
    (["3x1x4", "plain"], "plain is not switchable on a shape server"),
    (["3x1x4", "4x2x8"], "shape 4x2x8 is not in profile"),
    ([], "at least one drafting shape"),
])  # fmt: skip
def test_a_shape_server_of_what_it_cannot_capture_is_refused(profile, names: list[str],
                                                             message: str) -> None:  # fmt: skip
    with pytest.raises(ShapeQuestionError, match=message):
        switching_server(profile, names)


def test_a_table_naming_an_uncaptured_shape_or_off_is_refused(profile) -> None:  # type: ignore[no-untyped-def]
    """As the plugin refuses it: a shape server runs the shapes it captured, and no off yet."""
    server = switching_server(profile, ["3x4x16", "3x1x4"])
    off = PolicyTable.build([shape_tier(1, parse_shape("3x4x16")), Tier(16, 0)])
    with pytest.raises(ValueError, match=r"runs plain, which the server did not capture"):
        ShapeTablePolicy(off, random.Random(0), server.keys)
    deeper = PolicyTable.build([shape_tier(1, parse_shape("3x4x16")), Tier(16, 5)])
    with pytest.raises(ValueError, match="runs 5x1x6"):
        ShapeTablePolicy(deeper, random.Random(0), server.keys)


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
    # family b: plain is best at 128 streams, so the best table has off; a shape server runs
    # the drafting shapes' table, and that is what the policy file holds
    best = parse_table(doc["tables"]["b"])
    switching = parse_table(doc["switch_tables"]["b"])
    assert best.tiers[-1].depth == 0 and all(t.depth > 0 for t in switching.tiers)
    assert switching.tiers[0].shape == parse_shape("3x4x16")
    written = (tmp_path / "b.yaml").read_text()
    assert "3x4x16" in written and "depth: 0" not in written
    assert [(p["shape"], p["concurrency"]) for p in doc["switched"]] == [
        (TABLE, 1), (TABLE, 128)]
    loop = doc["closed_loop"]["b"]
    assert loop["steps"] == [1, 128, 1] and set(loop["table_over"]) == set(SHAPES)
    code, out = _cli("--phase", "b", "--streams", "1,128", "--duration", "20", "--warmup", "4",
                     "--closed-loop", "10")  # fmt: skip
    flat = " ".join(out.split())
    assert code == 0 and "on a shape server (no off yet): 1-" in flat
    assert "closed loop over 1, 128, 1 streams (10 s each), phase b" in flat
    assert "table (switching)" in flat and "switched for free" in flat


@pytest.mark.parametrize("value", ["-1", "inf", "nan"])
def test_a_closed_loop_of_no_sense_is_one_line(value: str) -> None:
    code, out = _cli("--closed-loop", value)
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1, out
    assert lines[0].startswith("error: --closed-loop: must be >= 0 simulated seconds per load")
