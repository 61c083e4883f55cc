"""Depth 0's verify with the decode's FA3 scheduling (sglang_hooks/verify_schedule.py).

SGLang's FlashAttentionBackend does not import on CPU (it needs the sgl_kernel GPU wheel), so
the backend here is a stand-in object carrying the attribute names the hooks read, and FA3's
scheduler function is a stand-in that returns a tensor of the size FA3 returns (one semaphore
plus four vectors of the padded batch). What ties it to SGLang: the hooked method signatures
and the attributes are checked against the real 0.5.17 and 0.5.23 sources, the hooks are
called as SGLang's HookRegistry calls AROUND hooks, and the real GPU run checks the outputs
(benchmarks/results/gpu/, greedy identical to the plain server).
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from sglang_hooks import hooks, verify_schedule

FA_FILE = "srt/layers/attention/flashattention_backend.py"


class Mode:
    def __init__(self, verify: bool) -> None:
        self.verify = verify

    def is_target_verify(self) -> bool:
        return self.verify


def _sched(bs: int, cache_seqlens: torch.Tensor) -> torch.Tensor:
    rounded = (bs + 3) // 4 * 4
    out = torch.zeros(1 + rounded * 4, dtype=torch.int32)
    out[1 : 1 + bs] = cache_seqlens  # something that depends on the live lengths
    return out


class Backend:
    """Stand-in with FlashAttentionBackend's attribute names (checked below)."""

    def __init__(self, **overrides: Any) -> None:
        self.fa_impl_ver = 3
        self.use_mla = False
        self.topk = 1
        self.speculative_num_draft_tokens = 1
        self._sched_meta_buf = torch.full((1 + 8 * 4,), 7, dtype=torch.int32)
        self._disable_scheduler_metadata_precompute = False
        self.is_prefill_aware_swa = False
        self.max_context_len = 4096
        self.calls: list[tuple[int, int]] = []
        self.target_verify_metadata: dict[Any, Any] = {}
        self.forward_metadata: Any = None
        for bs in (1, 4, 8):
            self.target_verify_metadata[bs] = SimpleNamespace(
                cache_seqlens_int32=torch.arange(bs, dtype=torch.int32) + 10,
                cu_seqlens_q=torch.arange(bs + 1, dtype=torch.int32),
                max_seq_len_q=1,
                scheduler_metadata=None,
            )
        self.__dict__.update(overrides)

    def _compute_scheduler_metadata(self, batch_size: int, max_seq_len_k: int,
                                    cache_seqlens: torch.Tensor,
                                    cu_seqlens_q: torch.Tensor) -> torch.Tensor:
        self.calls.append((batch_size, max_seq_len_k))
        return _sched(batch_size, cache_seqlens)

    def forward_decode(self, q: Any, k: Any, v: Any, layer: Any, forward_batch: Any,
                       *args: Any, **kwargs: Any) -> str:
        return "decode"


# The two signatures of the hooked metadata body (0.5.23 put a plan first; checked below).
def apply_0517(self: Any, bs: int, req_pool_indices: Any, seq_lens: Any, seq_lens_sum: Any,
               encoder_lens: Any, forward_mode: Any, spec_info: Any, seq_lens_cpu: Any,
               out_cache_loc: Any = None) -> None:
    self.forward_metadata = self.target_verify_metadata.get(bs)


def apply_0523(self: Any, plan: Any, bs: int, req_pool_indices: Any, seq_lens: Any,
               encoder_lens: Any, forward_mode: Any, spec_info: Any, seq_lens_cpu: Any,
               out_cache_loc: Any = None) -> None:
    self.forward_metadata = self.target_verify_metadata.get(bs)


def extend(self: Any, q: Any, k: Any, v: Any, layer: Any, forward_batch: Any,
           save_kv_cache: bool = True, **kwargs: Any) -> str:
    return "extend"


@pytest.fixture
def enabled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verify_schedule, "ENABLED", True)


def _params(source: Path, name: str) -> list[str]:
    tree = ast.parse(source.read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef)
               and n.name == "FlashAttentionBackend")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name)
    return [a.arg for a in fn.args.args]


def _sources(sglang17_root: Path) -> list[Path]:
    spec = importlib.util.find_spec("sglang")
    assert spec is not None and spec.origin is not None
    return [sglang17_root / FA_FILE, Path(spec.origin).parent / FA_FILE]


def test_the_stand_ins_match_the_real_sources(sglang17_root: Path) -> None:
    for source, mine in zip(_sources(sglang17_root), (apply_0517, apply_0523), strict=True):
        text = source.read_text()
        assert _params(source, "_apply_cuda_graph_metadata")[:9] == \
            list(mine.__code__.co_varnames[:9]), source
        assert _params(source, "forward_extend")[:6] == _params(source, "forward_decode")[:6]
        for attr in ("fa_impl_ver", "use_mla", "topk", "speculative_num_draft_tokens",
                     "_sched_meta_buf", "_disable_scheduler_metadata_precompute",
                     "is_prefill_aware_swa", "max_context_len", "target_verify_metadata",
                     "forward_metadata", "scheduler_metadata"):
            assert f".{attr}" in text, (source, attr)


@pytest.mark.parametrize("apply", [apply_0517, apply_0523])
def test_a_depth0_verify_graph_gets_scheduler_metadata_each_replay(enabled: None,
                                                                    apply: Any) -> None:
    backend = Backend()
    args: tuple[Any, ...] = (4, None, None, None, None, Mode(True), None,
                             torch.tensor([5, 9, 3, 2]))  # fmt: skip
    if apply is apply_0523:
        args = (None, 4, None, None, None, Mode(True), None, torch.tensor([5, 9, 3, 2]))
    hooks.verify_schedule_refresh(apply, backend, *args)  # capture
    md = backend.target_verify_metadata[4]
    buffer = backend.__dict__["_specctl_verify_schedule"]
    assert buffer.shape == backend._sched_meta_buf.shape
    assert verify_schedule.STATS.backends >= 1
    assert md.scheduler_metadata.data_ptr() == buffer.data_ptr()
    assert backend.calls == [(4, 10)]  # the host's longest length, plus the verified token
    assert buffer[1:5].tolist() == [10, 11, 12, 13] and int(buffer[17:].abs().sum()) == 0
    # a replay with new lengths refreshes the same buffer, without the host's lengths
    md.cache_seqlens_int32 += 100
    names = ("bs", "req_pool_indices", "seq_lens", "encoder_lens", "forward_mode",
             "spec_info", "seq_lens_cpu") + (("plan",) if apply is apply_0523 else
                                            ("seq_lens_sum",))  # fmt: skip
    by_name: dict[str, Any] = dict.fromkeys(names)
    by_name.update(bs=4, forward_mode=Mode(True))
    hooks.verify_schedule_refresh(apply, backend, **by_name)  # SGLang passes them by name
    assert backend.calls[-1] == (4, 4096)  # the static bound, as SGLang's decode
    assert buffer[1:5].tolist() == [110, 111, 112, 113]
    # the decode's own buffer is never touched
    assert set(backend._sched_meta_buf.tolist()) == {7}


def test_verify_with_the_buffer_runs_decode_attention_and_nothing_else_does(
        enabled: None) -> None:
    backend = Backend()
    hooks.verify_schedule_refresh(apply_0517, backend, 1, None, None, None, None, Mode(True),
                                  None, torch.tensor([3]))  # fmt: skip
    verify = SimpleNamespace(forward_mode=Mode(True))
    prefill = SimpleNamespace(forward_mode=Mode(False))
    assert hooks.verify_as_decode(extend, backend, "q", "k", "v", "layer", verify) == "decode"
    assert hooks.verify_as_decode(extend, backend, "q", "k", "v", "layer", prefill) == "extend"
    backend.forward_metadata = backend.target_verify_metadata[4]  # a graph without it
    assert hooks.verify_as_decode(extend, backend, "q", "k", "v", "layer", verify) == "extend"


@pytest.mark.parametrize(("overrides", "reason"), [
    ({"fa_impl_ver": 4}, "not FlashAttention 3"),
    ({"use_mla": True}, "MLA"),
    ({"topk": 4}, "top-k"),
    ({"speculative_num_draft_tokens": 4}, "more than one token"),
    ({"_sched_meta_buf": None}, "no scheduler-metadata buffer"),
    ({"_disable_scheduler_metadata_precompute": True}, "DP attention"),
    ({"is_prefill_aware_swa": True}, "sliding-window"),
])  # fmt: skip
def test_other_backends_keep_sglangs_scheduling(enabled: None, overrides: dict[str, Any],
                                                reason: str) -> None:
    backend = Backend(**overrides)
    assert reason in (verify_schedule.ineligible_reason(backend) or "")
    hooks.verify_schedule_refresh(apply_0517, backend, 4, None, None, None, None, Mode(True),
                                  None, None)  # fmt: skip
    assert backend.target_verify_metadata[4].scheduler_metadata is None
    verify = SimpleNamespace(forward_mode=Mode(True))
    assert hooks.verify_as_decode(extend, backend, "q", "k", "v", "layer", verify) == "extend"


def test_a_verify_of_several_tokens_per_request_is_left_alone(enabled: None) -> None:
    backend = Backend()
    backend.target_verify_metadata[4].max_seq_len_q = 4
    hooks.verify_schedule_refresh(apply_0517, backend, 4, None, None, None, None, Mode(True),
                                  None, None)  # fmt: skip
    assert backend.target_verify_metadata[4].scheduler_metadata is None


def test_server_info_reports_it(enabled: None) -> None:
    from sglang_hooks.runtime import SchedulerRuntime

    before = verify_schedule.STATS.backends
    hooks.verify_schedule_refresh(apply_0517, Backend(), 1, None, None, None, None, Mode(True),
                                  None, None)  # fmt: skip
    state = SchedulerRuntime().report()
    assert state["verify_schedule"] is True
    assert state["verify_schedule_backends"] == before + 1


def test_off_unless_the_environment_asks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(verify_schedule, "ENABLED", False)
    backend = Backend()
    hooks.verify_schedule_refresh(apply_0517, backend, 4, None, None, None, None, Mode(True),
                                  None, None)  # fmt: skip
    assert backend.target_verify_metadata[4].scheduler_metadata is None
    monkeypatch.setenv(verify_schedule.ENV, "1")
    assert verify_schedule.enabled_from_env()


def test_a_failed_refresh_turns_it_off_before_capture_and_raises_after(enabled: None) -> None:
    backend = Backend()

    def broken(*args: Any) -> torch.Tensor:
        raise ValueError("no FA3 here")

    backend._compute_scheduler_metadata = broken  # type: ignore[method-assign,assignment]
    hooks.verify_schedule_refresh(apply_0517, backend, 4, None, None, None, None, Mode(True),
                                  None, None)  # fmt: skip
    assert backend.target_verify_metadata[4].scheduler_metadata is None
    assert verify_schedule.plan_for(backend) is None  # off for good: no graph depends on it
    captured = Backend()
    hooks.verify_schedule_refresh(apply_0517, captured, 4, None, None, None, None, Mode(True),
                                  None, None)  # fmt: skip
    captured._compute_scheduler_metadata = broken  # type: ignore[method-assign,assignment]
    with pytest.raises(RuntimeError, match="SPECCTL_VERIFY_SCHEDULE"):
        hooks.verify_schedule_refresh(apply_0517, captured, 4, None, None, None, None,
                                      Mode(True), None, None)  # fmt: skip
