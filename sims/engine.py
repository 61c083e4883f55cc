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

A server started at a static draft shape (a tree among them, `sims.shape_server`) runs as the
chain of the shape's steps, costed by the shape and accepting its mean accept length. A shape
server that switches among captured shapes (`sims.shape_server.switching_server`) runs each as
a lane: its own steps, cost and acceptance, keyed by the depth for a chain (0 for off, plain
listed) and from `TREE_LANE_BASE` for a tree; the policy picks a lane per iteration as it
picks a depth.

Everything per request lives in numpy arrays so one decode iteration is a handful of vector
operations whatever the batch size. Randomness comes from seeded streams: the same seed and the
same inputs give identical results.
"""

from __future__ import annotations

import bisect
import functools
import heapq
import math
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from sglang_hooks.contract import bs_bucket
from sims.capacity import saturated_request_rate
from sims.policies import (
    DepthPolicy,
    FixedDepthPolicy,
    SGLangAdaptivePolicy,
    nospec_cuda_graph_batch_sizes,
    pad_batches,
    spec_cuda_graph_batch_sizes,
)
from sims.profile import Profile
from sims.workload import Trace, Workload

TREE_LANE_BASE = 100  # lane keys of a shape server's trees; a chain's lane is its depth


@dataclass(frozen=True)
class Lane:
    """One shape a switching shape server runs: what an iteration of it drafts, costs and
    accepts (per acceptance phase, the conditional rate at each draft position)."""

    label: str
    steps: int
    rates: dict[str, list[float]]
    cost_ms: Callable[[np.ndarray, np.ndarray], np.ndarray]  # (padded batch, context) -> ms
    host_us_per_req: float = 0.0

DECODE_LOG_INTERVAL = 40  # SGLang's default: gauges refresh every 40 decode iterations
_CTX_GRID = np.geomspace(16, 2**21, 72)  # context lengths the cost table is tabulated at
_CTX_LIST = _CTX_GRID.tolist()
_EVENT_CHECK_S = 0.25  # how often the concurrency trace is re-read


class _ByContent:
    """A profile as a cache key, equal to another of the same content (profiles are frozen,
    and a fit builds a fresh one per evaluation, each replayed by many engines)."""

    __slots__ = ("_key", "profile")

    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        self._key = profile.model_dump_json()

    def __hash__(self) -> int:
        return hash(self._key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _ByContent) and self._key == other._key


@dataclass(frozen=True)
class _Tables:
    """What an engine derives from its profile alone, read-only and shared by the engines of
    one profile: per depth the survival rows (phase x depth) and those rows negated per phase,
    the padded batch per running count, per depth the iteration cost (rows: running requests,
    columns: `_CTX_GRID`), and the bs bucket per running count."""

    surv: dict[int, np.ndarray]
    neg_surv: dict[int, list[np.ndarray]]
    padded_batch: np.ndarray
    cost: dict[int, list[list[float]]]
    buckets: list[int]


@functools.lru_cache(maxsize=8)
def _profile_tables(keyed: _ByContent, speculative: bool, cap: int) -> _Tables:
    profile = keyed.profile
    padded, grid = _cost_grid(profile, speculative, cap)
    depths: list[int | None] = list(profile.captured_depths) if speculative else [None]
    cost = {
        0 if d is None else d: np.asarray(profile.iteration_ms(d, *grid), dtype=float).tolist()
        for d in depths
    }
    surv = _survival(profile, speculative)
    for arr in (padded, *surv.values()):
        arr.flags.writeable = False
    return _Tables(surv, _negated(surv), padded, cost, _buckets(cap))


def _survival(profile: Profile, speculative: bool) -> dict[int, np.ndarray]:
    """Per depth, surv[phase, k]: P(at least k+1 drafts accepted), phases in profile order."""
    probs = profile.acceptance.phases
    width = max(max(profile.captured_depths) if speculative else 0, 1)
    surv = np.zeros((len(probs), width))
    for i, name in enumerate(probs):
        p = np.asarray(probs[name][:width], dtype=float)
        surv[i] = np.cumprod(np.pad(p, (0, width - len(p))))
    return {d: surv[:, :d] for d in range(width + 1)}


def _negated(surv: dict[int, np.ndarray]) -> dict[int, list[np.ndarray]]:
    """Per lane (a depth, or a switching shape server's shape), its survival rows negated per
    phase: -surv is increasing, so searchsorted(-surv[:d], -u) counts the k with u < surv[k]."""
    return {k: [np.ascontiguousarray(-row) for row in rows] for k, rows in surv.items()}


def _cost_grid(
    profile: Profile, speculative: bool, cap: int
) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """The padded batch per running count (0 to `cap`), and the (padded batch, context) grid
    the cost tables are tabulated on."""
    graph_bs = (
        spec_cuda_graph_batch_sizes(cap) if speculative else nospec_cuda_graph_batch_sizes(cap)
    )
    batch = np.arange(cap + 1, dtype=float)
    batch[0] = 1.0
    padded = pad_batches(batch, graph_bs) if profile.scheduler.cuda_graph_padding else batch
    # Padding rows carry no KV: scale context so that padded * ctx = real batch * ctx.
    ctx = _CTX_GRID[None, :] * (batch / padded)[:, None]
    return padded, (padded[:, None], ctx)


def _buckets(cap: int) -> list[int]:
    return [bs_bucket(max(b, 1)) for b in range(cap + 1)]


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
    aborted_requests: int = 0  # dropped because their client went away
    latency_sum_s: float = 0.0  # queueing + prefill + decode, per completed request
    # Of completed requests, as SGLang's latency histograms sum them: time to the first token,
    # time from it to the last, and the tokens after the first.
    ttft_sum_s: float = 0.0
    decode_sum_s: float = 0.0
    tokens_after_first: int = 0
    # As SGLang's histograms observe them, when they happen rather than when a request ends:
    # time to the first token of every request that got one, and the time running requests
    # waited for their next tokens (running requests x iteration time, prefills included).
    first_tokens: int = 0
    first_token_wait_s: float = 0.0
    running_wait_s: float = 0.0

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
    """SGLang's scheduler gauges, refreshed every DECODE_LOG_INTERVAL decode iterations (the
    request counts also at every prefill), and at once when the scheduler goes idle (SGLang
    >= 0.5.17 publishes the idle values as soon as the running gauge disagrees with the empty
    batch)."""

    num_running_reqs: float = 0.0
    num_queue_reqs: float = 0.0
    gen_throughput: float = 0.0
    token_usage: float = 0.0
    spec_accept_length: float = 0.0
    spec_accept_rate: float = 0.0
    spec_num_steps: float = 0.0


# A waiting request: (rid, prompt tokens, output tokens, phase index, the time it reached the
# server (its client sent it; the server's own TTFT and latency count from here), closed loop)
_Waiting = tuple[int, int, int, int, float, bool]

# Columns of the running-request matrix (one row per running request).
_RID, _REM, _PROMPT, _OUT, _PHASE, _CLOSED = range(6)
_NO_FLOOR = 1 << 62


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
        lanes: dict[int, Lane] | None = None,
    ) -> None:
        workload.check_phases(list(profile.acceptance.phases))
        if lanes is not None and (not speculative or policy is None):
            raise ValueError("lanes are a speculative server's shapes, run by a given policy")
        self.lanes = lanes
        self.profile = profile
        self.workload = workload
        self.speculative = speculative
        self.max_running = max_running or profile.max_running(speculative)
        self.full_depth = profile.full_depth if speculative else 0
        if lanes:
            self.full_depth = max(lane.steps for lane in lanes.values())
        seeds = np.random.SeedSequence(seed).spawn(6)  # children by index: older streams kept
        self._rng_accept = np.random.default_rng(seeds[0])
        self._rng_noise = np.random.default_rng(seeds[1])
        self._rng_lengths = np.random.default_rng(seeds[2])
        self._rng_arrivals = np.random.default_rng(seeds[3])
        self.policy_rng = random.Random(int(seeds[4].generate_state(1)[0]))
        self._rng_overhead = np.random.default_rng(seeds[5])
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
        self._st = SimStats()  # everything but the decode totals, which live in `counters`
        self.gauges = Gauges()
        # (depth, bs_bucket) -> [iterations, request_steps, tokens, gpu_seconds, explore]
        self.counters: dict[tuple[int, int], list[float]] = {}
        self.last_depth = 0
        self.last_lane = 0  # the lane of the last decode (a depth, or a shape server's shape)
        self.lane_switches = 0  # decodes whose lane differs from the one before

        self._phase_names = list(profile.acceptance.phases)
        if lanes:
            self._init_lanes(lanes)
        else:
            self._use_tables(_profile_tables(_ByContent(profile), speculative, self.max_running))
        self._init_noise()
        self._init_arrays()

        # Workload state.
        self._queue: deque[_Waiting] = deque()
        # Requests that reached the server but not yet the scheduler's queue: with
        # --scheduler-recv-interval above 1, SGLang reads its socket only every so many
        # decode iterations (weight 1 each; a prefill's weight passes any interval).
        self._inbox: deque[_Waiting] = deque()
        self._recv_interval = profile.scheduler.recv_interval
        self._recv_count = 0
        # Heap of closed-loop client arrivals: (enters the queue, seq, sent by the client).
        self._arrivals: list[tuple[float, int, float]] = []
        self._heap_seq = 0
        self._clients = 0
        self._conc_trace = workload.concurrency_trace()
        self._conc_override: float | None = None
        self._cuts = list(workload.cut_at)  # pending, earliest first
        self._rate_trace = self._open_rate_trace()
        self._next_open = self._draw_open_arrival(0.0)
        self._next_check = 0.0
        self._next_event = 0.0
        self._next_rid = 1
        self._length_pos = 0
        self._prompt_buf: list[int] = []
        self._output_buf: list[int] = []
        self._fixed_phase = self._constant_phase()
        self._listeners: dict[int, RequestListener] = {}
        self._arrival_time: dict[int, float] = {}
        self._overhead_s = profile.scheduler.request_overhead_ms / 1000.0
        self._lag_s_per_stream = profile.scheduler.client_us_per_stream / 1e6
        cv = profile.scheduler.request_overhead_cv
        self._overhead_sigma = math.sqrt(math.log1p(cv * cv))
        self._think_s = workload.think_time_s
        self._frontend_s = profile.scheduler.frontend_ms / 1000.0
        self._dispatch_s = profile.scheduler.dispatch_ms / 1000.0
        self._prefill_fixed_ms = profile.scheduler.prefill_fixed_ms
        self._draft_prefill_ms = profile.draft.prefill_ms if speculative else 0.0
        self._skipped_prefill_ms = profile.draft.prefill_skipped_ms if speculative else 0.0
        # The plugin's draft prefill skip: admissions that follow a depth-0 decode iteration
        # (the tier they land in) run no draft prefill. The sim server sets it under a table.
        self.skip_draft_prefill = speculative and not profile.draft.prefill_at_depth0
        self._decoded = False  # no decode iteration yet: no tier to land in
        self.skipped_draft_prefills = 0
        self._via_send = self._frontend_s > 0.0 or self._dispatch_s > 0.0
        self._untimed_ms = profile.scheduler.untimed_ms
        self._init_host()
        self._frontend_free = 0.0
        # Closed-loop clients stop sending once this many requests were sent (None: never).
        self.request_limit: int | None = None
        # (sent by the client, queued, first token, finish, output tokens) per finished
        # request, when a list (sent = queued unless a front end delays requests).
        self.request_log: list[tuple[float, float, float, float, int]] | None = None
        self._first_token_at: dict[int, float] = {}
        self._queued_at: dict[int, float] = {}
        self._gi_start = self._decode_totals()
        self._gi_t0 = 0.0
        self._gi_first_tokens = 0
        self._gi_iters = 0

    # ------------------------------------------------------------------ setup

    def _bind(self, policy: DepthPolicy) -> None:
        bind = getattr(policy, "bind", None)
        if bind is not None:
            bind(self)

    def _init_lanes(self, lanes: dict[int, Lane]) -> None:
        """A switching shape server's lanes: their steps, survival rows and cost tables."""
        self._lane_steps = {k: lane.steps for k, lane in lanes.items()}
        self._lane_surv = {k: self._lane_rows(lane) for k, lane in lanes.items()}
        self._lane_neg_surv = _negated(self._lane_surv)
        self.padded_batch, grid = _cost_grid(self.profile, self.speculative, self.max_running)
        self._cost = {
            k: np.asarray(lane.cost_ms(*grid), dtype=float).tolist() for k, lane in lanes.items()
        }
        self._buckets = _buckets(self.max_running)

    def _use_tables(self, tables: _Tables) -> None:
        self._lane_steps = {d: d for d in tables.surv}
        self._lane_surv = tables.surv
        self._lane_neg_surv = tables.neg_surv
        self.padded_batch = tables.padded_batch
        self._cost = tables.cost
        self._buckets = tables.buckets

    def _lane_rows(self, lane: Lane) -> np.ndarray:
        rows = np.zeros((len(self._phase_names), lane.steps))
        for i, name in enumerate(self._phase_names):
            p = np.asarray(lane.rates[name][: lane.steps], dtype=float)
            rows[i] = np.cumprod(np.pad(p, (0, lane.steps - len(p))))
        return rows

    def _init_noise(self) -> None:
        self._neg_u: np.ndarray = np.empty(0)
        self._u_pos = 0
        self._ctx_grid = _CTX_LIST
        cv = self.profile.step_time_cv
        self._noise_sigma = math.sqrt(math.log1p(cv * cv))
        # No noise: every factor would be exp(0) = 1 exactly, so none is drawn.
        self._quiet = self._noise_sigma == 0.0
        self._noise: list[float] = []
        self._noise_pos = 0

    def _init_host(self) -> None:
        # Keyed as the cost tables: depth, 0 for a server without speculation.
        depths = list(self.profile.captured_depths) if self.speculative else [0]
        if self.lanes:
            self._host_us_per_req = {k: lane.host_us_per_req for k, lane in self.lanes.items()}
        else:
            self._host_us_per_req = {
                d: self.profile.host_us_per_req(self.speculative, d if self.speculative else None)
                for d in depths
            }
        self._host_us_per_token = self.profile.scheduler.host_us_per_token
        self._host_bound = self.profile.host_bound and (
            self._host_us_per_token > 0 or any(self._host_us_per_req.values())
        )

    def _init_arrays(self) -> None:
        self.n = 0
        self._req = np.zeros((self.max_running, 6), np.int64)
        self._rem = self._req[:, _REM]  # a view: remaining output tokens per running request
        self._rem_floor = _NO_FLOOR  # a lower bound of remaining over the running batch
        self._phase_count = [0] * len(self._phase_names)
        self._ctx_total = 0  # prompt + generated tokens over the running batch
        self._reserved_total = 0  # prompt + output tokens reserved in the KV pool

    # ------------------------------------------------------------------ readback

    def _decode_totals(self) -> tuple[float, float, float, float]:
        """(iterations, request_steps, tokens, drafts) summed over the counters."""
        it = steps = toks = 0.0
        for c in self.counters.values():
            it += c[0]
            steps += c[1]
            toks += c[2]
        return it, steps, toks, toks - steps

    @property
    def stats(self) -> SimStats:
        """Cumulative statistics (a fresh snapshot; the decode totals come from `counters`)."""
        out = self._st.copy()
        out.now = self.now
        per_depth_it: dict[int, int] = {}
        per_depth_tok: dict[int, int] = {}
        for (depth, _), c in self.counters.items():
            per_depth_it[depth] = per_depth_it.get(depth, 0) + int(c[0])
            per_depth_tok[depth] = per_depth_tok.get(depth, 0) + int(c[2])
            out.decode_iterations += int(c[0])
            out.request_steps += int(c[1])
            out.decode_tokens += int(c[2])
            out.decode_gpu_seconds += c[3]
            out.explore_iterations += int(c[4])
        out.iterations_per_depth = per_depth_it
        out.tokens_per_depth = per_depth_tok
        out.tokens_generated += out.decode_tokens
        return out

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

    def decode_ms(self, depth: int, n: int, tokens: float) -> tuple[float, float]:
        """(wall, GPU-timed) ms of a decode iteration at `depth` over `n` running requests
        emitting `tokens`: the host work beside the forward bounds it from below."""
        ms = self.iteration_ms(depth, n)
        gpu = ms - self._untimed_ms
        if not self._host_bound:
            return ms, gpu
        host = (self._host_us_per_req[depth] * n + self._host_us_per_token * tokens) / 1000.0
        return (ms if host <= gpu else host + self._untimed_ms), gpu

    def phase_counts(self) -> list[int]:
        """Running requests per acceptance phase (index: profile.acceptance.phases order)."""
        return list(self._phase_count)

    @property
    def queue_length(self) -> int:
        return len(self._queue)

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
        self._next_event = self.now

    def target_concurrency(self) -> int:
        c = self._conc_override
        if c is None:
            c = self._conc_trace.value(self.now) if self.workload.mode == "closed" else 0.0
        return math.floor(c + 0.5)

    def submit(
        self, prompt_tokens: int, max_new_tokens: int, listener: RequestListener | None = None
    ) -> int:
        """Queue one request from outside the workload (an HTTP request). Returns its id."""
        if listener is not None:
            self._listeners[self._next_rid] = listener
        return self._enqueue(max(prompt_tokens, 1), max(max_new_tokens, 1), False)

    def abort(self, rid: int) -> bool:
        """Drop a queued or running request, as SGLang aborts one whose stream the client
        closed. False if it is not there (already finished, or never submitted)."""
        self._listeners.pop(rid, None)
        for waiting in (self._queue, self._inbox):
            for i, w in enumerate(waiting):
                if w[0] == rid:
                    del waiting[i]
                    self._st.aborted_requests += 1
                    return True
        n = self.n
        rows = np.flatnonzero(self._req[:n, _RID] == rid)
        if not len(rows):
            return False
        i = int(rows[0])
        _, rem, prompt, out, phase, _closed = self._req[i].tolist()
        self._phase_count[phase] -= 1
        self._ctx_total -= prompt + out - rem
        self._reserved_total -= prompt + out
        self._arrival_time.pop(rid, None)
        # Keep the other rows in order, so the random draws stay tied to the same requests.
        self._req[i : n - 1] = self._req[i + 1 : n].copy()
        self.n = n - 1
        self._rem_floor = int(self._req[: n - 1, _REM].min()) if n > 1 else _NO_FLOOR
        self._st.aborted_requests += 1
        return True

    # ------------------------------------------------------------------ arrivals

    def _draw_lengths(self) -> tuple[int, int]:
        if self._length_pos >= len(self._prompt_buf):
            self._prompt_buf = self.workload.prompt_tokens.sample(self._rng_lengths, 1024).tolist()
            self._output_buf = self.workload.output_tokens.sample(self._rng_lengths, 1024).tolist()
            self._length_pos = 0
        i = self._length_pos
        self._length_pos += 1
        return self._prompt_buf[i], self._output_buf[i]

    def _constant_phase(self) -> int | None:
        steps = self.workload.phases
        if not steps:
            return self._phase_names.index(self.profile.acceptance.default_phase)
        if len(steps) == 1 and len(steps[0].weights()) == 1:
            return self._phase_names.index(next(iter(steps[0].weights())))
        return None

    def _draw_phase(self) -> int:
        if self._fixed_phase is not None:
            return self._fixed_phase
        mix = self.workload.phase_mix(self.now, self.profile.acceptance.default_phase)
        names = sorted(mix)
        if len(names) > 1:
            u = float(self._rng_arrivals.random())
            acc = 0.0
            for name in names:
                acc += mix[name]
                if u < acc:
                    return self._phase_names.index(name)
        return self._phase_names.index(names[-1])

    def _enqueue(
        self,
        prompt: int,
        output: int,
        closed_loop: bool,
        sent: float | None = None,
        arrived: float | None = None,
    ) -> int:
        """Queue a request that reached the scheduler at `arrived` (default: now; the
        scheduler sees it at this iteration boundary) after its client sent it at `sent`
        (default: when it reached the scheduler)."""
        rid = self._next_rid
        self._next_rid += 1
        at = self.now if arrived is None else arrived
        if self.request_log is not None:
            self._queued_at[rid] = at
        entered = at if sent is None else sent
        waiting = (rid, prompt, output, self._draw_phase(), entered, closed_loop)
        (self._inbox if self._recv_interval > 1 else self._queue).append(waiting)
        self._st.submitted_requests += 1
        return rid

    def _new_workload_request(
        self, closed_loop: bool, sent: float | None = None, arrived: float | None = None
    ) -> None:
        prompt, output = self._draw_lengths()
        self._enqueue(prompt, output, closed_loop, sent, arrived)

    def _may_send(self) -> bool:
        limit = self.request_limit
        return limit is None or self._st.submitted_requests < limit

    def _open_rate_trace(self) -> Trace | None:
        """Arrival rate in requests/s (a `capacity` trace scaled by the profile's capacity)."""
        if self.workload.mode != "open":
            return None
        trace = self.workload.rate_trace()
        if self.workload.rate_unit == "capacity":
            scale = saturated_request_rate(self.profile, self.workload)
            trace = Trace(
                points=[(t, v * scale) for t, v in trace.points],
                interpolation=trace.interpolation,
            )
        return trace

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

    def _cut_streams(self) -> None:
        """Abort every closed-loop request, waiting or running, and let the clients start
        afresh at once (a load generator ending a level cancels its streams; SGLang aborts a
        request whose stream closed). Requests submitted from outside are left alone."""
        rids = [w[0] for q in (self._queue, self._inbox) for w in q if w[5]]
        rids += self._req[: self.n][self._req[: self.n, _CLOSED] != 0, _RID].tolist()
        for rid in rids:
            self.abort(int(rid))
        self._arrivals.clear()  # clients between requests leave too
        self._clients = 0
        self._next_check = self.now

    def _update_next_event(self) -> None:
        t = min(self._next_check, self._next_open, self._cuts[0] if self._cuts else math.inf)
        if self._arrivals:
            t = min(t, self._arrivals[0][0])
        self._next_event = t

    def _process_events(self) -> None:
        now = self.now
        if self._cuts and now >= self._cuts[0]:
            while self._cuts and now >= self._cuts[0]:
                self._cuts.pop(0)
            self._cut_streams()
        if now >= self._next_check:
            target = self.target_concurrency()
            while self._clients < target and self._may_send():
                self._clients += 1
                if self._via_send:
                    self._send(now)
                else:
                    self._new_workload_request(True)
            self._next_check = now + _EVENT_CHECK_S
        while self._arrivals and self._arrivals[0][0] <= now:
            arrived, _, sent = heapq.heappop(self._arrivals)
            if self._clients > self.target_concurrency() or not self._may_send():
                self._clients -= 1  # the client leaves instead of sending again
            else:
                self._new_workload_request(True, sent, arrived)
        while self._next_open <= now:
            self._new_workload_request(False)
            self._next_open = self._draw_open_arrival(self._next_open)
        self._update_next_event()

    # ------------------------------------------------------------------ main loop

    def run_until(self, t_end: float) -> None:
        """Run iterations until the clock reaches t_end (the last one may end just past it)."""
        while self.now < t_end:
            if self.now >= self._next_event:
                self._process_events()
            # A read of the socket resets the count whether or not it found anything; an idle
            # scheduler spins through its count in microseconds.
            if self._recv_count >= self._recv_interval or (self.n == 0 and self._inbox):
                self._queue.extend(self._inbox)
                self._inbox.clear()
                self._recv_count = 0
            if self._queue and self.n < self.max_running and self._prefill():
                continue
            if self.n > 0:
                self._decode()
                continue
            self._publish_idle_gauges()
            self.now = min(self._next_event, t_end)  # idle: jump to the next arrival
        if self._pending_policy is not None and self.n == 0:
            self._apply_pending_policy()

    def _noise_factor(self) -> float:
        if self._quiet:
            return 1.0
        if self._noise_pos >= len(self._noise):
            s = self._noise_sigma
            self._noise = self._rng_noise.lognormal(-s * s / 2, s, 8192).tolist()
            self._noise_pos = 0
        x = self._noise[self._noise_pos]
        self._noise_pos += 1
        return x

    def _neg_uniforms(self, n: int) -> np.ndarray:
        """n uniforms in (0, 1], negated, from a pre-drawn block (one draw per 64k)."""
        pos = self._u_pos
        if pos + n > len(self._neg_u):
            self._neg_u = -self._rng_accept.random(1 << 16)
            pos = 0
        self._u_pos = pos + n
        return self._neg_u[pos : pos + n]

    def _prefill(self) -> bool:
        """Admit what fits and run one prefill iteration. False if nothing could be admitted."""
        sched = self.profile.scheduler
        budget = sched.max_prefill_tokens
        kv_free = sched.max_total_tokens - self._reserved_total
        admitted: list[_Waiting] = []
        tokens = 0
        queue = self._queue
        while queue and self.n + len(admitted) < self.max_running:
            w = queue[0]
            need = w[1] + w[2]
            if need > sched.max_total_tokens:
                queue.popleft()
                self._reject(w)
                continue
            if (admitted and tokens + w[1] > budget) or need > kv_free:
                break
            queue.popleft()
            admitted.append(w)
            tokens += w[1]
            kv_free -= need
        if not admitted:
            return False
        fixed = self._prefill_fixed_ms
        if self.skip_draft_prefill and self._decoded and self.last_depth == 0:
            self.skipped_draft_prefills += 1
            fixed += self._skipped_prefill_ms
        else:
            fixed += self._draft_prefill_ms
        dt = (fixed + sched.prefill_us_per_token * tokens / 1000.0) / 1000.0
        dt *= self._noise_factor()
        self.now += dt
        self.forward_ct += 1
        st = self._st
        st.prefill_iterations += 1
        st.prefill_seconds += dt
        st.running_wait_s += self.n * dt  # the running requests stall through it
        self._recv_count = self._recv_interval
        for w in admitted:
            self._start(w)
        # SGLang refreshes the request gauges at every prefill too, not only every 40 decodes.
        self.gauges.num_running_reqs = float(self.n)
        self.gauges.num_queue_reqs = float(len(self._queue))
        return True

    def _reject(self, w: _Waiting) -> None:
        self._st.rejected_requests += 1
        listener = self._listeners.pop(w[0], None)
        if listener is not None:
            listener.on_done(self.now, "abort")
        if w[5]:
            self._schedule_client(self.now)

    def _start(self, w: _Waiting) -> None:
        """A prefilled request: emit its first token, then join the decode batch."""
        rid, prompt, output, phase, arrival, closed = w
        self._st.tokens_generated += 1
        self._gi_first_tokens += 1
        self._arrival_time[rid] = arrival
        self._first_token_at[rid] = self.now
        self._st.first_tokens += 1
        self._st.first_token_wait_s += self.now - arrival
        listener = self._listeners.get(rid)
        if listener is not None:
            listener.on_tokens(1, self.now)
        if output <= 1:
            self._finish(rid, closed, output)
            return
        i = self.n
        self._req[i] = (rid, output - 1, prompt, output, phase, closed)
        self._rem_floor = min(self._rem_floor, output - 1)
        self._phase_count[phase] += 1
        self._ctx_total += prompt + 1
        self._reserved_total += prompt + output
        self.n = i + 1

    def _finish(self, rid: int, closed_loop: bool, output: int) -> None:
        st = self._st
        st.completed_requests += 1
        st.completed_output_tokens += output
        arrival = self._arrival_time.pop(rid, self.now)
        first = self._first_token_at.pop(rid, self.now)
        st.latency_sum_s += self.now - arrival
        st.ttft_sum_s += first - arrival
        st.decode_sum_s += self.now - first
        st.tokens_after_first += max(output - 1, 0)
        if self.request_log is not None:
            queued = self._queued_at.pop(rid, arrival)
            self.request_log.append((arrival, queued, first, self.now, output))
        listener = self._listeners.pop(rid, None)
        if listener is not None:
            listener.on_done(self.now, "length")
        if closed_loop:
            overhead = self._overhead_s + self._lag_s_per_stream * self._clients
            if self._overhead_sigma > 0.0:
                s = self._overhead_sigma
                overhead *= float(self._rng_overhead.lognormal(-s * s / 2, s))
            self._schedule_client(self.now + overhead)

    def _schedule_client(self, t: float) -> None:
        self._send(t + self._think_s)

    def _send(self, sent: float) -> None:
        """A closed-loop client sends at `sent`; it reaches the queue past the front end (one
        request at a time) and the hand-off to the scheduler (all at once)."""
        t = sent
        if self._frontend_s > 0.0:  # one request at a time through the front end
            t = max(t, self._frontend_free) + self._frontend_s
            self._frontend_free = t
        t += self._dispatch_s
        self._heap_seq += 1
        heapq.heappush(self._arrivals, (t, self._heap_seq, sent))
        if t < self._next_event:
            self._next_event = t

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
        self._recv_count += 1
        if self._pending_policy is not None:
            self._apply_pending_policy()
        n = self.n
        # `depth` is the lane: a depth, or on a switching shape server a shape's key
        depth, explore = self.policy.select(n) if self.speculative else (0, False)
        steps = self._lane_steps[depth]
        rem = self._rem[:n]
        exact = self._listeners or self._rem_floor <= steps + 1  # someone may finish
        emitted: np.ndarray | None = None
        if steps > 0:
            neg_u = self._neg_uniforms(n)
            counts = self._phase_count
            if max(counts) == n:
                accepted = self._lane_neg_surv[depth][counts.index(n)].searchsorted(neg_u)
            else:
                rows = self._lane_surv[depth][self._req[:n, _PHASE]]
                accepted = np.count_nonzero(rows > -neg_u[:, None], axis=1)
            drafts = int(accepted.sum())
            if exact:
                emitted = np.minimum(accepted + 1, rem)
                tokens = int(emitted.sum())
                rem -= emitted
            else:
                rem -= accepted
                rem -= 1
                tokens = drafts + n
        else:
            drafts = 0
            tokens = n
            if exact:
                emitted = np.minimum(rem, 1)
                tokens = int(emitted.sum())
            rem -= 1
        self._ctx_total += tokens

        noise = self._noise_factor()
        wall_ms, gpu_ms = self.decode_ms(depth, n, tokens)
        dt = wall_ms * noise / 1000.0
        self.now += dt
        self.forward_ct += 1
        self.last_depth = steps
        if depth != self.last_lane:
            if self._decoded:
                self.lane_switches += 1
            self.last_lane = depth
        self._decoded = True
        self._st.running_wait_s += n * dt

        key = (depth, self._buckets[n])
        c = self.counters.get(key)
        if c is None:
            c = self.counters[key] = [0.0, 0.0, 0.0, 0.0, 0.0]
        c[0] += 1
        c[1] += n
        c[2] += tokens
        c[3] += gpu_ms * noise / 1000.0  # what the server's GPU timer sees
        if explore:
            c[4] += 1
        if self.policy.wants_feedback:
            self.policy.observe(n, depth, drafts)
        if self._listeners and emitted is not None:
            self._notify(emitted)

        self._gi_iters += 1
        if self._gi_iters >= DECODE_LOG_INTERVAL:
            self._refresh_gauges()

        if exact:
            floor = int(rem.min())
            if floor <= 0:
                self._complete()
            else:
                self._rem_floor = floor
        else:
            self._rem_floor -= steps + 1

    def _notify(self, emitted: np.ndarray) -> None:
        rids = self._req[: self.n, _RID]
        for pos in np.flatnonzero(np.isin(rids, list(self._listeners))):
            listener = self._listeners[int(rids[pos])]
            listener.on_tokens(int(emitted[pos]), self.now)

    def _complete(self) -> None:
        n = self.n
        req = self._req
        done = req[:n, _REM] <= 0
        for row in req[:n][done].tolist():
            rid, rem, prompt, out, phase, closed = row
            self._phase_count[phase] -= 1
            self._ctx_total -= prompt + out - rem
            self._reserved_total -= prompt + out
            self._finish(rid, bool(closed), out)
        keep = ~done
        k = int(np.count_nonzero(keep))
        req[:k] = req[:n][keep]
        self.n = k
        self._rem_floor = int(req[:k, _REM].min()) if k else _NO_FLOOR

    def _publish_idle_gauges(self) -> None:
        g = self.gauges
        if g.num_running_reqs == 0 and g.num_queue_reqs == 0 and g.gen_throughput == 0:
            return
        g.num_running_reqs = 0.0
        g.num_queue_reqs = float(len(self._queue))
        g.gen_throughput = 0.0
        g.token_usage = self._ctx_total / self.profile.scheduler.max_total_tokens
        # The next busy refresh measures from here, not across the idle gap.
        self._gi_start = self._decode_totals()
        self._gi_first_tokens = 0
        self._gi_iters = 0
        self._gi_t0 = self.now

    def _refresh_gauges(self) -> None:
        g = self.gauges
        totals = self._decode_totals()
        _, steps, toks, drafts = (a - b for a, b in zip(totals, self._gi_start, strict=True))
        elapsed = self.now - self._gi_t0
        g.num_running_reqs = float(self.n)
        g.num_queue_reqs = float(len(self._queue))
        g.gen_throughput = (toks + self._gi_first_tokens) / elapsed if elapsed > 0 else 0.0
        g.token_usage = self._ctx_total / self.profile.scheduler.max_total_tokens
        if self.speculative and steps:
            # SGLang divides correct drafts by the static draft count per round (full depth).
            g.spec_accept_length = toks / steps
            g.spec_accept_rate = drafts / (steps * self.full_depth)
            g.spec_num_steps = float(self.last_depth)
        self._gi_start = totals
        self._gi_first_tokens = 0
        self._gi_iters = 0
        self._gi_t0 = self.now
