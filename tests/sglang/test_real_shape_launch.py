"""The launch rules of a tree server against SGLang 0.5.23's real argument parser and
`ServerArgs`: the flags `shape_launch` adds parse to the dominating shape on FA3 without
adaptive speculation, and SGLang's own adaptive mode refuses any tree (why a tree server must
capture its own states)."""

from __future__ import annotations

import argparse

from sglang_hooks.draft_shape import parse_shapes
from sglang_hooks.shape_launch import shape_launch

BASE = ["--model-path", "unused", "--speculative-algorithm", "EAGLE3",
        "--speculative-draft-model-path", "draft", "--device", "cpu"]  # fmt: skip


def _server_args(argv: list[str]):  # type: ignore[no-untyped-def]
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return ServerArgs.from_cli_args(parser.parse_args(argv))


def test_the_added_flags_start_sglang_at_the_dominating_tree_on_fa3() -> None:
    launch = shape_launch(parse_shapes("3x1x4,3x4x16"), BASE)
    args = _server_args([*BASE, *launch.args])
    assert (args.speculative_num_steps, args.speculative_eagle_topk,
            args.speculative_num_draft_tokens) == (3, 4, 16)  # fmt: skip
    assert args.attention_backend == "fa3" and not args.speculative_adaptive


def test_sglang_s_adaptive_mode_refuses_the_tree() -> None:
    from sglang.srt.speculative.adaptive_spec_params import adaptive_unsupported_reason

    launch = shape_launch(parse_shapes("3x1x4,3x4x16"), BASE)
    args = _server_args([*BASE, *launch.args, "--speculative-adaptive"])
    reason = adaptive_unsupported_reason(args)
    assert reason is not None and "topk" in reason
