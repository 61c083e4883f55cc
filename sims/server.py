"""`SimulatedServer`: one simulated SGLang 0.5.23 server with the specctl plugin loaded.

It speaks the same contract as the real plugin (sglang_hooks/contract.py): the same
`/set_internal_state` semantics and errors, the same `/server_info` readback, the same
`/metrics` series. The daemon's evaluation drives it in-process (`advance`, then scrape);
`sims.http` wraps it in a FastAPI app whose clock runs at a multiple of wall time.

All public methods are thread-safe (one lock): the HTTP app advances the clock from a
background thread while request handlers read metrics and submit requests.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, TypeAdapter, ValidationError

from sglang_hooks import contract
from sglang_hooks.contract import PolicyError, PolicyTable
from sglang_hooks.draft_shape import DraftShape, dominating, parse_shape
from sims.engine import Engine, RequestListener, SimStats
from sims.metrics import new_registry, render
from sims.policies import (
    DepthPolicy,
    FixedDepthPolicy,
    SGLangAdaptivePolicy,
    ShapeTablePolicy,
    TablePolicy,
)
from sims.profile import Profile
from sims.shape_server import SwitchingServer, switching_server
from sims.workload import Workload

log = logging.getLogger(__name__)

SGLANG_VERSION = "0.5.23"


class _SetInternalStateBody(BaseModel):
    # SGLang 0.5.23: SetInternalStateReq.server_args: Dict[str, Union[int, float]].
    server_args: dict[str, int | float]


_BODY = TypeAdapter(_SetInternalStateBody)
# The plugin's plain decode path for depth 0 (sglang_hooks/plain_decode.py) is modelled by its
# cost only (`draft.plain_decode_at_depth0`); a profile without it is a server whose adapter
# runs depth 0 through the verify.
_NO_DECODE_GRAPHS = ("the profile runs depth 0 through the verify "
                     "(draft.plain_decode_at_depth0 false; docs/simulator.md)")


_TREE_VERIFY = "top-k above 1 (tree verify)"  # the plugin's reason on a shape server


def off_path_of(profile: Profile) -> tuple[str, frozenset[contract.OffPathFeature]]:
    """What the simulated plugin runs at depth 0: the pieces of the plugin's off path the
    profile's costs model (the host-work trims are in its host costs, not a piece of their
    own), on the plugin's path where it models any, else SGLang's own depth 0."""
    draft, feature = profile.draft, contract.OffPathFeature
    modelled = ((feature.SKIP_EXTEND, not draft.extend_at_depth0),
                (feature.SKIP_DRAFT_PREFILL, not draft.prefill_at_depth0),
                (feature.PLAIN_DECODE, draft.plain_decode_at_depth0))
    features = frozenset(f for f, runs in modelled if runs)
    return (contract.OFF_PATH_SPECCTL if features else contract.OFF_PATH_SGLANG), features


def _verify_topk(label: str) -> int:
    """The top-k a captured shape's target verify runs at (off's one-token verify: 1)."""
    shape = parse_shape(label)
    return 1 if shape is None else shape.topk


class SimulatedServer:
    """A simulated speculative-decoding SGLang server. See docs/simulator.md#in-process-api."""

    def __init__(
        self,
        profile: Profile,
        workload: Workload,
        *,
        seed: int = 0,
        admin_key: str | None = None,
        api_key: str | None = None,
        speculative: bool = True,
        model_name: str | None = None,
        table: PolicyTable | None = None,
        policy: DepthPolicy | None = None,
        device_timer: bool = False,
        shapes: list[str] | None = None,
    ) -> None:
        """`table`: a policy file frozen at start-up (source "startup"). `policy`: run this
        policy instead (a fixed depth or the oracle, for baselines); both optional.
        `device_timer`: export SGLang's GPU seconds per forward kind, as SGLang does with
        SGLANG_ENABLE_METRICS_DEVICE_TIMER=1. `shapes`: a shape server (`specctl serve
        --shapes`): started at the listed shape that dominates the others, having captured
        every one, running the start-up shape until a table says otherwise (profile shapes,
        `sims.shape_server.switching_server`)."""
        self.shape_server: SwitchingServer | None = None
        self.startup_shape: str | None = None
        if shapes is not None:
            if not speculative:
                raise ValueError("a shape server drafts: drop --no-speculative or --shapes")
            self.shape_server = switching_server(profile, shapes)
            top = dominating([parse_shape(s) for s in shapes])  # ShapeError: none dominates
            assert top is not None  # switching_server refused a list that drafts nothing
            self.startup_shape = top.label
            profile = self.shape_server.profile
            policy = FixedDepthPolicy(self.shape_server.keys[top.label])
        self.profile = profile
        self.workload = workload
        self.speculative = speculative
        self.device_timer = device_timer
        self.model_name = model_name or profile.name
        self.admin_key = admin_key
        self.api_key = api_key
        self.gc_freezes = 0  # POST /freeze_gc calls answered (nothing to freeze in a simulator)
        self.cache_flushes = 0  # /flush_cache calls answered (no prefix cache to flush)
        self._lock = threading.RLock()
        lanes = None if self.shape_server is None else self.shape_server.lanes
        self.engine = Engine(profile, workload, seed=seed, speculative=speculative,
                             policy=policy if lanes else None, lanes=lanes)  # fmt: skip
        # What runs with no table: SGLang's adaptive choice, or a shape server's start-up shape.
        self._adaptive = self.engine.policy
        self._captured = list(profile.captured_depths) if speculative else []
        self._trees: list[DraftShape] = []
        self._tree_lanes: dict[int, str] = {}  # a shape server's tree lanes by key
        if self.shape_server is not None:
            self._captured = []
            for label, key in self.shape_server.keys.items():
                shape = parse_shape(label)
                if shape is None:  # plain: the server's off, depth 0 as the plugin reports it
                    self._captured.append(0)
                elif shape.is_chain:
                    self._captured.append(shape.steps)
                else:
                    self._trees.append(shape)
                    self._tree_lanes[key] = label
        self._table: PolicyTable | None = None
        self._source = "none"
        self._last_rejection: str | None = None
        # What depth 0 runs, as the profile models it; fixed, as on a real server. A shape
        # server runs off only with plain captured, the draft extend skipped (its view's
        # draft costs, `switching_server`); without it no depth 0, no piece of the plugin's.
        self._off_path, self._features = off_path_of(profile)
        if self.shape_server is not None and 0 not in self._captured:
            self._off_path, self._features = contract.OFF_PATH_SGLANG, frozenset()
        self._applied_iteration: int | None = None
        self._live_version = 0
        # Of finished streaming requests: tokens, requests, TTFT seconds, latency seconds.
        self._streaming_finished = [0.0, 0.0, 0.0, 0.0]
        self._target = 0.0
        # Simulated seconds per wall second when served over HTTP (sims.http sets it), so that
        # a client can convert what it timed back to the simulation's clock.
        self.speedup: float | None = None
        # When served: the wall-clock time (time.monotonic) at which simulated time t comes.
        self.wall_time_of: Callable[[float], float] | None = None
        if table is not None:
            self._table = table
            self._source = "startup"
            self._install_now(self._table_policy(table), table.version)
        elif policy is not None and self.shape_server is None:
            self._source = "startup"
            if isinstance(policy, FixedDepthPolicy):
                self._table = contract.single_depth_table(policy.depth)
            self._install_now(policy, 0)
        self._apply_prefill_skip()
        self._registry = new_registry(self)

    def _install_now(self, policy: DepthPolicy, version: int) -> None:
        self.engine.set_policy(policy, on_applied=self._applied(version))
        self.engine._apply_pending_policy()

    # ------------------------------------------------------------------ clock

    @property
    def now(self) -> float:
        """Simulated seconds since start."""
        return self.engine.now

    def advance(self, seconds: float) -> None:
        """Run the simulation forward by `seconds` of simulated time."""
        if seconds < 0:
            raise ValueError(f"seconds must be >= 0, got {seconds}")
        with self._lock:
            # Nominal time: an iteration that ends past the target must not push later targets.
            self._target += seconds
            self.engine.run_until(self._target)

    def advance_to(self, sim_time: float) -> None:
        """Run the simulation until `sim_time` (no-op if already past it)."""
        with self._lock:
            self._target = max(self._target, sim_time)
            if sim_time > self.engine.now:
                self.engine.run_until(sim_time)

    def set_concurrency(self, concurrency: float | None) -> None:
        """Set the closed-loop client count from now on (None: follow the workload again)."""
        if concurrency is not None and concurrency < 0:
            raise ValueError(f"concurrency must be >= 0, got {concurrency}")
        with self._lock:
            self.engine.set_concurrency(concurrency)

    def stats(self) -> SimStats:
        with self._lock:
            out = self.engine.stats.copy()
            out.now = self.engine.now
            return out

    # ------------------------------------------------------------------ requests

    def submit(
        self,
        prompt_tokens: int,
        max_new_tokens: int,
        listener: RequestListener | None = None,
    ) -> int:
        """A request from outside the workload; it joins the queue at the current time."""
        with self._lock:
            return self.engine.submit(prompt_tokens, max_new_tokens, listener)

    def abort(self, rid: int) -> bool:
        """Drop a request whose client went away (False if it had finished already)."""
        with self._lock:
            return self.engine.abort(rid)

    def record_streaming_finished(
        self, tokens: int, ttft_s: float = 0.0, latency_s: float = 0.0
    ) -> None:
        with self._lock:
            done = self._streaming_finished
            done[0] += tokens
            done[1] += 1
            done[2] += ttft_s
            done[3] += latency_s

    def finished_by_streaming(self) -> dict[bool, tuple[int, int]]:
        """(output tokens, requests) of finished requests, streaming or not."""
        st = self.engine.stats
        s_tok, s_req = int(self._streaming_finished[0]), int(self._streaming_finished[1])
        return {
            False: (st.completed_output_tokens - s_tok, st.completed_requests - s_req),
            True: (s_tok, s_req),
        }

    def latency_by_streaming(self) -> dict[bool, tuple[int, float, float]]:
        """(requests, TTFT seconds, latency seconds) summed over finished requests."""
        st = self.engine.stats
        _, req, ttft, lat = self._streaming_finished
        return {
            False: (st.completed_requests - int(req), st.ttft_sum_s - ttft, st.latency_sum_s - lat),
            True: (int(req), ttft, lat),
        }

    # ------------------------------------------------------------------ auth

    def authorize(
        self, level: Literal["normal", "admin_optional"], authorization: str | None
    ) -> bool:
        """SGLang 0.5.23's rule (srt/utils/auth.py) for NORMAL and ADMIN_OPTIONAL endpoints."""
        key = (self.admin_key or self.api_key) if level == "admin_optional" else self.api_key
        if not key:
            return True
        if not authorization:
            return False
        parts = authorization.split(" ", 1)
        if len(parts) != 2 or parts[0].lower() != "bearer":
            return False
        return secrets.compare_digest(parts[1], key)

    # ------------------------------------------------------------------ admin RPC

    def set_internal_state(self, body: object, authorization: str | None) -> tuple[int, object]:
        """POST /set_internal_state -> (HTTP status, JSON body), as the plugin answers it."""
        if not self.authorize("admin_optional", authorization):
            return 401, {"error": "Unauthorized"}
        try:
            req = _BODY.validate_python(body)
        except ValidationError as err:
            return 400, validation_error_body(_fastapi_errors(err))
        with self._lock:
            ours, rest = contract.split_policy_keys(req.server_args)
            table: PolicyTable | None = None
            if ours:
                try:
                    table = contract.decode_table(ours, captured_depths=self._captured,
                                                  captured_trees=self._trees)  # fmt: skip
                except PolicyError as err:
                    self._last_rejection = f"{err.field}: {err.message}"
                    log.warning("specctl: policy push rejected: %s", self._last_rejection)
                    return 400, contract.rejection_body(err)
            for key, value in rest.items():
                reason = self._sglang_key_rejection(key, value)
                if reason is not None:
                    # SGLang refuses the whole request when one key is refused; so do we.
                    log.warning(reason)
                    if ours:  # as the plugin: the table in it was refused too
                        self._last_rejection = reason
                    return 200, [False]
            if ours:
                self._install(table)
            self._apply_prefill_skip()  # changes what an admission costs
            return 200, [True]

    def _apply_prefill_skip(self) -> None:
        # As in the plugin (sglang_hooks/draft_prefill.py): only under a table.
        self.engine.skip_draft_prefill = (
            self.engine.speculative and self._table is not None
            and contract.OffPathFeature.SKIP_DRAFT_PREFILL in self._features)

    def _sglang_key_rejection(self, key: str, value: float) -> str | None:
        """Why SGLang 0.5.23 would refuse this non-specctl key (None: it accepts it)."""
        if key == "pp_max_micro_batch_size":
            upper = self.engine.max_running
            if not 1 <= value <= upper:
                return (
                    f"Updating {key} to {value} is rejected because it is out of the valid "
                    f"range [1, {upper}]."
                )
            return None
        if key in ("speculative_accept_threshold_single", "speculative_accept_threshold_acc"):
            return None
        return f"Updating {key} is not supported."

    def _install(self, table: PolicyTable | None) -> None:
        self._last_rejection = None
        self._table = table
        self._applied_iteration = None
        if table is None:
            self._source = "none"
            self.engine.set_policy(self._adaptive, on_applied=self._applied(0))
        else:
            self._source = "push"
            policy = self._table_policy(table)
            self.engine.set_policy(policy, on_applied=self._applied(table.version))

    def _table_policy(self, table: PolicyTable) -> DepthPolicy:
        if self.shape_server is None:
            return TablePolicy(table, self.engine.policy_rng)
        return ShapeTablePolicy(table, self.engine.policy_rng, self.shape_server.keys)

    def _applied(self, version: int):  # type: ignore[no-untyped-def]
        def on_applied(forward_ct: int) -> None:
            self._applied_iteration = forward_ct
            self._live_version = version

        return on_applied

    @property
    def policy_version(self) -> int:
        return self._live_version

    @property
    def policy_name(self) -> str:
        return self.engine.policy.name

    def specctl_state(self) -> dict[str, Any]:
        with self._lock:
            state = contract.server_state(
                self._table,
                self._captured,
                source=self._source,
                last_rejection=self._last_rejection,
                applied_iteration=self._applied_iteration,
                captured_trees=self._trees,
            )
            # The plugin's extra keys (sglang_hooks/runtime.py), so readers see the same shape:
            # the simulated plugin is always active and attributes every result.
            state["active"] = True
            state["inactive_reason"] = None
            state["iteration"] = self.engine.forward_ct
            state["unattributed_results"] = 0
            # What depth 0 runs (the profile's, `off_path_of`) and what its pieces did.
            if self.engine.speculative:
                feature = contract.OffPathFeature
                state[contract.OFF_PATH_KEY] = contract.off_path_state(self._off_path,
                                                                       self._features)
                # The depth-0 iterations the cost model ran without the draft extend, and of
                # those, the plain decodes that fenced at their replay.
                skipped = self.engine.stats.iterations_per_depth.get(0, 0) \
                    if feature.SKIP_EXTEND in self._features else 0
                graphs = feature.PLAIN_DECODE in self._features
                state["skipped_draft_extends"] = skipped
                state["skipped_draft_prefills"] = self.engine.skipped_draft_prefills
                state["replay_fences"] = skipped if graphs else 0
                state["host_trim_runs"] = {}  # no piece of its own (`off_path_of`)
                state["plain_decode"] = {
                    "runners": 1 if graphs else 0,
                    "unbuilt_reasons": [] if graphs else [
                        _TREE_VERIFY if self.shape_server is not None else _NO_DECODE_GRAPHS],
                    "build_s": 0.0,
                    "memory_gb": None, "launches": 0, "fallbacks": 0, "last_fallback": None,
                    "settled": 0, "light_inputs": 0}
            if self.shape_server is not None:
                state.update(self._shape_report())
            return state

    @property
    def captured_depths(self) -> list[int]:
        return list(self._captured)

    @property
    def lane_labels(self) -> dict[int, str]:
        """A shape server's tree lanes by key (its chains count as their depths)."""
        return self._tree_lanes

    def _shape_report(self) -> dict[str, Any]:
        """What the plugin adds on a shape server: results of a tree, and its shapes."""
        assert self.shape_server is not None and self.startup_shape is not None
        engine = self.engine
        label_of = {k: lane.label for k, lane in self.shape_server.lanes.items()}
        trees = self._tree_lanes
        tree_results = sum(int(c[0]) for (lane, _), c in engine.counters.items() if lane in trees)
        # before the first decode the start-up shape is live (lane 0 is off's, not "none yet")
        live = label_of[engine.last_lane] if engine.counters else self.startup_shape
        captured = {label: {"capture_s": 0.0, "memory_gb": None,
                            "target_topk": _verify_topk(label), "mask_read": k in trees}
                    for k, label in label_of.items()}  # fmt: skip
        return {"tree_results": tree_results,
                "shapes": {"startup": self.startup_shape, "live": live,
                           "switches": engine.lane_switches, "captured": captured,
                           "refused": {}}}  # fmt: skip

    # ------------------------------------------------------------------ readback

    def server_info(self) -> dict[str, Any]:
        """GET /server_info: SGLang's startup configuration plus per-DP-rank internal state."""
        with self._lock:
            engine = self.engine
            internal: dict[str, Any] = {
                "effective_max_running_requests_per_dp": engine.max_running,
                "last_gen_throughput": engine.gauges.gen_throughput,
                "world_size": 1,
                contract.SERVER_INFO_KEY: self.specctl_state(),
            }
            if self.speculative:
                internal["avg_spec_accept_length"] = engine.stats.accept_length
                adaptive = self._adaptive
                if isinstance(adaptive, SGLangAdaptivePolicy):
                    internal["adaptive_slot_steps"] = {
                        str(k): v for k, v in adaptive.slot_steps().items()
                    }
            p = self.profile
            sched = p.scheduler
            return {
                "model_path": self.model_name,
                "served_model_name": self.model_name,
                "speculative_algorithm": "EAGLE3" if self.speculative else None,
                **self._speculative_args(),
                "max_running_requests": engine.max_running,
                "max_prefill_tokens": sched.max_prefill_tokens,
                # The engine runs a long prompt's chunks back to back in one prefill iteration.
                "chunked_prefill_size": sched.max_prefill_tokens,
                "max_total_num_tokens": sched.max_total_tokens,
                "context_length": sched.context_length,
                # SGLang's rule (tp_worker): min(context - 1, pool - 1) - 5.
                "max_req_input_len": min(sched.context_length, sched.max_total_tokens) - 6,
                "page_size": 1,
                "cuda_graph_max_bs_decode": engine.max_running,
                "schedule_policy": "fcfs",
                "enable_mixed_chunk": False,
                "tp_size": 1,
                "dp_size": 1,
                "enable_metrics": True,
                "decode_log_interval": 40,
                "scheduler_recv_interval": sched.recv_interval,
                "internal_states": [internal],
                "version": SGLANG_VERSION,
                "frontend": "python",
                "simulated": {
                    "profile": p.name,
                    "now_s": engine.now,
                    "policy": self.policy_name,
                    "speedup": self.speedup,
                },
            }

    def _speculative_args(self) -> dict[str, Any]:
        """SGLang's EAGLE flags as the server was started: a shape server statically at its
        start-up shape, otherwise adaptive at the profile's full depth."""
        if not self.speculative:
            return {"speculative_num_steps": None, "speculative_eagle_topk": None,
                    "speculative_num_draft_tokens": None, "speculative_adaptive": False}
        if self.startup_shape is not None:
            shape = parse_shape(self.startup_shape)
            assert shape is not None
            return {"speculative_num_steps": shape.steps, "speculative_eagle_topk": shape.topk,
                    "speculative_num_draft_tokens": shape.draft_tokens,
                    "speculative_adaptive": False}  # fmt: skip
        depth = self.profile.full_depth
        return {"speculative_num_steps": depth, "speculative_eagle_topk": 1,
                "speculative_num_draft_tokens": depth + 1, "speculative_adaptive": True}

    def metrics_text(self) -> str:
        """GET /metrics body (Prometheus text exposition format)."""
        with self._lock:
            return render(self._registry)

    def base_label_values(self) -> list[str]:
        return [self.model_name, "unified", "0", "0", "0"]


def validation_error_body(errors: list[dict[str, Any]]) -> dict[str, Any]:
    """SGLang's answer to a body that fails request validation: 400, not FastAPI's 422.

    SGLang 0.5.23 overrides FastAPI's RequestValidationError handler with its ErrorResponse
    shape; the message carries each error's location, so it names the offending field.
    """
    where = "; ".join(".".join(str(x) for x in e["loc"]) + f": {e['msg']}" for e in errors)
    return {
        "object": "error",
        "message": f"{len(errors)} validation error(s): {where}",
        "type": "Bad Request",
        "param": None,
        "code": 400,
    }


def _fastapi_errors(err: ValidationError) -> list[dict[str, Any]]:
    """Pydantic errors in FastAPI's 422 shape: loc starts with "body"."""
    return [
        {"type": e["type"], "loc": ["body", *e["loc"]], "msg": e["msg"], "input": _jsonable(e)}
        for e in err.errors(include_url=False)
    ]


def _jsonable(error: Any) -> Any:
    value = error.get("input")
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)
    return value
