"""The step-level engine: one SGLang scheduler with EAGLE-style chain speculation (topk 1).

Each loop turn is one scheduler iteration, as in SGLang's default (non-mixed) scheduling:

- if requests wait and a slot (and KV room) is free, a **prefill** iteration admits as many as
  fit (running cap, `max_prefill_tokens`, KV pool) and stalls decoding for its duration; each
  admitted request gets its first token from it;
- otherwise a **decode** iteration runs over every running request at the depth the policy
  picks for this batch size. Per request, the number of accepted drafts is sampled from the
  request's acceptance phase (chain acceptance: draft i counts only if drafts 1..i-1 did), the
  bonus token is added, and the iteration costs `profile.iteration_ms(depth, padded batch,
  mean context)` times lognormal noise.

Everything per request lives in numpy arrays so one decode iteration is a handful of vector
operations whatever the batch size. Randomness comes from seeded streams: the same seed and the
same inputs give identical results.
"""

from __future__ import annotations

import bisect
import heapq
import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from sglang_hooks.contract import bs_bucket
from sims.policies import (
    DepthPolicy,
    FixedDepthPolicy,
    SGLangAdaptivePolicy,
    nospec_cuda_graph_batch_sizes,
    pad_batches,
    spec_cuda_graph_batch_sizes,
)
from sims.profile import Profile
from sims.workload import Workload

DECODE_LOG_INTERVAL = 40  # SGLang's default: gauges refresh every 40 decode iterations
_CTX_GRID = np.geomspace(16, 2**21, 72)  # context lengths the cost table is tabulated at
_EVENT_CHECK_S = 0.25  # how often the concurrency trace is re-read


class RequestListener(Protocol):
    """Receives the progress of a request submitted from outside (an HTTP request)."""

    def on_tokens(self, count: int, sim_time: float) -> None: ...

    def on_done(self, sim_time: float, finish_reason: str) -> None: ...


@dataclass
class SimStats:
    """Cumulative counts since the start of the simulation (take differences for a window)."""

    now: float = 0.0
    tokens_generated: int = 0  # every output token: first tokens from prefill + decode tokens
    decode_tokens: int = 0
    decode_gpu_seconds: float = 0.0
    prefill_seconds: float = 0.0
    decode_iterations: int = 0
    prefill_iterations: int = 0
    explore_iterations: int = 0
    iterations_per_depth: dict[int, int] = field(default_factory=dict)
    tokens_per_depth: dict[int, int] = field(default_factory=dict)
    request_steps: int = 0
    submitted_requests: int = 0
    completed_requests: int = 0
    completed_output_tokens: int = 0  # output tokens of completed requests
    rejected_requests: int = 0
    latency_sum_s: float = 0.0  # queueing + prefill + decode, per completed request

    def copy(self) -> SimStats:
        out = SimStats(**{k: v for k, v in self.__dict__.items()})
        out.iterations_per_depth = dict(self.iterations_per_depth)
        out.tokens_per_depth = dict(self.tokens_per_depth)
        return out

    def tok_per_s_since(self, earlier: SimStats) -> float:
        """Output tokens per simulated second between `earlier` and this snapshot."""
        dt = self.now - earlier.now
        return (self.tokens_generated - earlier.tokens_generated) / dt if dt > 0 else 0.0

    @property
    def accept_length(self) -> float:
        """Decode tokens per request per iteration (bonus token included)."""
        return self.decode_tokens / self.request_steps if self.request_steps else 0.0

    @property
    def mean_step_ms(self) -> float:
        if not self.decode_iterations:
            return 0.0
        return 1000 * self.decode_gpu_seconds / self.decode_iterations


@dataclass
class Gauges:
    """SGLang's scheduler gauges, refreshed every DECODE_LOG_INTERVAL decode iterations."""

    num_running_reqs: float = 0.0
    num_queue_reqs: float = 0.0
    gen_throughput: float = 0.0
    token_usage: float = 0.0
    spec_accept_length: float = 0.0
    spec_accept_rate: float = 0.0
    spec_num_steps: float = 0.0


@dataclass
class _Waiting:
    rid: int
    prompt: int
    output: int
    phase: int
    arrival: float
    closed_loop: bool


class Engine:
    """A simulated scheduler. Drive it with `run_until(t)`; read `stats`, `counters`, `gauges`."""

    def __init__(
        self,
        profile: Profile,
        workload: Workload,
        *,
        seed: int = 0,
        speculative: bool = True,
        policy: DepthPolicy | None = None,
        max_running: int | None = None,
    ) -> None:
        workload.check_phases(list(profile.acceptance.phases))
        self.profile = profile
        self.workload = workload
        self.speculative = speculative
        self.max_running = max_running or profile.max_running(speculative)
        self.full_depth = profile.full_depth if speculative else 0
        seeds = np.random.SeedSequence(seed).spawn(5)
        self._rng_accept = np.random.default_rng(seeds[0])
        self._rng_noise = np.random.default_rng(seeds[1])
        self._rng_lengths = np.random.default_rng(seeds[2])
        self._rng_arrivals = np.random.default_rng(seeds[3])
        self.policy_rng = random.Random(int(seeds[4].generate_state(1)[0]))
        if policy is None and speculative:
            policy = SGLangAdaptivePolicy(
                initial_steps=profile.full_depth,
                captured_depths=tuple(profile.captured_depths),
                max_batch=self.max_running,
            )
        self.policy: DepthPolicy = policy or FixedDepthPolicy(0)
        self._bind(self.policy)
        self._pending_policy: DepthPolicy | None = None
        self._on_policy_applied: Callable[[int], None] | None = None

        self.now = 0.0
        self.forward_ct = 0
        self.stats = SimStats()
        self.gauges = Gauges()
        # (depth, bs_bucket) -> [iterations, request_steps, tokens, gpu_seconds, explore]
        self.counters: dict[tuple[int, int], list[float]] = {}
        self.last_depth = 0

        self._phase_names = list(profile.acceptance.phases)
        self._init_acceptance()
        self._init_costs()
        self._init_arrays()

        # Workload state.
        self._queue: deque[_Waiting] = deque()
        self._arrivals: list[tuple[float, int]] = []  # heap of closed-loop client arrivals
        self._heap_seq = 0
        self._clients = 0
        self._conc_trace = workload.concurrency_trace()
        self._conc_override: float | None = None
        self._rate_trace = workload.rate_trace() if workload.mode == "open" else None
        self._next_open = self._draw_open_arrival(0.0)
        self._next_check = 0.0
        self._next_rid = 1
        self._length_pos = 0
        self._prompt_buf: list[int] = []
        self._output_buf: list[int] = []
        self._listeners: dict[int, RequestListener] = {}
        self._arrival_time: dict[int, float] = {}
        self._overhead_s = profile.scheduler.request_overhead_ms / 1000.0

        # Gauge interval accumulators.
        self._gi_tokens = 0
        self._gi_t0 = 0.0
        self._gi_steps = 0
        self._gi_dec_tokens = 0
        self._gi_drafts = 0
        self._gi_iters = 0

    # ------------------------------------------------------------------ setup

    def _bind(self, policy: DepthPolicy) -> None:
        bind = getattr(policy, "bind", None)
        if bind is not None:
            bind(self)

    def _init_acceptance(self) -> None:
        probs = self.profile.acceptance.phases
        depth = max(self.profile.captured_depths) if self.speculative else 0
        width = max(depth, 1)
        surv = np.zeros((len(probs), width))
        for i, name in enumerate(self._phase_names):
            p = np.asarray(probs[name][:width], dtype=float)
            p = np.pad(p, (0, width - len(p)))
            surv[i] = np.cumprod(p)
        self._surv = surv  # surv[phase, k]: P(at least k+1 drafts accepted)
        self._neg_surv = [-row for row in surv]  # increasing: for searchsorted
        self._default_phase = self._phase_names.index(self.profile.acceptance.default_phase)

    def _init_costs(self) -> None:
        cap = self.max_running
        graph_bs = (
            spec_cuda_graph_batch_sizes(cap)
            if self.speculative
            else nospec_cuda_graph_batch_sizes(cap)
        )
        batch = np.arange(cap + 1, dtype=float)
        batch[0] = 1.0
        padded = (
            pad_batches(batch, graph_bs) if self.profile.scheduler.cuda_graph_padding else batch
        )
        self.padded_batch = padded
        # Padding rows carry no KV: scale context so that padded * ctx = real batch * ctx.
        ctx = _CTX_GRID[None, :] * (batch / padded)[:, None]
        depths: list[int | None] = (
            list(self.profile.captured_depths) if self.speculative else [None]
        )
        self._cost: dict[int, list[list[float]]] = {}
        for d in depths:
            table = self.profile.iteration_ms(d, padded[:, None], ctx)
            self._cost[0 if d is None else d] = np.asarray(table, dtype=float).tolist()
        self._ctx_grid = _CTX_GRID.tolist()
        cv = self.profile.step_time_cv
        self._noise_sigma = math.sqrt(math.log1p(cv * cv))
        self._noise: list[float] = []
        self._noise_pos = 0
        self._buckets = [bs_bucket(max(b, 1)) for b in range(cap + 1)]

    def _init_arrays(self) -> None:
        cap = self.max_running
        self.n = 0
        self._rid = np.zeros(cap, np.int64)
        self._remaining = np.zeros(cap, np.int64)
        self._ctx = np.zeros(cap, np.int64)
        self._reserved = np.zeros(cap, np.int64)
        self._phase = np.zeros(cap, np.int64)
        self._outlen = np.zeros(cap, np.int64)
        self._phase_count = [0] * len(self._phase_names)
        self._closed = np.zeros(cap, bool)
        self._arrays = (
            self._rid,
            self._remaining,
            self._ctx,
            self._reserved,
            self._phase,
            self._outlen,
            self._closed,
        )
        self._ctx_total = 0
        self._reserved_total = 0

    def iteration_ms(self, depth: int, n: int) -> float:
        """Mean iteration time (ms) at `depth` for `n` running requests at their mean context."""
        ctx = self._ctx_total / n
        grid = self._ctx_grid
        j = bisect.bisect_right(grid, ctx) - 1
        row = self._cost[depth][n]
        if j < 0:
            return row[0]
        if j >= len(grid) - 1:
            return row[-1]
        w = (ctx - grid[j]) / (grid[j + 1] - grid[j])
        return row[j] + w * (row[j + 1] - row[j])

    def phase_counts(self) -> list[int]:
        """Running requests per acceptance phase (index: profile.acceptance.phases order)."""
        return list(self._phase_count)

    # ------------------------------------------------------------------ controls

    def set_policy(
        self, policy: DepthPolicy, on_applied: Callable[[int], None] | None = None
    ) -> None:
        """Swap the policy at the next iteration boundary; `on_applied(forward_ct)` then."""
        self._pending_policy = policy
        self._on_policy_applied = on_applied

    def set_concurrency(self, concurrency: float | None) -> None:
        """Drive the closed-loop client count from outside (None: back to the workload)."""
        self._conc_override = concurrency
        self._next_check = self.now

    def target_concurrency(self) -> int:
        c = self._conc_override
        if c is None:
            c = self._conc_trace.value(self.now) if self.workload.mode == "closed" else 0.0
        return math.floor(c + 0.5)

    def submit(
        self, prompt_tokens: int, max_new_tokens: int, listener: RequestListener | None = None
    ) -> int:
        """Queue one request from outside the workload (an HTTP request). Returns its id."""
        rid = self._enqueue(max(prompt_tokens, 1), max(max_new_tokens, 1), False)
        if listener is not None:
            self._listeners[rid] = listener
        return rid

    @property
    def queue_length(self) -> int:
        return len(self._queue)

    # ------------------------------------------------------------------ arrivals

    def _draw_lengths(self) -> tuple[int, int]:
        if self._length_pos >= len(self._prompt_buf):
            self._prompt_buf = self.workload.prompt_tokens.sample(self._rng_lengths, 1024).tolist()
            self._output_buf = self.workload.output_tokens.sample(self._rng_lengths, 1024).tolist()
            self._length_pos = 0
        i = self._length_pos
        self._length_pos += 1
        return self._prompt_buf[i], self._output_buf[i]

    def _draw_phase(self) -> int:
        mix = self.workload.phase_mix(self.now, self.profile.acceptance.default_phase)
        if len(mix) == 1:
            return self._phase_names.index(next(iter(mix)))
        u = float(self._rng_arrivals.random())
        acc = 0.0
        names = sorted(mix)
        for name in names:
            acc += mix[name]
            if u < acc:
                return self._phase_names.index(name)
        return self._phase_names.index(names[-1])

    def _enqueue(self, prompt: int, output: int, closed_loop: bool) -> int:
        rid = self._next_rid
        self._next_rid += 1
        self._queue.append(_Waiting(rid, prompt, output, self._draw_phase(), self.now, closed_loop))
        self.stats.submitted_requests += 1
        return rid

    def _new_workload_request(self, closed_loop: bool) -> None:
        prompt, output = self._draw_lengths()
        self._enqueue(prompt, output, closed_loop)

    def _draw_open_arrival(self, t: float) -> float:
        trace = self._rate_trace
        if trace is None:
            return math.inf
        lam_max = trace.maximum()
        if lam_max <= 0:
            return math.inf
        rng = self._rng_arrivals
        while True:  # thinning: candidates at lam_max, kept with prob rate(t)/lam_max
            t += float(rng.exponential(1.0 / lam_max))
            if float(rng.random()) * lam_max < trace.value(t):
                return t
            if t > 1e9:
                return math.inf

    def _next_event(self) -> float:
        t = min(self._next_check, self._next_open)
        if self._arrivals:
            t = min(t, self._arrivals[0][0])
        return t

    def _process_events(self) -> None:
        now = self.now
        if now >= self._next_check:
            target = self.target_concurrency()
            while self._clients < target:
                self._clients += 1
                self._new_workload_request(True)
            self._next_check = now + _EVENT_CHECK_S
        while self._arrivals and self._arrivals[0][0] <= now:
            heapq.heappop(self._arrivals)
            if self._clients > self.target_concurrency():
                self._clients -= 1  # the client leaves instead of sending again
            else:
                self._new_workload_request(True)
        while self._next_open <= now:
            self._new_workload_request(False)
            self._next_open = self._draw_open_arrival(self._next_open)

    # ------------------------------------------------------------------ main loop

    def run_until(self, t_end: float) -> None:
        """Run iterations until the clock reaches t_end (the last one may end just past it)."""
        next_event = self._next_event()
        while self.now < t_end:
            if self.now >= next_event:
                self._process_events()
                next_event = self._next_event()
            if self._queue and self.n < self.max_running and self._prefill():
                next_event = min(next_event, self._next_event())
                continue
            if self.n > 0:
                self._decode()
                continue
            # Idle: jump to the next arrival.
            self.now = min(next_event, t_end)
        if self._pending_policy is not None and self.n == 0:
            self._apply_pending_policy()
        self.stats.now = self.now

    def _noise_factor(self) -> float:
        if self._noise_pos >= len(self._noise):
            s = self._noise_sigma
            self._noise = self._rng_noise.lognormal(-s * s / 2, s, 8192).tolist()
            self._noise_pos = 0
        x = self._noise[self._noise_pos]
        self._noise_pos += 1
        return x

    def _prefill(self) -> bool:
        """Admit what fits and run one prefill iteration. False if nothing could be admitted."""
        sched = self.profile.scheduler
        budget = sched.max_prefill_tokens
        kv_free = sched.max_total_tokens - self._reserved_total
        admitted: list[_Waiting] = []
        tokens = 0
        while self._queue and self.n + len(admitted) < self.max_running:
            w = self._queue[0]
            need = w.prompt + w.output
            if need > sched.max_total_tokens:
                self._queue.popleft()
                self._reject(w)
                continue
            if admitted and tokens + w.prompt > budget:
                break
            if need > kv_free:
                break
            self._queue.popleft()
            admitted.append(w)
            tokens += w.prompt
            kv_free -= need
        if not admitted:
            return False
        dt = (sched.prefill_fixed_ms + sched.prefill_us_per_token * tokens / 1000.0) / 1000.0
        dt *= self._noise_factor()
        self.now += dt
        self.forward_ct += 1
        st = self.stats
        st.prefill_iterations += 1
        st.prefill_seconds += dt
        for w in admitted:
            self._start(w)
        return True

    def _reject(self, w: _Waiting) -> None:
        self.stats.rejected_requests += 1
        listener = self._listeners.pop(w.rid, None)
        if listener is not None:
            listener.on_done(self.now, "abort")
        if w.closed_loop:
            self._schedule_client(self.now)

    def _start(self, w: _Waiting) -> None:
        """A prefilled request: emit its first token, then join the decode batch."""
        st = self.stats
        st.tokens_generated += 1
        self._gi_tokens += 1
        self._arrival_time[w.rid] = w.arrival
        listener = self._listeners.get(w.rid)
        if listener is not None:
            listener.on_tokens(1, self.now)
        if w.output <= 1:
            self._finish(w.rid, w.closed_loop, w.output)
            return
        i = self.n
        self._rid[i] = w.rid
        self._remaining[i] = w.output - 1
        self._ctx[i] = w.prompt + 1
        self._reserved[i] = w.prompt + w.output
        self._phase[i] = w.phase
        self._outlen[i] = w.output
        self._closed[i] = w.closed_loop
        self._phase_count[w.phase] += 1
        self._ctx_total += w.prompt + 1
        self._reserved_total += w.prompt + w.output
        self.n = i + 1

    def _finish(self, rid: int, closed_loop: bool, output: int) -> None:
        st = self.stats
        st.completed_requests += 1
        st.completed_output_tokens += output
        st.latency_sum_s += self.now - self._arrival_time.pop(rid, self.now)
        listener = self._listeners.pop(rid, None)
        if listener is not None:
            listener.on_done(self.now, "length")
        if closed_loop:
            self._schedule_client(self.now + self._overhead_s)

    def _schedule_client(self, t: float) -> None:
        self._heap_seq += 1
        heapq.heappush(self._arrivals, (t + self.workload.think_time_s, self._heap_seq))

    def _apply_pending_policy(self) -> None:
        policy = self._pending_policy
        assert policy is not None
        self.policy = policy
        self._bind(policy)
        self._pending_policy = None
        if self._on_policy_applied is not None:
            self._on_policy_applied(self.forward_ct)
            self._on_policy_applied = None

    def _decode(self) -> None:
        if self._pending_policy is not None:
            self._apply_pending_policy()
        n = self.n
        depth, explore = self.policy.select(n) if self.speculative else (0, False)
        remaining = self._remaining[:n]
        if depth > 0:
            u = self._rng_accept.random(n)
            counts = self._phase_count
            if max(counts) == n:
                accepted = np.searchsorted(self._neg_surv[counts.index(n)][:depth], -u)
            else:
                rows = self._surv[self._phase[:n], :depth]
                accepted = np.count_nonzero(u[:, None] < rows, axis=1)
            emitted = np.minimum(accepted + 1, remaining)
            drafts = int(accepted.sum())
        else:
            emitted = np.minimum(1, remaining)
            drafts = 0
        remaining -= emitted
        self._ctx[:n] += emitted
        tokens = int(emitted.sum())
        self._ctx_total += tokens

        dt = self.iteration_ms(depth, n) * self._noise_factor() / 1000.0
        self.now += dt
        self.forward_ct += 1
        self.last_depth = depth

        key = (depth, self._buckets[n])
        c = self.counters.get(key)
        if c is None:
            c = self.counters[key] = [0.0, 0.0, 0.0, 0.0, 0.0]
        c[0] += 1
        c[1] += n
        c[2] += tokens
        c[3] += dt
        if explore:
            c[4] += 1
        st = self.stats
        st.decode_iterations += 1
        st.request_steps += n
        st.decode_tokens += tokens
        st.tokens_generated += tokens
        st.decode_gpu_seconds += dt
        st.iterations_per_depth[depth] = st.iterations_per_depth.get(depth, 0) + 1
        st.tokens_per_depth[depth] = st.tokens_per_depth.get(depth, 0) + tokens
        if explore:
            st.explore_iterations += 1
        if self.policy.wants_feedback:
            self.policy.observe(n, depth, drafts)

        if self._listeners:
            self._notify(emitted)

        self._gi_tokens += tokens
        self._gi_steps += n
        self._gi_dec_tokens += tokens
        self._gi_drafts += drafts
        self._gi_iters += 1
        if self._gi_iters >= DECODE_LOG_INTERVAL:
            self._refresh_gauges()

        if remaining.min() <= 0:
            self._complete()

    def _notify(self, emitted: np.ndarray) -> None:
        rids = self._rid[: self.n]
        for pos in np.flatnonzero(np.isin(rids, list(self._listeners))):
            listener = self._listeners[int(rids[pos])]
            listener.on_tokens(int(emitted[pos]), self.now)

    def _complete(self) -> None:
        n = self.n
        done = self._remaining[:n] <= 0
        for pos in np.flatnonzero(done):
            self._phase_count[int(self._phase[pos])] -= 1
            self._ctx_total -= int(self._ctx[pos])
            self._reserved_total -= int(self._reserved[pos])
            self._finish(int(self._rid[pos]), bool(self._closed[pos]), int(self._outlen[pos]))
        keep = ~done
        k = int(keep.sum())
        for arr in self._arrays:
            arr[:k] = arr[:n][keep]
        self.n = k

    def _refresh_gauges(self) -> None:
        g = self.gauges
        elapsed = self.now - self._gi_t0
        g.num_running_reqs = float(self.n)
        g.num_queue_reqs = float(len(self._queue))
        g.gen_throughput = self._gi_tokens / elapsed if elapsed > 0 else 0.0
        g.token_usage = self._ctx_total / self.profile.scheduler.max_total_tokens
        if self.speculative and self._gi_steps:
            # SGLang divides correct drafts by the static draft count per round (full depth).
            g.spec_accept_length = self._gi_dec_tokens / self._gi_steps
            g.spec_accept_rate = self._gi_drafts / (self._gi_steps * self.profile.full_depth)
            g.spec_num_steps = float(self.last_depth)
        self._gi_tokens = self._gi_steps = self._gi_dec_tokens = self._gi_drafts = 0
        self._gi_iters = 0
        self._gi_t0 = self.now
