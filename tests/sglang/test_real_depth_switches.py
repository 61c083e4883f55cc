"""Depth switches under a table: SGLang's real `EAGLEWorkerV2.apply_runtime_state` and its
real runtime context, with the plugin's hook around the method.

Real: `EAGLEWorkerV2.apply_runtime_state` (SGLang 0.5.23's code, called through the class,
patched by the plugin's loader), `RuntimeContext` (`get_context()`, a published ServerArgs
through its own `override_server_args()`), `log_info_on_rank0` over a real one-rank gloo
process group. Stand-in: the worker object the method runs on (`_worker()`): EAGLEWorkerV2
cannot be constructed without a GPU model runner, so `self` carries exactly the attributes
the method reads and writes, and the runtime states are plain namespaces with the fields of
SGLang's `SpecRuntimeState`.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from types import SimpleNamespace as NS
from typing import Any

import pytest

from sglang_hooks import hooks
from sglang_hooks.contract import PolicyTable, Tier
from sglang_hooks.runtime import SchedulerRuntime


def _state(steps: int) -> Any:
    return NS(speculative_num_steps=steps, speculative_num_draft_tokens=steps + 1,
              draft_attn_backend=None, cuda_graph_runner=None, target_attn_backend=None,
              target_graph_runner=None, draft_extend_attn_backend=None,
              cuda_graph_runner_for_draft_extend=None)


def _worker(steps: int) -> Any:
    draft = NS(speculative_num_steps=steps, speculative_num_draft_tokens=steps + 1,
               draft_attn_backend=None, cuda_graph_runner=None, draft_extend_attn_backend=None,
               cuda_graph_runner_for_draft_extend=None,
               draft_runner=NS(draft_attn_backend=None, attn_backend=None),
               _rebuild_topk1_chain_buffers=lambda: None)
    return NS(speculative_num_steps=steps, speculative_num_draft_tokens=steps + 1,
              _draft_worker=draft,
              _target_worker=NS(model_runner=NS(attn_backend=None, decode_cuda_graph_runner=None)))


@pytest.fixture
def published(plugin_loaded: bool) -> Iterator[Any]:
    from sglang.srt.runtime_context import get_context

    ctx = get_context()
    with ctx.override_server_args():
        yield ctx


def test_a_million_depth_switches_keep_the_override_log_bounded(
    runtime: SchedulerRuntime, published: Any
) -> None:
    from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

    runtime.activate({0, 1, 2, 3}, None)
    runtime.commit(PolicyTable.build([Tier(1, 3, explore_share=0.5, explore_depths=(0, 1))], 1))
    start = len(published._overrides_log)
    states = [_state(s) for s in (0, 1, 2, 3)]
    worker = _worker(3)
    n = 1_000_000
    for i in range(n):
        EAGLEWorkerV2.apply_runtime_state(worker, states[i % 4])  # 3 -> 0 -> 1 -> 2 -> 3 ...
        if i == 1000:
            after_warmup = len(published._overrides_log)
    assert len(published._overrides_log) == after_warmup <= start + 1
    resolved = published.resolved_server_args_dict()
    last = states[(n - 1) % 4]
    assert resolved["speculative_num_steps"] == last.speculative_num_steps
    assert resolved["speculative_num_draft_tokens"] == last.speculative_num_draft_tokens
    from sglang.srt.runtime_context import get_spec

    assert get_spec().speculative_num_steps == last.speculative_num_steps  # the live bag too
    assert runtime.depth_switches == n
    assert runtime.report()["depth_switches"] == n


@pytest.fixture
def rank0_group() -> Iterator[None]:
    """A real one-rank gloo group, so SGLang's log_info_on_rank0 really logs."""
    import torch.distributed as dist

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=1, rank=0)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_switch_lines_are_dropped_while_a_table_rules_and_counted(
    runtime: SchedulerRuntime, published: Any, rank0_group: None,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from sglang.srt.speculative import eagle_worker_v2

    assert eagle_worker_v2.logger.name == hooks.SWITCH_LOGGER
    logging.getLogger(hooks.SWITCH_LOGGER).addFilter(hooks._QUIET_SWITCHES)  # on_states_built
    caplog.set_level(logging.INFO)
    worker = _worker(1)
    runtime.activate({0, 1}, None)
    runtime.commit(PolicyTable.build([Tier(1, 1)], 2))
    for i in range(100):
        eagle_worker_v2.EAGLEWorkerV2.apply_runtime_state(worker, _state(i % 2))
    assert not [r for r in caplog.records if r.getMessage().startswith(hooks.SWITCH_PREFIX)]
    assert runtime.depth_switches == 100
    runtime.commit(None)  # SGLang's own choice: its lines are SGLang's business again
    eagle_worker_v2.EAGLEWorkerV2.apply_runtime_state(worker, _state(3))
    assert [r for r in caplog.records if r.getMessage().startswith(hooks.SWITCH_PREFIX)]
