"""Hardware + model cost profile of a speculative-decoding server, and its cost model.

A profile is a YAML file (schema: `Profile`, documented field by field in docs/simulator.md).
The cost model turns it into the time of one decode iteration at batch size B and depth s:

    t_iter(s, B)  = t_target(B, n=s+1) + t_extend(B, n=s+1) + s * t_draft(B) + sched + spec_sched
    t_iter(0, B)  = t_target(B, n=1)   + t_extend(B, n=1)                    + sched + spec_sched
                    (t_extend left out when the draft extend is skipped at depth 0; on the
                    plugin's plain decode path plain_decode_sched replaces spec_sched)
    t_nospec(B)   = t_target(B, n=1)                                         + sched
    (sched = sched_ms + untimed_ms; the server's GPU timer sees an iteration less untimed_ms)

    t_target(B, n) = fixed + comm + comm_per_token*T + smoothmax(t_mem, t_compute)
                     + per_req*B,                                     T = B*n
    t_mem          = weight_read + moe_read(T) + kv_read(B, context)
    moe_read(T)    = expert_read * (1 - (1 - top_k/experts) ** T)   (experts touched by T tokens)
    t_compute      = compute_per_token * T
    smoothmax(a,b) = (a**p + b**p) ** (1/p)                         (roofline knee, p = sharpness)

An iteration lasts at least the host work that runs beside its forward (`decode_step_ms`):

    t_wall(s, B) = max(t_iter(s, B) - untimed, host_per_req*B + host_per_token*tokens) + untimed
    (host_per_req: host_us_per_req, plus spec_host_us_per_req on a speculative server, or
    plain_decode_host_us_per_req at depth 0 on the plain decode path)

SGLang's depth 0 still pays the draft extend that keeps the draft KV cache warm, so a
speculative server at depth 0 is slower than a server without speculation (as measured
upstream); the plugin's off path skips it (`draft.extend_at_depth0: false`).

A profile may also describe SGLang's static draft shapes (`shapes`, STEPSxTOPKxDRAFT: trees as
well as chains, and `plain`), each with the accept length per phase a bench of shapes measured
and its own terms beyond the cost model at the shape (`shape_iteration_ms`):

    t_shape(B)    = t_target(B, n=N) + t_extend(B, n=S+1) + S * t_round(B, K) + sched
                    + spec_sched + fixed + per_position * B * N
    t_round(B, K) = step_fixed + step_per_req * B * K + draft_kv(B)   (S rounds of width K)
    t_plain(B)    = t_nospec(B) + fixed + per_position * B

A server started at a shape (`static_shape`, set by `sims.shape_server`) runs it in place of
the depth of its steps, with no host floor of its own: the shape's terms were fitted to the
server it was benched on, host work included.

All functions are numpy-vectorised over the batch size so the simulator and the oracle can
evaluate whole curves at once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sglang_hooks.draft_shape import PLAIN, ShapeError, label, parse_shape
from sims.named_yaml import builtin_names, load_named_yaml

PROFILES_DIR = Path(__file__).parent / "profiles"

NonNeg = Annotated[float, Field(ge=0.0)]
Pos = Annotated[float, Field(gt=0.0)]
Prob = Annotated[float, Field(ge=0.0, le=1.0)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MoECost(_Strict):
    experts: Annotated[int, Field(ge=1)]
    top_k: Annotated[int, Field(ge=1)]
    expert_read_ms: NonNeg = Field(description="Time to read every routed expert's weights once")

    @model_validator(mode="after")
    def _k_le_experts(self) -> MoECost:
        if self.top_k > self.experts:
            raise ValueError(f"top_k ({self.top_k}) cannot exceed experts ({self.experts})")
        return self


class TargetCost(_Strict):
    fixed_ms: NonNeg = Field(description="Kernel launch / graph replay overhead per forward")
    comm_ms: NonNeg = Field(0.0, description="Per-forward collective latency (PCIe all-reduce)")
    comm_us_per_token: NonNeg = Field(0.0, description="Collective bandwidth cost per batch token")
    weight_read_ms: NonNeg = Field(description="Dense (non-expert) weights read once: the floor")
    moe: MoECost | None = None
    kv_us_per_req_per_1k_ctx: NonNeg = Field(
        description="KV cache read per request per 1k tokens of context"
    )
    compute_us_per_token: NonNeg = Field(description="Compute-bound slope per batch token")
    per_req_us: NonNeg = Field(
        0.0,
        description="Per request per forward, however many tokens it verifies (sampling, "
        "per-sequence attention and batch bookkeeping); outside the roofline",
    )
    roofline_sharpness: Annotated[float, Field(ge=1.0, le=16.0)] = 4.0
    kv_in_roofline: bool = Field(
        True,
        description="KV read shares the weights' memory roofline (True), or is separate "
        "attention-kernel time added after it (False, what measured H200 step times fit)",
    )


class DraftCost(_Strict):
    step_fixed_ms: NonNeg = Field(description="One draft forward (graph replay), batch-independent")
    step_us_per_req: NonNeg = Field(description="One draft forward, per request in the batch")
    extend_fixed_ms: NonNeg = Field(description="Draft extend after verify, paid even at depth 0")
    extend_us_per_token: NonNeg = Field(description="Draft extend per token it re-encodes")
    extend_us_per_req: NonNeg = Field(
        0.0, description="Draft extend per request (its LM-head row and bookkeeping)"
    )
    kv_us_per_req_per_1k_ctx: NonNeg = Field(
        0.0, description="Draft KV read per request per 1k tokens of context (step and extend)"
    )
    spec_sched_ms: NonNeg = Field(
        0.0, description="Extra CPU work per speculative iteration (verify bookkeeping)"
    )
    prefill_ms: NonNeg = Field(
        0.0,
        description="What a prefill batch costs more with speculation on (the draft model's "
        "own pass over the new prompts and its first draft), per prefill",
    )
    prefill_skipped_ms: NonNeg = Field(
        0.0,
        description="What a prefill batch still costs more on the speculative server when the "
        "draft's prefill is skipped after depth 0 (`prefill_at_depth0: false`): spec-v2's own "
        "prefill work around the target's forward, which a plain server does not run",
    )
    extend_at_depth0: bool = Field(
        True,
        description="Depth 0 runs the draft extend (SGLang's own depth 0, the plugin's "
        "SPECCTL_OFF_PATH=sglang); false: the plugin's off path skips it, and depth 0 pays a "
        "verify-mode forward and spec_sched_ms only",
    )
    plain_decode_at_depth0: bool = Field(
        False,
        description="Depth 0 runs as a plain decode: the plugin's off path on SGLang 0.5.17, on "
        "the target's own DECODE graphs with the host-work trims. Its iteration then "
        "pays plain_decode_sched_ms instead of spec_sched_ms, and its host work "
        "scheduler.plain_decode_host_us_per_req instead of spec_host_us_per_req",
    )
    plain_decode_sched_ms: NonNeg = Field(
        0.0,
        description="What a depth-0 iteration on the plain decode path costs beyond a plain "
        "server's (in place of spec_sched_ms there)",
    )
    prefill_at_depth0: bool = Field(
        True,
        description="A prefill admitted while depth 0 runs pays prefill_ms (SGLang's draft "
        "prefill at every admission); false: the plugin's off path skips the draft's "
        "prefill after a depth-0 decode iteration, "
        "and the prefill pays prefill_skipped_ms instead",
    )


class SchedulerCost(_Strict):
    sched_ms: NonNeg = Field(description="CPU scheduling work per decode iteration")
    untimed_ms: NonNeg = Field(
        0.0,
        description="Per decode iteration, host time outside what the server's GPU timer "
        "measures (scheduling that does not overlap the forward): in every iteration, not in "
        "specctl_decode_gpu_seconds_total",
    )
    host_us_per_req: NonNeg = Field(
        0.0,
        description="Host (CPU) work per decode iteration and running request that SGLang's "
        "overlap scheduler runs beside the GPU forward (each request's result, its stream): "
        "an iteration lasts at least host_us_per_req x batch + host_us_per_token x tokens; "
        "the GPU timer does not see the wait",
    )
    host_us_per_token: NonNeg = Field(
        0.0, description="The same host work per token an iteration emits (detokenising it)"
    )
    spec_host_us_per_req: NonNeg = Field(
        0.0,
        description="A speculative server's extra host work per decode iteration and running "
        "request, at every depth, depth 0 included (SGLang's spec-v2 per-request preparation "
        "and result handling); adds to host_us_per_req on that server only",
    )
    plain_decode_host_us_per_req: NonNeg = Field(
        0.0,
        description="The speculative server's extra host work per decode iteration and running "
        "request at depth 0 on the plain decode path (`draft.plain_decode_at_depth0`), in "
        "place of spec_host_us_per_req there",
    )
    prefill_fixed_ms: NonNeg = Field(description="Fixed cost of one prefill batch")
    prefill_us_per_token: NonNeg = Field(description="Prefill cost per prompt token")
    max_running_requests_spec: Annotated[int, Field(ge=1)] = Field(
        48, description="Running-request cap with speculation on (SGLang's default is 48)"
    )
    max_running_requests_nospec: Annotated[int, Field(ge=1)] = 256
    request_overhead_ms: NonNeg = Field(
        0.0, description="Per-request latency outside the GPU (HTTP, tokenize, detokenize)"
    )
    request_overhead_cv: Annotated[float, Field(ge=0.0, le=2.0)] = Field(
        0.0,
        description="Coefficient of variation of that latency per request (lognormal); "
        "spreads a closed loop's arrivals, so new requests' prefills interleave with decoding",
    )
    frontend_ms: NonNeg = Field(
        0.0,
        description="Per-request time in the server's one front-end process (HTTP parsing, "
        "tokenising) before the scheduler sees it, one request at a time: requests sent "
        "together wait for each other (closed-loop clients; in the server's TTFT and the "
        "client's)",
    )
    dispatch_ms: NonNeg = Field(
        0.0,
        description="Per-request time between the front end and the scheduler's queue that "
        "requests spend side by side, not one at a time (inter-process hand-offs, the "
        "scheduler picking the request up): it delays the request and counts in the "
        "server's TTFT and the client's, but stalls no decoding (closed-loop clients)",
    )
    client_us_per_stream: NonNeg = Field(
        0.0,
        description="How much later, per stream it keeps open, a closed-loop client notices a "
        "request's first token and its end (a load generator or HTTP front end busier with "
        "every stream): adds to the gap before its next request and to the TTFT it measures",
    )
    ttft_overhead_ms: NonNeg = Field(
        0.0,
        description="What a client sees in its time to first token beyond queueing and "
        "prefill (HTTP, tokenising, the first chunk's way back); charged no GPU time",
    )
    context_length: Annotated[int, Field(ge=1)] = Field(
        131072, description="The model's context length, as /server_info reports it"
    )
    max_prefill_tokens: Annotated[int, Field(ge=1)] = Field(
        16384, description="Prompt tokens one prefill batch may admit (SGLang's default)"
    )
    max_total_tokens: Annotated[int, Field(ge=1)] = Field(
        1_000_000, description="KV cache pool size in tokens (sglang:token_usage denominator)"
    )
    cuda_graph_padding: bool = Field(
        True, description="Charge a decode iteration at the next CUDA-graph batch size"
    )
    recv_interval: Annotated[int, Field(ge=1)] = Field(
        1,
        description="SGLang's --scheduler-recv-interval: the scheduler takes in new requests "
        "once every this many decode iterations (at once after a prefill, and when idle), so "
        "arrivals share prefill batches; 1 takes them in at every iteration",
    )


class AcceptanceModel(_Strict):
    """Per-position conditional acceptance: p[i] = P(draft i+1 accepted | drafts 1..i accepted)."""

    phases: dict[str, list[Prob]]
    default_phase: str

    @model_validator(mode="after")
    def _phases_ok(self) -> AcceptanceModel:
        if self.default_phase not in self.phases:
            raise ValueError(
                f"default_phase '{self.default_phase}' is not among phases {sorted(self.phases)}"
            )
        return self

    def expected_length(self, phase: str, depth: int) -> float:
        """E[tokens per request per iteration] at `depth`, bonus token included."""
        p = np.asarray(self.phases[phase][:depth], dtype=float)
        return float(1.0 + np.cumprod(p).sum()) if depth > 0 else 1.0


class ShapeCost(_Strict):
    """One static draft shape: its terms beyond the cost model at the shape (either sign: the
    cost model's own fields were fitted elsewhere, on depths) and what it accepts."""

    fixed_ms: float = Field(
        0.0, description="Per decode iteration, beyond the cost model at this shape"
    )
    us_per_position: float = Field(
        0.0,
        description="Per verified position (batch x draft tokens; batch for plain), beyond the "
        "cost model at this shape: a tree's masked verify, its drafting's top-k and the host "
        "work per request of the server it was benched on",
    )
    accept_length: dict[str, Annotated[float, Field(ge=1.0)]] = Field(
        default_factory=dict,
        description="Tokens per request per iteration (bonus included) per acceptance phase, "
        "as SGLang counted them; none for plain",
    )


class ReferenceWorkload(_Strict):
    """The request shape a profile's measured figures refer to (and sweeps default to)."""

    prompt_tokens: Annotated[int, Field(ge=1)] = 1024
    output_tokens: Annotated[int, Field(ge=1)] = 256


class Profile(_Strict):
    name: str
    description: str = ""
    sources: list[str] = Field(default_factory=list, description="Evidence for the parameters")
    context_tokens: Annotated[int, Field(ge=1)] = Field(
        4096, description="Typical context length the KV read is charged for when not simulated"
    )
    target: TargetCost
    draft: DraftCost
    scheduler: SchedulerCost
    acceptance: AcceptanceModel
    captured_depths: list[Annotated[int, Field(ge=0, le=15)]]
    full_depth: Annotated[int, Field(ge=1, le=15)] = Field(
        description="The depth a server with a fixed speculative config would run"
    )
    step_time_cv: Annotated[float, Field(ge=0.0, le=0.5)] = Field(
        0.02, description="Coefficient of variation of iteration time (lognormal noise)"
    )
    reference_workload: ReferenceWorkload = Field(
        default_factory=ReferenceWorkload,
        description="Prompt/output lengths of the closed-loop benchmark the profile matches",
    )
    shapes: dict[str, ShapeCost] | None = Field(
        None,
        description="SGLang's static draft shapes (STEPSxTOPKxDRAFT, or plain) a bench of "
        "shapes measured; None: a depth-only profile",
    )
    static_shape: str | None = Field(
        None,
        description="The shape this server was started at (one of `shapes`): it runs in place "
        "of the depth of its steps (plain: of the server without speculation)",
    )

    @model_validator(mode="after")
    def _depths_ok(self) -> Profile:
        depths = sorted(set(self.captured_depths))
        if depths != sorted(self.captured_depths):
            raise ValueError("captured_depths must not repeat")
        if self.full_depth not in depths:
            raise ValueError(f"full_depth {self.full_depth} is not in captured_depths {depths}")
        for name, probs in self.acceptance.phases.items():
            if len(probs) < max(depths):
                raise ValueError(
                    f"acceptance.phases.{name} has {len(probs)} positions; "
                    f"the deepest captured depth needs {max(depths)}"
                )
        if self.shapes is not None:
            self._check_shapes(self.shapes)
        if self.static_shape is not None and self.static_shape not in (self.shapes or {}):
            raise ValueError(f"static_shape {self.static_shape!r} is not among shapes "
                             f"{sorted(self.shapes or {})}")
        return self

    def _check_shapes(self, shapes: dict[str, ShapeCost]) -> None:
        phases: set[str] | None = None
        for name, cost in shapes.items():
            try:
                shape = parse_shape(name)
            except ShapeError as err:
                raise ValueError(f"shapes: {err}") from None
            if name != label(shape):
                raise ValueError(f"shapes: write {name!r} as {label(shape)}")
            # every shape, plain too: a fit's terms may take its cost below zero
            cap = self.scheduler.max_running_requests_spec
            if float(np.min(self.shape_iteration_ms(name, np.arange(1, cap + 1)))) <= 0:
                raise ValueError(f"shapes.{name}: its iteration costs 0 ms or less at some batch "
                                 f"up to {cap}; raise fixed_ms or us_per_position")
            if shape is None:
                if cost.accept_length:
                    raise ValueError("shapes.plain: a plain server accepts nothing; drop "
                                     "its accept_length")
                continue
            over = {p: v for p, v in cost.accept_length.items() if v > shape.steps + 1}
            if over:
                raise ValueError(f"shapes.{name}.accept_length: {over} exceeds steps + 1 "
                                 f"({shape.steps + 1}), the most a step can emit")
            if phases is None:
                phases = set(cost.accept_length)
            if not cost.accept_length or set(cost.accept_length) != phases:
                raise ValueError(f"shapes.{name}.accept_length: phases "
                                 f"{sorted(cost.accept_length)}; every shape needs the same "
                                 f"phases ({sorted(phases)})")

    @property
    def shape_phases(self) -> list[str]:
        """The acceptance phases the shapes were measured on (empty: no shape that drafts)."""
        for name, cost in (self.shapes or {}).items():
            if name != PLAIN:
                return list(cost.accept_length)
        return []

    # ------------------------------------------------------------------ cost model

    def target_ms(self, batch: Any, tokens_per_req: Any, context: Any = None) -> np.ndarray:
        """Target forward time (ms) for `batch` requests of `tokens_per_req` tokens each."""
        c = self.target
        b = np.asarray(batch, dtype=float)
        t = b * np.asarray(tokens_per_req, dtype=float)
        ctx = self.context_tokens if context is None else np.asarray(context, dtype=float)
        kv = c.kv_us_per_req_per_1k_ctx * b * (ctx / 1000.0) / 1000.0
        mem = c.weight_read_ms + (kv if c.kv_in_roofline else 0.0)
        if c.moe is not None:
            untouched = (1.0 - c.moe.top_k / c.moe.experts) ** t
            mem = mem + c.moe.expert_read_ms * (1.0 - untouched)
        compute = c.compute_us_per_token * t / 1000.0
        p = c.roofline_sharpness
        core = (mem**p + compute**p) ** (1.0 / p)
        if not c.kv_in_roofline:
            core = core + kv
        per_req = c.per_req_us * b / 1000.0
        return np.asarray(
            c.fixed_ms + c.comm_ms + c.comm_us_per_token * t / 1000.0 + core + per_req
        )

    def _draft_kv_ms(self, b: np.ndarray, context: Any) -> Any:
        ctx = self.context_tokens if context is None else np.asarray(context, dtype=float)
        return self.draft.kv_us_per_req_per_1k_ctx * b * (ctx / 1000.0) / 1000.0

    def draft_step_ms(self, batch: Any, context: Any = None) -> np.ndarray:
        d = self.draft
        b = np.asarray(batch, float)
        return np.asarray(
            d.step_fixed_ms + d.step_us_per_req * b / 1000.0 + self._draft_kv_ms(b, context)
        )

    def draft_extend_ms(self, batch: Any, tokens_per_req: Any, context: Any = None) -> np.ndarray:
        d = self.draft
        b = np.asarray(batch, float)
        t = b * np.asarray(tokens_per_req, float)
        per_req = d.extend_us_per_req * b / 1000.0 + self._draft_kv_ms(b, context)
        return np.asarray(d.extend_fixed_ms + d.extend_us_per_token * t / 1000.0 + per_req)

    def draft_round_ms(self, batch: Any, width: int, context: Any = None) -> np.ndarray:
        """One drafting round of a tree: a draft forward over `width` tokens per request, the
        prefix read once per request."""
        d = self.draft
        b = np.asarray(batch, float)
        return np.asarray(
            d.step_fixed_ms + d.step_us_per_req * b * width / 1000.0 + self._draft_kv_ms(b, context)
        )

    def shape_iteration_ms(self, name: str, batch: Any, context: Any = None) -> np.ndarray:
        """Mean time (ms) of one decode iteration of static shape `name` (one of `shapes`):
        the cost model at the shape plus the shape's own terms (module docstring)."""
        assert self.shapes is not None and name in self.shapes, name
        cost = self.shapes[name]
        shape = parse_shape(name)
        b = np.asarray(batch, float)
        sched = self.scheduler.sched_ms + self.scheduler.untimed_ms
        if shape is None:
            model = self.target_ms(b, 1, context) + sched
            positions = b
        else:
            s, k, n = shape.steps, shape.topk, shape.draft_tokens
            model = (
                self.target_ms(b, n, context)
                + self.draft_extend_ms(b, s + 1, context)
                + s * self.draft_round_ms(b, k, context)
                + sched
                + self.draft.spec_sched_ms
            )
            positions = b * n
        return np.asarray(model + cost.fixed_ms + cost.us_per_position * positions / 1000.0)

    def _static_depth(self) -> int | None:
        shape = parse_shape(self.static_shape or PLAIN)
        return None if shape is None else shape.steps

    def iteration_ms(self, depth: int | None, batch: Any, context: Any = None) -> np.ndarray:
        """Mean time (ms) of one decode iteration; depth None = a server without speculation."""
        if self.static_shape is not None and depth == self._static_depth():
            return self.shape_iteration_ms(self.static_shape, batch, context)
        sched = self.scheduler.sched_ms + self.scheduler.untimed_ms
        if depth is None:
            return self.target_ms(batch, 1, context) + sched
        n = depth + 1
        extend = (
            self.draft_extend_ms(batch, n, context)
            if depth > 0 or self.draft.extend_at_depth0
            else 0.0
        )
        plain_decode = depth == 0 and self.draft.plain_decode_at_depth0
        return (
            self.target_ms(batch, n, context)
            + extend
            + depth * self.draft_step_ms(batch, context)
            + sched
            + (self.draft.plain_decode_sched_ms if plain_decode else self.draft.spec_sched_ms)
        )

    def host_us_per_req(self, speculative: bool, depth: int | None = None) -> float:
        """Host work (us) per running request of a decode iteration; `depth` tells depth 0's
        plain decode path (`draft.plain_decode_at_depth0`) from the verify."""
        s = self.scheduler
        if self.static_shape is not None:
            return 0.0  # the shape's own terms hold its host work
        if not speculative:
            return s.host_us_per_req
        if depth == 0 and self.draft.plain_decode_at_depth0:
            return s.host_us_per_req + s.plain_decode_host_us_per_req
        return s.host_us_per_req + s.spec_host_us_per_req

    def host_ms(self, batch: Any, tokens: Any, speculative: bool = False,
                depth: int | None = None) -> Any:
        """Host work of one decode iteration over `batch` requests emitting `tokens` tokens."""
        per_req = self.host_us_per_req(speculative, depth)
        per_token = self.scheduler.host_us_per_token
        return (per_req * np.asarray(batch, float) + per_token * tokens) / 1e3

    @property
    def host_bound(self) -> bool:
        s = self.scheduler
        if self.static_shape is not None:
            return False  # the shape's own terms hold its host work
        return (s.host_us_per_req > 0 or s.host_us_per_token > 0 or s.spec_host_us_per_req > 0
                or s.plain_decode_host_us_per_req > 0)

    def decode_step_ms(
        self,
        depth: int | None,
        batch: Any,
        context: Any = None,
        tokens_per_req: Any = 1.0,
        real_batch: Any = None,
    ) -> np.ndarray:
        """Wall time (ms) of one decode iteration: `iteration_ms`, or the host work beside its
        forward when that takes longer. `batch` is what the GPU runs (CUDA-graph padded),
        `real_batch` the requests the host handles (default: `batch`)."""
        step = self.iteration_ms(depth, batch, context)
        if not self.host_bound:
            return step
        b = np.asarray(batch if real_batch is None else real_batch, float)
        untimed = self.scheduler.untimed_ms
        host = self.host_ms(b, b * np.asarray(tokens_per_req, float), depth is not None, depth)
        return np.asarray(np.maximum(step - untimed, host) + untimed)

    def max_running(self, speculative: bool) -> int:
        s = self.scheduler
        return s.max_running_requests_spec if speculative else s.max_running_requests_nospec

    def decode_tok_per_s(self, depth: int | None, batch: Any, phase: str | None = None) -> Any:
        """Steady decode throughput (tok/s) of `batch` running requests, no prefill."""
        accept = (
            1.0
            if depth is None
            else self.acceptance.expected_length(phase or self.acceptance.default_phase, depth)
        )
        b = np.asarray(batch, float)
        return b * accept / (self.decode_step_ms(depth, b, tokens_per_req=accept) / 1000.0)


class ProfileError(ValueError):
    """A profile file is missing or invalid; the message names the field and the file."""


def builtin_profiles() -> list[str]:
    return builtin_names(PROFILES_DIR)


def load_profile(name_or_path: str | Path) -> Profile:
    """Load a built-in profile by name, or a profile YAML file by path."""
    return load_named_yaml(
        name_or_path,
        folder=PROFILES_DIR,
        model=Profile,
        error=ProfileError,
        kind="profile",
        explain=_explain,
    )


def _explain(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "(top level)"
        lines.append(f"{loc}: {e['msg']}")
    return "; ".join(lines)
