"""Depth choice through SGLang's real adaptive machinery, with the plugin loaded for real.

Real: `AdaptiveSpeculativeParams` (with a config written by `specctl serve`'s helper),
`AdaptiveController` (init_states, activate_step_by_batch, on_verify_complete), and the
HookRegistry patches installed by `load_plugins()`. Stand-in: the speculative *worker*
(`_Worker` below), because EAGLEWorkerV2 needs a GPU model runner; it implements SGLang's
`AdaptiveSpecWorker` protocol (build a state per depth, apply it) and nothing else.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sglang_hooks import launch
from sglang_hooks.contract import PolicyError, PolicyTable, Tier, encode_table
from sglang_hooks.runtime import SchedulerRuntime


@dataclass
class _State:
    speculative_num_steps: int
    speculative_num_draft_tokens: int


class _Worker:
    """Minimal AdaptiveSpecWorker: records which depth's runtime state is active."""

    def __init__(self, steps: int) -> None:
        self.speculative_num_steps = steps
        self.built: dict[int, list[int] | None] = {}

    def build_adaptive_runtime_state(self, speculative_num_steps: int,
                                     speculative_num_draft_tokens: int,
                                     cuda_graph_bs: list[int] | None = None) -> _State:
        self.built[speculative_num_steps] = cuda_graph_bs
        return _State(speculative_num_steps, speculative_num_draft_tokens)

    def apply_runtime_state(self, state: _State) -> None:
        self.speculative_num_steps = state.speculative_num_steps


GRAPH_BS = [1, 2, 4, 8, 16, 32, 64]


def _controller(cfg: dict[str, Any], tmp_path: Path, initial: int = 3) -> tuple[Any, _Worker]:
    from sglang.srt.speculative.adaptive_runtime_state import AdaptiveController
    from sglang.srt.speculative.adaptive_spec_params import AdaptiveSpeculativeParams

    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "adaptive.json"
    path.write_text(json.dumps(cfg))
    worker = _Worker(initial)
    controller = AdaptiveController(worker, AdaptiveSpeculativeParams(initial, str(path)))
    controller.register(_State(initial, initial + 1))
    controller.init_states(cuda_graph_bs=GRAPH_BS)
    return controller, worker


TABLE = PolicyTable.build(
    [Tier(1, 3), Tier(8, 1, hysteresis=2), Tier(32, 0, hysteresis=4)], version=7
)


def test_full_capture_config_makes_every_depth_usable(runtime: SchedulerRuntime,
                                                      tmp_path: Path) -> None:
    _, worker = _controller(launch.adaptive_config([0, 1, 2, 3]), tmp_path)
    assert runtime.active
    assert runtime.captured_depths == {0, 1, 2, 3}
    assert all(bs == GRAPH_BS for bs in worker.built.values())


def test_default_config_only_offers_depths_captured_at_every_batch_size(
    runtime: SchedulerRuntime, tmp_path: Path
) -> None:
    from sglang.srt.speculative.adaptive_spec_params import DEFAULT_ADAPTIVE_CONFIG

    _controller(DEFAULT_ADAPTIVE_CONFIG, tmp_path, initial=3)
    # Depth 3 was built by the normal start-up path (all graphs); 1, 5, 7 only for small
    # batches and 0 only for large ones, so a table may not use them.
    assert runtime.captured_depths == {3}
    with pytest.raises(PolicyError) as err:
        runtime.apply_request(encode_table(TABLE))
    assert err.value.field == "specctl_t1_depth" and "not captured" in err.value.message


def test_pushed_table_drives_the_real_controller_with_hysteresis(
    runtime: SchedulerRuntime, tmp_path: Path
) -> None:
    controller, worker = _controller(launch.adaptive_config([0, 1, 2, 3]), tmp_path)
    runtime.commit(runtime.apply_request(encode_table(TABLE)))
    ran = []
    for bs in (1, 7, 8, 7, 6, 5, 31, 32, 29, 28, 27):
        controller.activate_step_by_batch(bs)
        ran.append(worker.speculative_num_steps)
    # up at 8 and 32; down from tier 1 only below 8-2=6, from tier 2 only below 32-4=28
    assert ran == [3, 3, 1, 1, 1, 3, 1, 0, 0, 0, 1]


def test_ema_cannot_switch_depth_while_a_table_rules(runtime: SchedulerRuntime,
                                                     tmp_path: Path) -> None:
    controller, worker = _controller(launch.adaptive_config([0, 1, 3]), tmp_path)
    runtime.commit(runtime.apply_request(encode_table(PolicyTable.build([Tier(1, 1)], 1))))
    controller.activate_step_by_batch(4)
    for _ in range(200):  # all drafts accepted: SGLang's EMA would step up to 3
        controller.on_verify_complete([3, 3, 3, 3], batch_size=4)
        assert worker.speculative_num_steps == 1
    runtime.commit(None)  # release: SGLang's own (still warm) EMA choice is back next launch
    controller.activate_step_by_batch(4)
    assert worker.speculative_num_steps == 3


def test_sglang_choice_does_not_run_while_a_table_rules(runtime: SchedulerRuntime,
                                                       tmp_path: Path) -> None:
    """Under a table SGLang's EMA neither updates nor switches (each of its switches would
    also log a line at INFO); after release it resumes from where it stopped."""
    controller, _ = _controller(launch.adaptive_config([0, 1, 3]), tmp_path, initial=1)
    [slot] = controller.params._slots.values()
    before = (slot.ema_accept_len, slot._batch_count, slot.current_steps)
    runtime.commit(runtime.apply_request(encode_table(PolicyTable.build([Tier(1, 3)], 1))))
    for i in range(5000):  # accept nothing, then everything: SGLang would flip 1 <-> 0 <-> 3
        controller.on_verify_complete([0, 0, 0, 0] if i % 200 < 100 else [3, 3, 3, 3], 4)
    assert (slot.ema_accept_len, slot._batch_count, slot.current_steps) == before
    runtime.commit(None)
    controller.on_verify_complete([0, 0, 0, 0], 4)
    assert slot._batch_count == before[1] + 1


def test_exploration_is_reproducible_across_ranks(runtime: SchedulerRuntime, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Two TP ranks replaying the same batches pick the same depths (seeded by version)."""
    from sglang_hooks import hooks

    table = PolicyTable.build([Tier(1, 2, explore_share=0.3, explore_depths=(1, 3))], 4)
    picks = []
    for rank in range(2):
        rank_runtime = SchedulerRuntime()  # each rank is its own process
        monkeypatch.setattr(hooks, "RUNTIME", rank_runtime)
        controller, worker = _controller(launch.adaptive_config([1, 2, 3]), tmp_path / str(rank))
        rank_runtime.commit(rank_runtime.apply_request(encode_table(table)))
        seq = []
        for bs in range(1, 200):
            controller.activate_step_by_batch(bs % 17 + 1)
            seq.append(worker.speculative_num_steps)
        picks.append(seq)
    assert picks[0] == picks[1]
    assert {1, 2, 3} <= set(picks[0])


def test_startup_policy_file_is_applied_when_states_are_built(
    runtime: SchedulerRuntime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("learned_at: 2026-01-01\nsource: bench\ntable:\n  version: 3\n  tiers:\n"
                      "    - {min_batch: 1, depth: 2}\n    - {min_batch: 16, depth: 0}\n")
    monkeypatch.setenv("SPECCTL_POLICY_FILE", str(policy))
    caplog.set_level("INFO", logger="specctl")
    controller, worker = _controller(launch.adaptive_config([0, 2, 3]), tmp_path)
    assert runtime.source == "startup" and runtime.table is not None
    assert runtime.table.version == 3
    controller.activate_step_by_batch(20)
    assert worker.speculative_num_steps == 0
    # Every rank names the table it started with, so nodes can be compared in their logs.
    from sglang_hooks.policy_file import table_fingerprint

    assert any(f"start-up table: {table_fingerprint(runtime.table)} from {policy}"
               in r.getMessage() for r in caplog.records)
