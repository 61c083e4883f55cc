"""Time target verify/decode forwards, EAGLE-3 draft steps and draft extends on this machine.

On a GPU every forward is captured once in a CUDA graph and its replays are timed with CUDA
events after warm-up; the median of repeated replays is kept. On a CPU (tiny presets only:
the fallback that CI runs) forwards run eagerly and are timed with the wall clock.

    python3 -m sims.calibrate.bench --preset llama8b --preset moe --out OUT_DIR

writes OUT_DIR/steps_<preset>.csv (one row per measured shape) and OUT_DIR/meta.json (device,
measured bandwidth and matmul rate, model shapes, self-check errors). Only torch and the
standard library are imported, so it runs on a bare GPU box.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from sims.calibrate import model as m
from sims.calibrate.shapes import PRESETS, Preset

CSV_FIELDS = (
    "preset", "model", "context", "kind", "batch", "tokens", "depth", "ms", "ms_p10", "ms_p90",
    "reps",
)
ITERATION_BATCHES = (1, 8, 64, 256)
ITERATION_DEPTHS = (0, 1, 3, 7)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ----------------------------------------------------------------------------- timing


@dataclass
class Timing:
    ms: float
    p10: float
    p90: float
    reps: int


def _summary(samples: list[float]) -> Timing:
    s = sorted(samples)
    return Timing(
        statistics.median(s), s[int(0.1 * (len(s) - 1))], s[int(0.9 * (len(s) - 1))], len(s)
    )


def time_cuda(fn: Callable[[], object], budget_ms: float = 200.0, max_reps: int = 40) -> Timing:
    """Capture `fn` in a CUDA graph and time its replays (median of at least 7)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # allocator, cuBLAS workspaces, kernel selection
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(3):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    estimate = max(start.elapsed_time(end), 1e-3)
    reps = int(min(max_reps, max(7, budget_ms / estimate)))
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(reps)
    ]
    for s, e in events:
        s.record()
        graph.replay()
        e.record()
    torch.cuda.synchronize()
    samples = [s.elapsed_time(e) for s, e in events]
    del graph
    return _summary(samples)


def time_cpu(fn: Callable[[], object], reps: int = 3) -> Timing:
    fn()
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000.0)
    return _summary(samples)


def time_fn(fn: Callable[[], object], device: torch.device) -> Timing:
    return time_cuda(fn) if device.type == "cuda" else time_cpu(fn)


def time_eager_cuda(fn: Callable[[], object], reps: int = 10) -> float:
    """Median ms of eager launches (for big single kernels, where launch gaps do not matter)."""
    for _ in range(3):
        fn()
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(reps)
    ]
    for s, e in events:
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events)


# ----------------------------------------------------------------------------- ceilings


def _bandwidth(device: torch.device) -> tuple[float, float]:
    elems = 2**31  # 4 GiB of bf16, far beyond L2
    src = torch.empty(elems, dtype=torch.bfloat16, device=device).normal_()
    dst = torch.empty_like(src)
    nbytes = src.numel() * src.element_size()
    copy_ms = time_eager_cuda(lambda: dst.copy_(src))
    read_ms = time_eager_cuda(lambda: src.sum())
    return 2 * nbytes / (copy_ms / 1000.0) / 1e12, nbytes / (read_ms / 1000.0) / 1e12


def _gemv_bandwidth(device: torch.device) -> float:
    """Weight streaming the way decode does it: a skinny GEMM over a 940 MB matrix."""
    weight = torch.empty((57344, 8192), dtype=torch.bfloat16, device=device).normal_()
    x = torch.empty((16, 8192), dtype=torch.bfloat16, device=device).normal_()
    ms = time_eager_cuda(lambda: torch.nn.functional.linear(x, weight))
    return weight.numel() * weight.element_size() / (ms / 1000.0) / 1e12


def _matmul_rate(device: torch.device, n: int = 8192) -> float:
    lhs = torch.empty((n, n), dtype=torch.bfloat16, device=device).normal_()
    rhs = torch.empty((n, n), dtype=torch.bfloat16, device=device).normal_()
    ms = time_eager_cuda(lambda: lhs @ rhs)
    return 2 * n**3 / (ms / 1000.0) / 1e12


def measure_ceilings(device: torch.device) -> dict[str, float]:
    """Achieved memory bandwidth (copy, read, skinny GEMM) and bf16 matmul rate on this GPU."""
    copy_tb_s, read_tb_s = _bandwidth(device)
    out = {
        "copy_tb_s": copy_tb_s,
        "read_tb_s": read_tb_s,
        "gemv_tb_s": _gemv_bandwidth(device),
        "matmul_tflop_s": _matmul_rate(device),
    }
    torch.cuda.empty_cache()
    return out


# ----------------------------------------------------------------------------- self-check


def _rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.float(), want.float()
    if not torch.isfinite(got).all():
        return float("inf")
    return float((got - want).norm() / want.norm())


def self_check(device: torch.device, seed: int = 0) -> dict[str, float]:
    """Relative error of the timed attention and MoE code against plain references.

    A kernel that cannot run here scores infinity, so its mode is not picked.
    """
    gen = torch.Generator(device="cpu").manual_seed(seed)
    torch.manual_seed(seed)  # the MoE weights below: the same check on every run

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(device=device, dtype=torch.bfloat16)

    errors: dict[str, float] = {}
    for b, n, ctx, splits in ((2, 1, 256, 1), (1, 4, 512, 4), (3, 8, 256, 2)):
        hq, hkv, d = 8, 2, 64
        q, kn, vn = rnd(b, n, hq, d), rnd(b, n, hkv, d), rnd(b, n, hkv, d)
        kc, vc = rnd(b, hkv, ctx, d), rnd(b, hkv, ctx, d)
        want = m.reference_attention(q, kn, vn, kc, vc)
        errors[f"split_b{b}_n{n}"] = _rel_error(m.attend(q, kn, vn, kc, vc, splits), want)
        pad = rnd(b, hkv, 3, d)  # slots after the valid keys must be ignored
        k_cache = torch.cat([kc, kn.transpose(1, 2), pad], dim=2)
        v_cache = torch.cat([vc, vn.transpose(1, 2), pad], dim=2)
        want_nc = m.reference_attention(q, kn, vn, kc, vc, causal=False)
        for mode, fn, ref in (
            ("cache", m.attend_cache, want), ("fused", m.attend_fused, want_nc)
        ):
            try:
                errors[f"{mode}_b{b}_n{n}"] = _rel_error(fn(q, k_cache, v_cache, ctx), ref)
            except RuntimeError as err:
                log(f"{mode} attention cannot run here: {err}")
                errors[f"{mode}_b{b}_n{n}"] = float("inf")
    from sims.calibrate.shapes import TINY_MOE

    w = m.build_target(TINY_MOE, device)["layers"][0]
    h = rnd(7, TINY_MOE.hidden)
    try:
        got = m.moe_ffn(h, w, TINY_MOE.top_k)
        errors["moe_ffn"] = _rel_error(got, m.reference_moe_ffn(h, w, TINY_MOE.top_k))
    except RuntimeError as err:
        log(f"grouped MoE cannot run here: {err}")
        errors["moe_ffn"] = float("inf")
    return errors


def pick_attention_mode(errors: dict[str, float]) -> str | None:
    """The first attention layout whose checks all pass (None: neither computes attention)."""
    for mode in m.ATTENTION_MODES:
        errs = [v for k, v in errors.items() if k.startswith(mode + "_")]
        if errs and max(errs) <= SELF_CHECK_TOLERANCE:
            return mode
    return None


def attention_microbench(device: torch.device) -> list[dict[str, Any]]:
    """One Llama-shaped attention layer in both layouts: where the cache read time goes."""
    rows = []
    hq, hkv, d, sms = 32, 8, 128, _sms(device)
    for b, n, ctx in ((1, 1, 8192), (1, 4, 8192), (64, 1, 8192), (64, 4, 8192), (256, 4, 1024)):
        q = torch.randn(b, n, hq, d, device=device, dtype=torch.bfloat16)
        kn = torch.randn(b, n, hkv, d, device=device, dtype=torch.bfloat16)
        cache = torch.randn(b, hkv, ctx + n, d, device=device, dtype=torch.bfloat16)
        kc = cache[:, :, :ctx].contiguous()
        splits = m.context_splits(b, hkv, ctx, sms)
        kv_bytes = 2 * b * hkv * (ctx + n) * d * 2
        for mode, fn in (
            ("fused", lambda q=q, c=cache, ctx=ctx: m.attend_fused(q, c, c, ctx)),
            ("cache", lambda q=q, c=cache, ctx=ctx: m.attend_cache(q, c, c, ctx)),
            ("split", lambda q=q, kn=kn, kc=kc, s=splits: m.attend(q, kn, kn, kc, kc, s)),
        ):
            try:
                t = time_cuda(fn, budget_ms=50.0)
            except RuntimeError as err:
                log(f"attention microbench {mode} b={b} n={n}: {err}")
                continue
            rows.append({
                "mode": mode, "batch": b, "tokens": n, "context": ctx, "ms": round(t.ms, 5),
                "kv_tb_s": round(kv_bytes / (t.ms / 1000.0) / 1e12, 3),
            })
        del q, kn, cache, kc
    torch.cuda.empty_cache()
    return rows


def kernel_profile(fn: Callable[[], object], top: int = 12) -> dict[str, Any]:
    """Kernels one eager call launches and where the device time goes (torch profiler)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by_name: dict[str, list[float]] = {}
    for e in kernels:
        by_name.setdefault(e.name[:90], []).append(e.device_time_total / 1000.0)
    ranked = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:top]
    return {
        "kernels": len(kernels),
        "kernel_ms": round(sum(e.device_time_total for e in kernels) / 1000.0, 4),
        "top": [{"name": k, "count": len(v), "ms": round(sum(v), 4)} for k, v in ranked],
    }


SELF_CHECK_TOLERANCE = 2e-2  # bf16 operands: errors land between 1e-3 and 1e-2


# ----------------------------------------------------------------------------- sweep


@dataclass
class Sweep:
    preset: Preset
    device: torch.device
    batches: dict[int, tuple[int, ...]]
    tokens: tuple[int, ...]
    iterations: bool
    budget_s: float
    attention: str = "fused"
    profile_into: dict[str, Any] | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def _sms(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).multi_processor_count)
    return 8


class _ContextBench:
    """Weights, KV caches and static inputs for one context length; makes timeable closures."""

    def __init__(
        self, preset: Preset, target: m.Weights, draft: m.Weights, ctx: int, b_max: int,
        n_max: int, device: torch.device, attention: str,
    ) -> None:
        self.p, self.target, self.draft, self.ctx, self.dev = preset, target, draft, ctx, device
        self.sms = _sms(device)
        t, d = preset.target, preset.draft
        self.cache = m.KVCache.random(
            t.layers, b_max, t.kv_heads, ctx, t.head_dim, n_max, device, attention
        )
        self.dcache = m.KVCache.random(
            1, b_max, d.kv_heads, ctx, d.head_dim, n_max, device, attention
        )
        t_max = b_max * n_max
        self.ids = torch.randint(0, t.vocab, (t_max,), device=device)
        self.aux = torch.empty((t_max, 3 * t.hidden), dtype=torch.bfloat16, device=device)
        self.aux.normal_()
        self.hid = torch.empty((t_max, d.hidden), dtype=torch.bfloat16, device=device)
        self.hid.normal_()

    def _step(self, b: int, n: int, draft: bool) -> m.StepInputs:
        shape = self.p.draft if draft else self.p.target
        return m.StepInputs.make(
            b, n, self.ctx, shape.head_dim, self.sms, shape.kv_heads, self.dev
        )

    def target_fn(self, b: int, n: int) -> Callable[[], object]:
        step, ids = self._step(b, n, False), self.ids[: b * n]
        return lambda: m.target_forward(self.p.target, self.target, self.cache, ids, step)

    def extend_fn(self, b: int, n: int) -> Callable[[], object]:
        step, ids, aux = self._step(b, n, True), self.ids[: b * n], self.aux[: b * n]
        embed = self.target["embed"]
        return lambda: m.draft_forward(
            self.p.draft, self.draft, embed, self.dcache, ids, aux, step, True
        )

    def draft_step_fn(self, b: int) -> Callable[[], object]:
        step, ids, hid = self._step(b, 1, True), self.ids[:b], self.hid[:b]
        embed = self.target["embed"]
        return lambda: m.draft_forward(
            self.p.draft, self.draft, embed, self.dcache, ids, hid, step, False
        )

    def iteration_fn(self, b: int, depth: int) -> Callable[[], object]:
        """One whole speculative iteration: verify, draft extend, `depth` draft steps."""
        parts = [self.target_fn(b, depth + 1), self.extend_fn(b, depth + 1)]
        parts += [self.draft_step_fn(b)] * depth

        def run() -> None:
            for part in parts:
                part()

        return run


def run_sweep(sweep: Sweep, writer: Callable[[dict[str, Any]], None]) -> None:
    """Measure every (context, batch, tokens) point of `sweep`, calling `writer` per row."""
    p, dev = sweep.preset, sweep.device
    t0 = time.monotonic()
    torch.manual_seed(0)
    log(f"{p.key}: building {p.target.name} and {p.draft.name} with random bf16 weights")
    target = m.build_target(p.target, dev)
    draft = m.build_draft(p.draft, p.target.hidden, dev)
    for i, ctx in enumerate(p.contexts):
        # each context gets its share of the budget, so a slow first one cannot starve the rest
        deadline = t0 + sweep.budget_s * (i + 1) / len(p.contexts)
        batches = sweep.batches[ctx]
        if not batches:
            continue
        log(f"{p.key}: context {ctx}, KV cache for {max(batches)} requests")
        bench = _ContextBench(
            p, target, draft, ctx, max(batches), max(sweep.tokens), dev, sweep.attention
        )
        if dev.type == "cuda" and i == 0 and sweep.profile_into is not None:
            for b, n in ((1, 1), (min(64, max(batches)), 4)):
                try:
                    sweep.profile_into[f"target_b{b}_n{n}"] = kernel_profile(bench.target_fn(b, n))
                except Exception as err:  # the profiler is a diagnostic: never lose the sweep
                    log(f"kernel profile failed: {err}")

        def emit(kind: str, b: int, n: int, depth: int | str, t: Timing, ctx: int = ctx) -> None:
            row = {
                "preset": p.key, "model": p.target.name, "context": ctx, "kind": kind,
                "batch": b, "tokens": n, "depth": depth, "ms": round(t.ms, 5),
                "ms_p10": round(t.p10, 5), "ms_p90": round(t.p90, 5), "reps": t.reps,
            }
            sweep.rows.append(row)
            writer(row)

        for b in batches:
            if time.monotonic() > deadline:
                sweep.skipped.append(f"{p.key} ctx={ctx} batch>={b}: time budget spent")
                log(sweep.skipped[-1])
                break
            for n in sweep.tokens:
                emit("target", b, n, "", time_fn(bench.target_fn(b, n), dev))
                emit("draft_extend", b, n, "", time_fn(bench.extend_fn(b, n), dev))
            emit("draft_step", b, 1, "", time_fn(bench.draft_step_fn(b), dev))
            if sweep.iterations and b in ITERATION_BATCHES:
                for depth in ITERATION_DEPTHS:
                    if depth + 1 in sweep.tokens:
                        emit("iteration", b, depth + 1, depth,
                             time_fn(bench.iteration_fn(b, depth), dev))
            tgt = [r for r in sweep.rows
                   if r["kind"] == "target" and r["batch"] == b and r["context"] == ctx]
            log(f"{p.key} ctx={ctx} B={b}: target ms by n = "
                + " ".join(f"{r['tokens']}:{r['ms']:.3f}" for r in tgt))
        del bench
        if dev.type == "cuda":
            torch.cuda.empty_cache()


def plan(
    preset: Preset, smoke: bool, budget_s: float, device: torch.device, attention: str
) -> Sweep:
    tokens = tuple(range(1, preset.max_tokens_per_req + 1))
    batches = {ctx: preset.batches_at(ctx) for ctx in preset.contexts}
    if smoke:
        tokens = (1, preset.max_tokens_per_req)
        batches = {ctx: (min(bs), max(bs)) for ctx, bs in batches.items()}
    return Sweep(preset, device, batches, tokens, not smoke, budget_s, attention)


def _csv_writer(path: Path) -> Callable[[dict[str, Any]], None]:
    with path.open("w", newline="") as fh:
        csv.DictWriter(fh, CSV_FIELDS).writeheader()

    def write(row: dict[str, Any]) -> None:
        with path.open("a", newline="") as fh:
            csv.DictWriter(fh, CSV_FIELDS).writerow(row)

    return write


def device_info(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {"torch": torch.__version__, "device": str(device)}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            name=props.name, sms=props.multi_processor_count,
            memory_gib=round(props.total_memory / 2**30, 1),
            capability=f"{props.major}.{props.minor}",
        )
    return info


def floor_summary(preset: Preset, rows: Iterable[dict[str, Any]], bw_tb_s: float) -> list[str]:
    """B=1 plain decode against the floor: bytes it must read / measured bandwidth."""
    lines = []
    t = preset.target
    for r in rows:
        if r["kind"] == "target" and r["batch"] == 1 and r["tokens"] == 1:
            nbytes = t.active_bytes(1) + t.kv_bytes_per_token() * r["context"]
            floor_ms = nbytes / (bw_tb_s * 1e12) * 1000.0
            lines.append(
                f"{preset.key} ctx={r['context']}: B=1 decode {r['ms']:.3f} ms, floor "
                f"{floor_ms:.3f} ms ({nbytes / 1e9:.2f} GB at {bw_tb_s:.2f} TB/s): "
                f"{floor_ms / r['ms']:.0%} of the floor's speed"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--preset", action="append", choices=sorted(PRESETS), required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--smoke", action="store_true", help="batch/tokens extremes only")
    ap.add_argument("--budget-s", type=float, default=240.0, help="time budget per preset")
    ap.add_argument("--skip-ceilings", action="store_true")
    ap.add_argument(
        "--attention", choices=m.ATTENTION_MODES, default=None,
        help="KV layout / attention kernel (default: the first that passes the self-check)",
    )
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    args.out.mkdir(parents=True, exist_ok=True)
    meta: dict[str, Any] = {"device_info": device_info(device), "presets": {}}
    log(f"device: {meta['device_info']}")
    errors = self_check(device)
    meta["self_check_rel_error"] = errors
    log(f"self-check relative errors: {errors}")
    attention = args.attention or pick_attention_mode(errors)
    meta["attention"] = attention
    if attention is None:
        log("self-check failed: no attention layout computes attention correctly here")
        (args.out / "meta.json").write_text(json.dumps(meta, indent=1))
        return 2
    log(f"attention layout: {attention}")
    if device.type == "cuda" and not args.skip_ceilings:
        meta["ceilings"] = measure_ceilings(device)
        log(f"ceilings: {meta['ceilings']}")
        meta["attention_microbench"] = attention_microbench(device)
        for row in meta["attention_microbench"]:
            log(f"attention {row}")
    status = 0
    for key in args.preset:
        preset = PRESETS[key]
        if preset.target.is_moe and errors["moe_ffn"] > SELF_CHECK_TOLERANCE:
            log(f"{key}: skipped, the grouped MoE FFN failed its self-check")
            meta["presets"][key] = {"error": "grouped MoE FFN failed its self-check"}
            status = 1
            continue
        sweep = plan(preset, args.smoke, args.budget_s, device, attention)
        sweep.profile_into = {}
        meta["presets"][key] = {
            "target": preset.target.to_json(), "draft": preset.draft.to_json(),
            "batches": {str(c): list(b) for c, b in sweep.batches.items()},
            "tokens": list(sweep.tokens), "smoke": args.smoke,
        }
        try:
            run_sweep(sweep, _csv_writer(args.out / f"steps_{key}.csv"))
        except Exception as err:  # keep the other presets' results: report and go on
            log(f"{key}: FAILED: {type(err).__name__}: {err}")
            meta["presets"][key]["error"] = f"{type(err).__name__}: {err}"
            status = 1
            if device.type == "cuda":
                torch.cuda.empty_cache()
        meta["presets"][key]["skipped"] = sweep.skipped
        meta["presets"][key]["kernel_profile"] = sweep.profile_into
        for name, prof in sweep.profile_into.items():
            log(f"{key} {name}: {prof['kernels']} kernels, {prof['kernel_ms']} ms of kernels; "
                f"top: {[(t['name'][:40], t['count'], t['ms']) for t in prof['top'][:6]]}")
        meta["split_flash_kernel"] = m._FLASH_OK.get("flash", True) and device.type == "cuda"
        if "ceilings" in meta:
            bw = max(meta["ceilings"]["copy_tb_s"], meta["ceilings"]["read_tb_s"])
            for line in floor_summary(preset, sweep.rows, bw):
                log(line)
        (args.out / "meta.json").write_text(json.dumps(meta, indent=1))
    return status


if __name__ == "__main__":
    sys.exit(main())
