"""Host time of SGLang 0.5.17's spec-v2 decode bookkeeping against the plugin's trims, on the
CPU, per call at one batch size.

Five bodies the host-work trims reproduce (sglang_hooks/lean_host.py), each compiled from
the unpacked 0.5.17 source and timed beside the trim on the same stand-in requests:
- the next decode's KV estimate (`_new_tokens_required_next_decode_spec_v2`, page size 1);
- the decode preparation (`eagle_prepare_for_decode`) up to the slot assignment, which both
  hand to the same `alloc_for_spec_decode` (here a no-op: the real one assigns slots through
  a Triton kernel). On the CPU the copies are CPU copies, so this times the Python and
  tensor building only; what the one copy to a GPU saves is measured on the H200
  (docs/h200-runs.md);
- the end of a free group holding one freed span (`free_group_end` of the page-size-1
  allocator, real class): CPU concatenations here, GPU launches on a server;
- the hand-over of the next lengths (`FutureMap.resolve_seq_lens_cpu`), its CUDA event and
  side stream replaced by objects that return at once: with FlashAttention 3's backends (no
  host lengths) the gather alone, with backends that want host lengths also the copy to the
  mirror, its gather and the sum, as CPU operations.
- the forward's isolation (`Scheduler._forward_isolation`) of a speculative batch, on a
  dataclass with 0.5.17's ScheduleBatch fields: every field snapshotted and set back.

Run: SPECCTL_SGLANG17_SRC=<unpacked sglang 0.5.17>/sglang python benchmarks/host_trims.py
(torch needed; scripts/test.sh's .venv-sglang has it).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace as NS
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import sglang17_source
from sglang_hooks import lean_host

RESERVE = 8  # 2 x the per-decode allocation of a server with 4 draft tokens


def _requests(n: int, seed: int = 0) -> list[Any]:
    rng = random.Random(seed)
    reqs = []
    for _ in range(n):
        committed = rng.randint(100, 400)
        reqs.append(NS(kv_committed_len=committed,
                       kv=NS(kv_allocated_len=committed + RESERVE - 1), decode_batch_idx=0))
    return reqs


def _batch(reqs: list[Any]) -> Any:
    import torch

    return NS(reqs=reqs, device="cpu", tree_cache=None, req_to_token_pool=None,
              req_pool_indices=torch.arange(len(reqs)),
              token_to_kv_pool_allocator=NS(page_size=1), maybe_evict_swa=lambda: None,
              sampling_info=NS(penalizer_orchestrator=NS(is_required=False)),
              cumulate_penalty_output_tokens=lambda: None, batch_size=lambda: len(reqs))


def _us_per_call(fn: Callable[[], Any], calls: int, rounds: int) -> tuple[float, float]:
    """(median, best) microseconds per call over `rounds` timed runs of `calls` calls."""
    per_round = []
    for _ in range(rounds):
        tic = time.perf_counter()
        for _ in range(calls):
            fn()
        per_round.append((time.perf_counter() - tic) / calls * 1e6)
    return statistics.median(per_round), min(per_round)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sglang17-src", default=os.environ.get("SPECCTL_SGLANG17_SRC"),
                        help="the unpacked sglang 0.5.17 package (default: "
                             "$SPECCTL_SGLANG17_SRC)")
    parser.add_argument("--requests", type=int, default=128, help="batch size (default 128)")
    parser.add_argument("--calls", type=int, default=2000, help="calls per round")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    if not args.sglang17_src or not (Path(args.sglang17_src) / "_version.py").is_file():
        parser.error("--sglang17-src (or SPECCTL_SGLANG17_SRC) must name the unpacked "
                     "sglang 0.5.17 package, the folder with _version.py")
    import torch

    root = Path(args.sglang17_src)
    reqs = _requests(args.requests)
    rows: list[tuple[str, float, float, float, float]] = []

    estimate = sglang17_source.compiled(
        root, "srt/managers/schedule_batch.py", "_new_tokens_required_next_decode_spec_v2",
        "ScheduleBatch", {"get_alloc_reserve_per_decode": lambda: RESERVE,
                          "ceil_align": lambda x, a: (x + a - 1) // a * a})
    assert estimate(None, reqs, 1) == lean_host.tokens_required(reqs, RESERVE)
    rows.append(("next-decode KV estimate",
                 *_us_per_call(lambda: estimate(None, reqs, 1), args.calls, args.rounds),
                 *_us_per_call(lambda: lean_host.tokens_required(reqs, RESERVE),
                               args.calls, args.rounds)))

    def no_alloc(*a: Any, **k: Any) -> None:
        return None

    prepare = sglang17_source.compiled(
        root, "srt/speculative/eagle_utils.py", "eagle_prepare_for_decode", None,
        {"torch": torch, "get_alloc_reserve_per_decode": lambda: RESERVE,
         "get_spec": lambda: NS(speculative_eagle_topk=1), "alloc_for_spec_decode": no_alloc})
    batch = _batch(reqs)
    rows.append(("decode preparation (to the slot assignment)",
                 *_us_per_call(lambda: prepare(batch), args.calls, args.rounds),
                 *_us_per_call(lambda: lean_host.prepare_for_decode(batch, RESERVE, no_alloc),
                               args.calls, args.rounds)))

    span = torch.arange(100, 108, dtype=torch.int32)

    def end_group(allocator: Any, lean: bool) -> Callable[[], None]:
        def run() -> None:
            allocator.release_pages = allocator.release_pages[:0]  # keep the list short
            allocator.free_group_begin()
            allocator.free(span)
            if lean:
                lean_host.end_free_group(allocator)
            else:
                allocator.free_group_end()
        return run

    rows.append(("free group end, one span",
                 *_us_per_call(end_group(sglang17_source.allocator(root, 4096, True), False),
                               args.calls, args.rounds),
                 *_us_per_call(end_group(sglang17_source.allocator(root, 4096, True), True),
                               args.calls, args.rounds)))

    class NoCuda:  # the hand-over's event and side stream: no CUDA here, nothing to wait for
        def wait(self) -> None:
            return None

        def wait_event(self, event: Any) -> None:
            return None

        def synchronize(self) -> None:
            return None

    def handover(host_lengths: bool) -> tuple[Any, Any]:
        published = torch.arange(4096, dtype=torch.int64)
        pool_rows = torch.randperm(4096, generator=torch.Generator().manual_seed(1))[
            :args.requests]
        future_map = NS(device="cpu", publish_ready=NoCuda(), fwd_prepare_d2h_stream=NoCuda(),
                        needs_cpu_seq_lens=host_lengths, new_seq_lens_buf=published,
                        new_seq_lens_cpu_pinned=torch.empty_like(published))
        return future_map, NS(spec_info=NS(future_indices=pool_rows),
                              req_pool_indices_cpu=pool_rows)

    resolve = sglang17_source.compiled(
        root, "srt/managers/overlap_utils.py", "resolve_seq_lens_cpu", "FutureMap",
        {"torch": torch, "_is_hip": False, "_DEBUG_ASSERT": False})
    for host_lengths, name in ((False, "lengths' hand-over, FA3 (device only)"),
                               (True, "lengths' hand-over, host lengths too")):
        sglang_map, sglang_batch = handover(host_lengths)
        lean_map, lean_batch = handover(host_lengths)
        resolve(sglang_map, sglang_batch)
        lean_host.resolve_seq_lens(lean_map, lean_batch)
        assert torch.equal(sglang_batch.seq_lens, lean_batch.seq_lens)
        assert sglang_batch.seq_lens_sum == lean_batch.seq_lens_sum
        rows.append((name,
                     *_us_per_call(lambda m=sglang_map, b=sglang_batch: resolve(m, b),
                                   args.calls, args.rounds),
                     *_us_per_call(lambda m=lean_map, b=lean_batch:
                                   lean_host.resolve_seq_lens(m, b), args.calls, args.rounds)))

    # The forward's isolation: a dataclass with 0.5.17's ScheduleBatch fields, snapshotted
    # and restored around an empty forward (no sampling info, no pinning: both the same).
    field_names = sglang17_source.dataclass_fields(root, "srt/managers/schedule_batch.py",
                                                   "ScheduleBatch")
    batch_class = dataclasses.make_dataclass("ScheduleBatch", field_names)
    isolated = batch_class(*range(len(field_names)))
    isolated.spec_algorithm = NS(is_none=lambda: False)
    isolated.sampling_info = None
    isolation, _ = sglang17_source.forward_isolation(root)
    fields = lean_host.isolation_fields("0.5.17", isolated)
    assert fields is not None

    def isolate_sglang() -> None:
        with isolation(None, isolated, overlap=False):
            pass

    def isolate_trim() -> None:
        with lean_host.Isolation(None, isolated, False, fields):
            pass

    rows.append((f"forward isolation ({len(field_names)} fields)",
                 *_us_per_call(isolate_sglang, args.calls, args.rounds),
                 *_us_per_call(isolate_trim, args.calls, args.rounds)))

    print(f"python {platform.python_version()}, torch {torch.__version__} on "
          f"{platform.machine()}, {os.cpu_count()} CPUs; {args.requests} requests, "
          f"{args.rounds} rounds of {args.calls} calls; us per call, median (best)")
    print(f"{'body':46} {'SGLang 0.5.17':>16} {'trim':>16} {'saved':>8}")
    for name, s_med, s_best, t_med, t_best in rows:
        print(f"{name:46} {s_med:8.1f} ({s_best:5.1f}) {t_med:8.1f} ({t_best:5.1f}) "
              f"{s_med - t_med:8.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
