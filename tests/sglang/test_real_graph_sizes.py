"""The GPU harness's one list of decode CUDA graph sizes against SGLang's own default.

benchmarks/gpu/servers.py gives the speculative and the plain server the same batch sizes
(SGLang picks a finer default for a speculative server). The list is meant to be the
speculative server's default, so that the speculative server captures what it would anyway:
held here to the method that makes the default, from the 0.5.17 source the H200 runs use and
from the installed 0.5.23.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from benchmarks import sglang17_source
from benchmarks.gpu.servers import SHARED_DECODE_GRAPH_BS


def _defaults(generate: Callable[[Any, int], list[int]]) -> tuple[list[int], list[int]]:
    """(speculative, plain) defaults at a max batch size of 128."""
    def args(algorithm: str | None) -> Any:
        return SimpleNamespace(disable_cuda_graph_padding=False, speculative_algorithm=algorithm)
    return list(generate(args("EAGLE3"), 128)), list(generate(args(None), 128))


def test_the_shared_list_is_0517s_speculative_default(sglang17_root: Path) -> None:
    generate = sglang17_source.compiled(
        sglang17_root, "srt/server_args.py", "_generate_decode_cuda_graph_batch_sizes",
        "ServerArgs", {"List": list})
    speculative, plain = _defaults(generate)
    assert speculative == list(SHARED_DECODE_GRAPH_BS)
    assert 14 not in plain and 16 in plain  # the plain default SGLang would give otherwise


def test_the_shared_list_is_0523s_speculative_default() -> None:
    from sglang.srt.arg_groups import cuda_graph_hook

    speculative, plain = _defaults(
        lambda args, max_bs: cuda_graph_hook.generate_decode_cuda_graph_batch_sizes(
            args, max_bs))
    assert speculative == list(SHARED_DECODE_GRAPH_BS) and plain != speculative
