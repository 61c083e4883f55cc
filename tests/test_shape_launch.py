"""The launch rules of a server that steers draft trees (sglang_hooks/shape_launch.py): the
shape SGLang starts at, the flags added, and every refusal as one line naming the fix."""

from __future__ import annotations

import pytest

from sglang_hooks.draft_shape import DraftShape, ShapeError, parse_shapes
from sglang_hooks.shape_launch import SHAPES_ENV, shape_launch

BASE = ["--model-path", "m", "--speculative-algorithm", "EAGLE3",
        "--speculative-draft-model-path", "d"]  # fmt: skip


def test_a_tree_list_starts_sglang_at_the_dominating_shape_on_fa3() -> None:
    launch = shape_launch(parse_shapes("3x1x4,3x4x16"), BASE)
    assert launch.start == DraftShape(3, 4, 16)
    assert launch.args == ["--speculative-num-steps", "3", "--speculative-eagle-topk", "4",
                           "--speculative-num-draft-tokens", "16",
                           "--attention-backend", "fa3"]  # fmt: skip
    assert launch.env == {SHAPES_ENV: "3x1x4,3x4x16"}
    assert "32 KV slots per decode at every tier" in launch.notes[0]
    assert "keeps 8)" in launch.notes[0]
    # Flags the user already gave at the dominating shape's values are kept, not repeated.
    given = [*BASE, "--speculative-eagle-topk", "4", "--attention-backend", "fa3"]
    assert shape_launch(parse_shapes("3x4x16,1x1x2"), given).args == [
        "--speculative-num-steps", "3", "--speculative-num-draft-tokens", "16"]  # fmt: skip


def test_plain_beside_a_tree_is_captured_as_off_and_kept_in_the_list() -> None:
    """Off is SGLang's depth 0 on the tree server: the tree still sizes SGLang, and the plugin
    reads plain from SPECCTL_SHAPES as given."""
    launch = shape_launch(parse_shapes("3x4x16,3x1x4,plain"), BASE)
    assert launch.start == DraftShape(3, 4, 16)
    assert launch.args == shape_launch(parse_shapes("3x4x16,3x1x4"), BASE).args
    assert launch.env == {SHAPES_ENV: "3x4x16,3x1x4,plain"}
    [off] = [n for n in launch.notes if n.startswith("plain:")]
    assert "depth 0" in off and "draft extend skipped" in off and "3x4x16's KV reserve" in off
    assert shape_launch(parse_shapes("plain,3x4x16"), BASE).env == {SHAPES_ENV: "plain,3x4x16"}


@pytest.mark.parametrize(
    ("shapes", "extra", "words"),
    [
        ("plain,1x1x2,3x1x4", [], "chains only: pass --depths 0,1,3"),
        ("3x4x8,5x2x12", [], "add 3x4x12"),
        ("3x4x16", ["--speculative-adaptive"], "drop --speculative-adaptive"),
        ("3x4x16", ["--speculative-adaptive-config", "c.json"],
         "drop --speculative-adaptive-config"),
        ("3x4x16,5x8x32", ["--speculative-eagle-topk", "4"],
         "--speculative-eagle-topk 4: SGLang must start at 5x8x32"),
        ("3x4x16", ["--attention-backend", "flashinfer"], "pass --attention-backend fa3"),
        ("3x4x16", ["--page-size", "16"], "--page-size 16 with tree shape 3x4x16"),
        ("3x4x16", ["--enable-two-batch-overlap"], "--enable-two-batch-overlap"),
        ("3x4x16", ["--enable-dp-attention"], "drop it"),
        ("3x4x16", ["--pp-size", "2"], "pipeline parallelism"),
        ("3x4x16", ["--tp-size", "2"], "on one GPU for now (--tp-size 2)"),
        ("plain,3x4x8,5x2x12", [], "add 3x4x12"),
    ],
)
def test_what_a_shape_server_cannot_run_is_refused_with_the_fix(shapes, extra, words) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ShapeError) as info:
        shape_launch(parse_shapes(shapes), [*BASE, *extra])
    assert words in str(info.value) and "\n" not in str(info.value)


def test_trees_need_eagle() -> None:
    args = ["--model-path", "m", "--speculative-algorithm", "NGRAM"]
    with pytest.raises(ShapeError, match="got NGRAM"):
        shape_launch(parse_shapes("3x4x16"), args)
    with pytest.raises(ShapeError, match="got none"):
        shape_launch(parse_shapes("3x4x16"), ["--model-path", "m"])
