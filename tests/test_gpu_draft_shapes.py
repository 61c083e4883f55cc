"""Draft shapes as the shapes step takes them (benchmarks/gpu/draft_shapes.py): what parses,
what is refused and how the refusal names the fix, the SGLang flags of a shape, and the launch
of each shape's server (benchmarks/gpu/servers.shape_plan). Real dummy model folders on disk;
no server is started (the launches are only planned)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.gpu import servers
from benchmarks.gpu.context import Run
from benchmarks.gpu.draft_shapes import (
    DraftShape,
    ShapeError,
    label,
    parse_shape,
    parse_shapes,
)
from benchmarks.gpu.model_folders import TINY, ModelFolders, build_dummy_folders
from benchmarks.gpu.options import OptionError, Options, resolve, validate
from benchmarks.gpu.state import RunState
from benchmarks.gpu.steps import shapes as shapes_step


def _flag(argv: list[str], name: str) -> str:
    """The value after `name` in argv (which must hold it once)."""
    assert argv.count(name) == 1, (name, argv)
    return argv[argv.index(name) + 1]


@pytest.mark.parametrize(("text", "steps", "topk", "draft", "chain"), [
    ("3x1x4", 3, 1, 4, True),
    ("1x1x2", 1, 1, 2, True),
    ("3x4x16", 3, 4, 16, False),
    ("5x8x32", 5, 8, 32, False),
    ("4x2x8", 4, 2, 8, False),
    (" 2x2x4 ", 2, 2, 4, False),
    ("3x4x37", 3, 4, 37, False),  # the most: 4 + 2 x 16 candidates, plus the root
    ("1x4x5", 1, 4, 5, False),  # one step: topk candidates, plus the root
])  # fmt: skip
def test_chains_and_trees_parse(text: str, steps: int, topk: int, draft: int,
                                chain: bool) -> None:
    shape = parse_shape(text)
    assert shape == DraftShape(steps, topk, draft)
    assert shape.is_chain is chain and shape.label == text.strip() == label(shape)


def test_plain_is_no_shape() -> None:
    assert parse_shape("plain") is None and parse_shape(" plain ") is None
    assert label(None) == "plain"


@pytest.mark.parametrize(("text", "message"), [
    ("3x1x5", r"a chain \(topk 1\) verifies steps \+ 1 tokens: write 3x1x4"),
    ("5x1x5", "write 5x1x6"),
    ("3x4x38", r"scores 36 candidates, so its draft tokens lie in 2\.\.37"),
    ("1x4x6", r"scores 4 candidates, so its draft tokens lie in 2\.\.5"),
    ("2x2x1", r"lie in 2\.\.7"),
    ("3x4", "write STEPSxTOPKxDRAFT like 3x4x16, or plain"),
    ("3x4x16x2", "write STEPSxTOPKxDRAFT"),
    ("axbxc", "write STEPSxTOPKxDRAFT"),
    ("Plain", "write STEPSxTOPKxDRAFT"),
    ("", "write STEPSxTOPKxDRAFT"),
    ("0x1x1", "steps and topk must be >= 1"),
    ("0x4x8", "steps and topk must be >= 1"),
    ("3x0x4", "steps and topk must be >= 1"),
])  # fmt: skip
def test_shapes_that_cannot_run_are_refused_naming_the_fix(text: str, message: str) -> None:
    with pytest.raises(ShapeError, match=message) as err:
        parse_shape(text)
    assert repr(text.strip()) in str(err.value)  # the bad item is named


def test_a_shape_list_keeps_its_order_and_each_shape_once() -> None:
    assert [label(s) for s in parse_shapes("3x4x16, plain,3x1x4,")] == ["3x4x16", "plain", "3x1x4"]
    with pytest.raises(ShapeError, match="shape 3x1x4 is listed twice"):
        parse_shapes("3x1x4,plain, 3x1x4")
    with pytest.raises(ShapeError, match="shape plain is listed twice"):
        parse_shapes("plain,3x4x16,plain")
    for empty in ("", ",", " , "):
        with pytest.raises(ShapeError, match="give at least one shape"):
            parse_shapes(empty)
    with pytest.raises(ShapeError, match="write 3x1x4"):  # one bad item refuses the list
        parse_shapes("plain,3x1x3")


def test_a_tree_s_sglang_flags() -> None:
    shape = parse_shape("5x8x32")
    assert shape is not None
    assert shape.sglang_flags() == [
        "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "5",
        "--speculative-eagle-topk", "8", "--speculative-num-draft-tokens", "32"]  # fmt: skip


def _launch(shape: str, backend: str = "fa3") -> servers.ShapeLaunch:
    return servers.ShapeLaunch(shape=parse_shape(shape), max_streams=256,
                               graph_sizes=shapes_step.graph_sizes([1, 16, 256]), mem_fraction=0.8,
                               kv_tokens=196608, attention_backend=backend)


@pytest.fixture
def models(tmp_path: Path) -> ModelFolders:
    return build_dummy_folders(tmp_path, TINY)


def test_a_tree_s_server_is_stock_sglang_with_its_shape(tmp_path: Path,
                                                       models: ModelFolders) -> None:
    opts = servers.ServerOptions(backend="sglang", admin_key="k", spec_port=31000,
                                 plain_port=31001, extra_args=("--log-level", "info"))
    plan = servers.shape_plan(models, _launch("3x4x16"), opts, tmp_path / "logs")
    argv = plan.argv
    assert plan.role == servers.SHAPE and plan.url == "http://127.0.0.1:31000"
    assert plan.log == tmp_path / "logs" / "shape_3x4x16.log"
    assert argv[1:3] == ["-m", "sglang.launch_server"]  # not specctl serve: no plugin
    assert plan.env == {"SGLANG_PLUGINS": "none"} == servers.NO_PLUGINS
    assert _flag(argv, "--attention-backend") == "fa3"
    assert _flag(argv, "--speculative-algorithm") == "EAGLE3"
    assert _flag(argv, "--speculative-num-steps") == "3"
    assert _flag(argv, "--speculative-eagle-topk") == "4"
    assert _flag(argv, "--speculative-num-draft-tokens") == "16"
    assert _flag(argv, "--speculative-draft-model-path") == models.draft
    assert _flag(argv, "--model-path") == models.target
    assert _flag(argv, "--port") == "31000"
    assert _flag(argv, "--max-running-requests") == "256"
    assert _flag(argv, "--cuda-graph-max-bs-decode") == "256"
    assert _flag(argv, "--mem-fraction-static") == "0.8"
    assert _flag(argv, servers.KV_TOKENS_FLAG) == "196608"
    assert _flag(argv, "--admin-api-key") == "k"
    assert _flag(argv, "--load-format") == "dummy"
    assert _flag(argv, "--log-level") == "info"  # the run's --server-args
    sizes = argv.index("--cuda-graph-bs-decode") + 1
    assert argv[sizes:sizes + 4] == ["1", "16", "256", "--admin-api-key"]
    assert plan.describe().startswith("SGLANG_PLUGINS=none ")


def test_the_flashinfer_fallback_gets_a_larger_workspace(tmp_path: Path,
                                                        models: ModelFolders) -> None:
    opts = servers.ServerOptions(backend="sglang", admin_key="k", spec_port=1, plain_port=2)
    plan = servers.shape_plan(models, _launch("5x8x32", "flashinfer"), opts, tmp_path)
    assert _flag(plan.argv, "--attention-backend") == "flashinfer"
    assert plan.env == {"SGLANG_PLUGINS": "none",
                        "SGLANG_FLASHINFER_WORKSPACE_SIZE": str(2 * 1024**3)}
    # SGLang's own choice of backend: no flag, no workspace
    chosen = servers.shape_plan(models, _launch("5x8x32", ""), opts, tmp_path)
    assert "--attention-backend" not in chosen.argv and chosen.env == servers.NO_PLUGINS


def test_the_plain_shape_has_no_speculation(tmp_path: Path, models: ModelFolders) -> None:
    opts = servers.ServerOptions(backend="sglang", admin_key="k", spec_port=1, plain_port=2)
    plan = servers.shape_plan(models, _launch("plain"), opts, tmp_path)
    assert not any(a.startswith("--speculative") for a in plan.argv)
    assert models.draft not in plan.argv
    assert plan.log.name == "shape_plain.log" and plan.env == servers.NO_PLUGINS
    assert _flag(plan.argv, "--attention-backend") == "fa3"
    assert _flag(plan.argv, "--max-running-requests") == "256"
    with pytest.raises(ValueError, match="run the `setup` step first"):
        servers.shape_plan(None, _launch("plain"), opts, tmp_path)


def test_the_sim_stand_ins_speculate_or_not_and_take_no_shape(tmp_path: Path) -> None:
    """The stand-in of every shape is `specctl sim serve` on the speculative port: a plain one
    for `plain`, a speculative one otherwise; the shape's own flags do not reach it."""
    opts = servers.ServerOptions(backend="sim", admin_key="k", spec_port=7, plain_port=8)
    plain = servers.shape_plan(None, _launch("plain"), opts, tmp_path)
    tree = servers.shape_plan(None, _launch("3x4x16"), opts, tmp_path)
    assert plain.argv[-1] == "--no-speculative" and "--no-speculative" not in tree.argv
    for plan in (plain, tree):
        assert plan.argv[1:5] == ["-m", "controller.cli", "sim", "serve"]
        assert _flag(plan.argv, "--port") == "7" and plan.env == {}
        assert not any(a.startswith("--speculative") for a in plan.argv)


def test_graph_sizes_are_the_loads_once_each_in_order() -> None:
    assert shapes_step.graph_sizes([1, 4, 16, 64, 128, 256]) == (1, 4, 16, 64, 128, 256)
    assert shapes_step.graph_sizes([64, 1, 64]) == (1, 64)


def test_only_a_tree_gets_a_second_backend(tmp_path: Path) -> None:
    run = Run(Options(backend="sim"), RunState(tmp_path / "run"))
    assert shapes_step.backends_for(run, parse_shape("3x4x16")) == ["fa3", "flashinfer"]
    assert shapes_step.backends_for(run, parse_shape("3x1x4")) == ["fa3"]
    assert shapes_step.backends_for(run, None) == ["fa3"]
    no_second = Run(Options(backend="sim", shape_fallback_backend=""), run.state)
    assert shapes_step.backends_for(no_second, parse_shape("3x4x16")) == ["fa3"]
    same = Run(Options(backend="sim", shape_attention_backend="flashinfer"), run.state)
    assert shapes_step.backends_for(same, parse_shape("3x4x16")) == ["flashinfer"]


@pytest.mark.parametrize(("explicit", "message"), [
    ({"shapes": "plain,3x1x5"}, "--shapes: shape '3x1x5': .* write 3x1x4"),
    ({"shapes": "3x4"}, "--shapes: shape '3x4'"),
    ({"shapes": "plain,plain"}, "--shapes: shape plain is listed twice"),
    ({"shapes": ""}, "--shapes: give at least one shape"),
    ({"shape_streams": ""}, "--shape-streams: give at least one value"),
    ({"shape_streams": "0,4"}, "--shape-streams: every value must be >= 1"),
    ({"shape_mem_fraction": 1.0}, "--shape-mem-fraction: a share of GPU memory"),
    ({"shape_kv_tokens": 0}, "--shape-kv-tokens: must be >= 1"),
    ({"shape_output_spread": "9:3"}, "--shape-output-spread: expected LOW:HIGH"),
])  # fmt: skip
def test_bad_shape_options_are_refused_naming_the_option(explicit: dict[str, object],
                                                         message: str) -> None:
    with pytest.raises(OptionError, match=message):
        validate(resolve({}, explicit))


def test_the_default_and_tiny_shape_options_are_valid() -> None:
    validate(resolve({}, {}))
    tiny = resolve({}, {"tiny": True})
    validate(tiny)
    assert [label(s) for s in parse_shapes(tiny.shapes)] == ["plain", "3x1x4", "2x2x4"]
    assert [label(s) for s in parse_shapes(resolve({}, {}).shapes)] == [
        "3x1x4", "3x4x16", "5x8x32", "4x2x8", "plain", "1x1x2", "5x1x6"]
