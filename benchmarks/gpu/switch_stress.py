"""On/off switch stress: many pushes alternating drafting off (d0) and on (d3) under load.

Checks, on the speculative server: every push answered and applied (no error), no push or
request hangs past its timeout, both depths really ran (per-depth counters on /metrics), GPU
memory and the host RSS of the server's processes do not grow beyond a stated limit, and
afterwards greedy outputs still match the plain server's.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from benchmarks.gpu import memory
from benchmarks.gpu.greedy import GreedyPrompt, RunResult, greedy_check
from controller.bench.metrics import work_between
from controller.bench.server_client import ServerClient, ServerError
from sglang_hooks.contract import push_body, single_depth_table

PUSH_TIMEOUT_S = 10.0
REQUEST_TIMEOUT_S = 120.0
# Of a --budget's last seconds, what joining the load threads may not take: the greedy check
# after the stress needs them (the push loop stops 30 s before the deadline).
GREEDY_RESERVE_S = 20.0
MIN_JOIN_S = 5.0
MAX_CONSECUTIVE_FAILURES = 5


@dataclass
class LoadThreads:
    """`concurrency` threads each keeping one `/generate` in flight until stopped."""

    url: str
    prompts: Sequence[GreedyPrompt]
    concurrency: int
    max_new_tokens: int
    completed: int = 0
    errors: int = 0
    last_error: str | None = None
    slowest_s: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _worker(self, index: int) -> None:
        with httpx.Client(base_url=self.url, timeout=REQUEST_TIMEOUT_S) as client:
            i = index
            while not self._stop.is_set():
                prompt = self.prompts[i % len(self.prompts)]
                i += self.concurrency
                t0 = time.monotonic()
                try:
                    r = client.post("/generate", json=prompt.body(self.max_new_tokens))
                    r.raise_for_status()
                    with self._lock:
                        self.completed += 1
                except httpx.HTTPError as err:
                    with self._lock:
                        self.errors += 1
                        self.last_error = f"{type(err).__name__}: {err}"[:300]
                    self._stop.wait(0.5)
                with self._lock:
                    self.slowest_s = max(self.slowest_s, time.monotonic() - t0)

    def start(self) -> LoadThreads:
        self._threads = [threading.Thread(target=self._worker, args=(k,), daemon=True,
                                          name=f"load-{k}") for k in range(self.concurrency)]
        for t in self._threads:
            t.start()
        return self

    def stop(self, timeout_s: float = REQUEST_TIMEOUT_S) -> int:
        """Stop and join; returns how many threads were still stuck in a request at the end."""
        self._stop.set()
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        return sum(t.is_alive() for t in self._threads)


def join_wait(deadline: float | None, now: float) -> float:
    """How long to wait for the load threads' last requests: a request's own timeout, cut so
    that the greedy check keeps GREEDY_RESERVE_S of the budget (at least MIN_JOIN_S). A
    thread still in its request then counts as stuck (the "no hang" check) instead of
    spending the greedy check's time."""
    if deadline is None:
        return REQUEST_TIMEOUT_S
    return max(MIN_JOIN_S, min(REQUEST_TIMEOUT_S, deadline - now - GREEDY_RESERVE_S))


@dataclass(frozen=True)
class StressPlan:
    spec_url: str
    plain_url: str
    admin_key: str | None
    server_pid: int | None
    switches: int
    interval_s: float
    off_depth: int = 0
    on_depth: int = 3
    load_concurrency: int = 8
    load_max_new_tokens: int = 64
    probe_every: int = 100
    gpu_limit_mib: float = 256.0
    rss_limit_mib: float = 512.0
    greedy_max_new_tokens: int = 128
    greedy_switch_depths: tuple[int, ...] = (0, 3, 1)
    deadline: float | None = None  # time.monotonic(): stop pushing early to keep to --budget


def _iterations_by_depth(server: ServerClient) -> Any:
    try:
        return server.scrape()
    except ServerError:
        return None


def run_stress(plan: StressPlan, load_prompts: Sequence[GreedyPrompt],
               greedy_prompts: Sequence[GreedyPrompt],
               plain_reference: RunResult | None = None,
               progress: Callable[[str], None] = print) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {plan.admin_key}"} if plan.admin_key else {}
    failures: list[str] = []
    samples: list[memory.MemorySample] = [memory.sample(plan.server_pid, "before load")]
    push_s: list[float] = []
    hung_pushes = 0
    stopped_early: str | None = None
    with ServerClient(plan.spec_url, plan.admin_key) as server:
        before = server.state()
        scrape0 = _iterations_by_depth(server)
        load = LoadThreads(plan.spec_url, load_prompts, plan.load_concurrency,
                           plan.load_max_new_tokens).start()
        version = before.version + 1
        consecutive = 0
        t_start = time.monotonic()
        try:
            time.sleep(1.0)  # let the load reach the decode batch
            samples.append(memory.sample(plan.server_pid, "load, before pushes"))
            with httpx.Client(base_url=plan.spec_url, headers=headers,
                              timeout=PUSH_TIMEOUT_S) as client:
                for i in range(plan.switches):
                    # Keep time for the greedy check after the pushes.
                    if plan.deadline is not None and time.monotonic() > plan.deadline - 30:
                        stopped_early = f"out of time (--budget) after {i} pushes"
                        progress(f"  switch stress: {stopped_early}")
                        break
                    depth = plan.off_depth if i % 2 == 0 else plan.on_depth
                    t0 = time.monotonic()
                    try:
                        r = client.post("/set_internal_state", json=push_body(
                            single_depth_table(depth, version=version)))
                        ok = r.status_code == 200 and all(r.json())
                        if not ok:
                            failures.append(f"push {i} (d{depth}): {r.status_code} "
                                            f"{r.text[:200]}")
                    except httpx.TimeoutException:
                        ok = False
                        hung_pushes += 1
                        failures.append(f"push {i} (d{depth}) did not answer in "
                                        f"{PUSH_TIMEOUT_S:g} s")
                    except (httpx.HTTPError, ValueError) as err:
                        ok = False
                        failures.append(f"push {i} (d{depth}): {type(err).__name__}: {err}")
                    push_s.append(time.monotonic() - t0)
                    version += 1
                    consecutive = 0 if ok else consecutive + 1
                    if consecutive >= MAX_CONSECUTIVE_FAILURES:
                        failures.append(f"stopped after {MAX_CONSECUTIVE_FAILURES} failed "
                                        f"pushes in a row at push {i}")
                        break
                    if (i + 1) % plan.probe_every == 0 or i + 1 == plan.switches:
                        samples.append(memory.sample(plan.server_pid, f"after push {i + 1}"))
                        live = server.state()
                        if live.version != version - 1:
                            failures.append(f"after push {i + 1} /server_info reports version "
                                            f"{live.version}, expected {version - 1}")
                        progress(f"  switch stress: {i + 1}/{plan.switches} pushes, "
                                 f"{load.completed} requests done, {len(failures)} failures")
                    if plan.interval_s > 0:
                        time.sleep(plan.interval_s)
        finally:
            stuck = load.stop(join_wait(plan.deadline, time.monotonic()))
            stress_s = time.monotonic() - t_start
            try:
                server.push(before.table)
                restored = before.describe()
            except ServerError as err:
                restored = f"not restored: {err}"
                failures.append(restored)
        scrape1 = _iterations_by_depth(server)
        samples.append(memory.sample(plan.server_pid, "after stress, idle"))
    alive = _health(plan.spec_url)
    ran = {}
    if scrape0 is not None and scrape1 is not None:
        ran = {f"d{d}": round(w.iterations) for d, w in work_between(scrape0, scrape1).items()}
    during = [s for s in samples if s.label.startswith("after push")]
    gpu = memory.growth(during, "gpu_used_mib", plan.gpu_limit_mib)
    gpu_server = memory.growth(during, "gpu_server_mib", plan.gpu_limit_mib)
    rss = memory.growth(during, "rss_mib", plan.rss_limit_mib)
    progress("  switch stress: greedy check after the stress")
    greedy_report, _ = greedy_check(
        plan.spec_url, plan.plain_url, plan.admin_key, greedy_prompts,
        plan.greedy_max_new_tokens, switch_depths=plan.greedy_switch_depths,
        plain_repeat=False, plain_reference=plain_reference, deadline=plan.deadline,
    )  # fmt: skip
    both_ran = all(ran.get(f"d{d}", 0) > 0 for d in (plan.off_depth, plan.on_depth))
    checks: dict[str, bool | None] = {
        f"all {plan.switches} pushes sent": len(push_s) == plan.switches,
        "every push applied": not failures,
        "no hang (pushes, requests, health)": hung_pushes == 0 and stuck == 0 and alive,
        "no request failed under the pushes": load.errors == 0,
        f"both d{plan.off_depth} and d{plan.on_depth} ran": both_ran,
        # None: not measured here (no nvidia-smi, no /proc): neither a pass nor a failure.
        "GPU memory within limit": _all_known(gpu.ok, gpu_server.ok),
        "server RSS within limit": rss.ok,
        "greedy outputs identical after the stress":
            all(c["flips"] == 0 for c in greedy_report["comparisons"]),
    }
    return {
        "switches_planned": plan.switches,
        "pushes_sent": len(push_s),
        "stopped_early": stopped_early,
        "interval_s": plan.interval_s,
        "depths": [plan.off_depth, plan.on_depth],
        "seconds": round(stress_s, 1),
        "push_latency_ms": _latency(push_s),
        "failures": len(failures),
        "first_failures": failures[:10],
        "hung_pushes": hung_pushes,
        "stuck_load_threads": stuck,
        "healthy_after": alive,
        "load": {"concurrency": plan.load_concurrency, "completed": load.completed,
                 "errors": load.errors, "last_error": load.last_error,
                 "slowest_request_s": round(load.slowest_s, 2)},
        "iterations_by_depth": ran,
        "memory": {"gpu_used": gpu.describe(), "gpu_server_processes": gpu_server.describe(),
                   "rss": rss.describe(),
                   "samples": [s.to_json() for s in samples]},
        "restored": restored,
        "greedy_after": greedy_report,
        "checks": checks,
        "ok": all(v is not False for v in checks.values()),
    }


def _all_known(*oks: bool | None) -> bool | None:
    known = [ok for ok in oks if ok is not None]
    return None if not known else all(known)


def check_mark(ok: bool | None) -> str:
    return "n/a " if ok is None else ("PASS" if ok else "FAIL")


def _health(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=30.0).status_code == 200
    except httpx.HTTPError:
        return False


def _latency(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    ordered = sorted(values)
    return {
        "p50": round(1000 * ordered[len(ordered) // 2], 2),
        "p99": round(1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 2),
        "max": round(1000 * ordered[-1], 2),
    }
