"""The hook functions registered with SGLang's HookRegistry (see adapters/ for the targets).

Each one is a thin translation from SGLang's objects to `runtime.SchedulerRuntime` calls.
Hooks on the per-iteration path do O(1) work and never touch the GPU synchronously. A hook
that fails logs once and lets SGLang's own code path continue: the plugin must never be
the reason a server stops serving.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from sglang_hooks import (
    draft_prefill,
    fence,
    lean_host,
    override_log,
    plain_decode,
    settings,
    shapes,
)
from sglang_hooks.adapters.base import Adapter, OffPathFeature
from sglang_hooks.contract import (
    PolicyError,
    has_policy_keys,
    read_server_state,
    split_policy_keys,
    state_trees,
)
from sglang_hooks.draft_shape import DraftShape, Shape, label
from sglang_hooks.gpu_timer import make_timer
from sglang_hooks.peers import (
    SHAPES_FIX,
    SHAPES_STAKE,
    PeerCheck,
    default_peer_check,
    fingerprint,
)
from sglang_hooks.policy_file import load_policy_file, policy_file_from_env, table_fingerprint
from sglang_hooks.runtime import NOT_STARTED, SchedulerRuntime, validate_change

logger = logging.getLogger("specctl")

ADAPTER: Adapter | None = None
RELEASE: str | None = None  # the SGLang version the guard read, once bound
# What depth 0 runs in this process (plugin.register): the path and the adapter's pieces of it.
OFF_PATH = settings.SPECCTL
FEATURES: frozenset[OffPathFeature] = frozenset()
RUNTIME = SchedulerRuntime()
SHAPES: shapes.ShapeRegistry | None = None  # this scheduler's captured shapes (a shape server)


class _HttpSide:
    """What the HTTP/tokenizer process knows: why the plugin cannot work here, if it cannot."""

    inactive_reason: str | None = None


HTTP = _HttpSide()

_failed: set[str] = set()


def bind(adapter: Adapter, release: str | None, off_path: str,
         features: Iterable[OffPathFeature]) -> None:
    global ADAPTER, RELEASE, OFF_PATH, FEATURES
    ADAPTER, RELEASE = adapter, release
    OFF_PATH, FEATURES = off_path, frozenset(features)


def _log_failure_once(name: str) -> None:
    if name not in _failed:
        _failed.add(name)
        logger.exception("specctl: hook %s failed; SGLang continues without it", name)


# ----------------------------------------------------------------------------- config


def _resolved(server_args: Any, name: str, default: Any = None) -> Any:
    """A server arg as SGLang resolved it (0.5.23 resolves some values in a view)."""
    return getattr(_resolved_args(server_args), name, default)


def _resolved_args(server_args: Any) -> Any:
    """The server args as SGLang resolved them: 0.5.23's resolved view, else the record."""
    try:
        from sglang.srt.arg_groups.overrides import resolved_view

        return resolved_view(server_args)
    except Exception:
        return server_args


def unsupported_config_reason(server_args: Any) -> str | None:
    """Why the plugin cannot steer this server, or None. Mirrors what SGLang refuses."""
    if settings.SHAPES.get():
        return shape_config_reason(server_args)
    from sglang.srt.speculative.adaptive_spec_params import adaptive_unsupported_reason

    try:
        sglang_reason = adaptive_unsupported_reason(server_args)
    except Exception as err:  # unresolved args on an unexpected path: report, do not crash
        sglang_reason = f"cannot evaluate adaptive support ({err})"
    if not _resolved(server_args, "speculative_adaptive", False):
        base = "speculative_adaptive is off (start with --speculative-adaptive; `specctl serve`"
        base += " adds it)"
        return f"{base}; SGLang also refuses adaptive here: {sglang_reason}" if sglang_reason \
            else base
    if sglang_reason is not None:
        return f"SGLang disabled adaptive speculation: {sglang_reason}"
    return pipeline_reason(server_args)


def shape_config_reason(server_args: Any) -> str | None:
    """Why a server given SPECCTL_SHAPES cannot switch them, read off its arguments (the
    scheduler checks its worker too, shapes.server_reason)."""
    if ADAPTER is not None and not ADAPTER.switches_shapes:
        return f"SPECCTL_SHAPES is not supported on this SGLang ({ADAPTER.name})"
    if _resolved(server_args, "speculative_adaptive", False):
        return "SPECCTL_SHAPES captures its own states; drop --speculative-adaptive"
    if (_resolved(server_args, "speculative_eagle_topk", 1) or 1) <= 1:
        return ("SPECCTL_SHAPES needs a server started at the tree that dominates the list "
                "(--speculative-eagle-topk above 1)")
    # Tensor parallelism passes: the ranks agree before the capture (build_shapes).
    if (_resolved(server_args, "pp_size", 1) or 1) > 1:
        return "pipeline parallelism is not supported with SPECCTL_SHAPES yet"
    return None


def pipeline_reason(server_args: Any) -> str | None:
    """Why pipeline parallelism keeps the plugin from steering, or None: the one refusal a
    scheduler can reach with its adaptive states built."""
    pp = _resolved(server_args, "pp_size", 1) or 1
    if pp > 1:
        return (f"pp_size={pp}: pipeline parallelism is not supported (only the last stage "
                "runs the draft, so the rank answering admin requests cannot validate depths)")
    return None


def captured_depths(params: Any, initial_steps: int, cuda_graph_bs: Iterable[int] | None
                    ) -> tuple[set[int], set[int]]:
    """(depths usable at every batch size, depths with a state but partial CUDA graphs).

    A depth is usable if SGLang built a runtime state for it and, when CUDA graphs are on,
    captured it for every graph batch size (`cuda_graph_bs_for_step`); otherwise a table
    would run it without a graph at some batch sizes.
    """
    full = set(cuda_graph_bs) if cuda_graph_bs else None
    usable, partial = {int(initial_steps)}, set()
    for step in params.candidate_steps:
        covered = params.cuda_graph_bs_for_step(step) if full is not None else None
        if full is None or covered is None or set(covered) >= full:
            usable.add(int(step))
        else:
            partial.add(int(step))
    return usable, partial - usable


# ----------------------------------------------------------------------------- scheduler side


# SGLang's worker logs one line per runtime-state switch; under a table that is one line per
# iteration that changes depth (exploration switches often). Those lines are dropped while a
# table holds control and counted instead (`depth_switches` in /server_info).
SWITCH_LOGGER = "sglang.srt.speculative.eagle_worker_v2"
SWITCH_PREFIX = "Switch adaptive runtime state"


class QuietSwitchLog(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (RUNTIME.selector is not None and isinstance(record.msg, str)
                    and record.msg.startswith(SWITCH_PREFIX))


_QUIET_SWITCHES = QuietSwitchLog()


def on_states_built(result: Any, controller: Any, cuda_graph_bs: Any = None, *args: Any,
                    **kwargs: Any) -> None:
    """AFTER AdaptiveController.init_states: every runtime state exists; start steering."""
    rt = RUNTIME
    try:
        # What the HTTP side refuses pushes for, this scheduler reports too, instead of a table
        # state no push can reach (the worker holds the draft's copy of the server arguments).
        server_args = getattr(controller.worker, "server_args", None)
        reason = None if server_args is None else pipeline_reason(server_args)
        if reason is not None:
            rt.deactivate(reason)
            logger.warning("specctl: inactive on this scheduler, SGLang runs unchanged: %s",
                           reason)
            return None
        rt.timer = make_timer()  # here, not at plugin load: CUDA is initialised by now
        usable, partial = captured_depths(
            controller.params, controller.worker.speculative_num_steps, cuda_graph_bs
        )
        rt.use_off_path(OFF_PATH, FEATURES)
        startup = None
        path = policy_file_from_env()
        if path is not None:
            try:
                startup = load_policy_file(path, captured_depths=usable)
            except PolicyError as err:
                logger.error("specctl: start-up table not used, SGLang's choice stays: %s", err)
                rt.last_rejection = str(err)
        logging.getLogger(SWITCH_LOGGER).addFilter(_QUIET_SWITCHES)
        try:
            peers = default_peer_check()
        except Exception as err:
            rt.deactivate(f"cannot reach the other TP ranks through torch.distributed's store "
                          f"({type(err).__name__}: {err})")
            logger.error("specctl: not steering, SGLang's own choice stays: %s",
                         rt.inactive_reason)
            return None
        if peers is not None:
            # What must match on every rank; a rank without the plugin publishes nothing.
            peers.publish(fingerprint({
                "depths": sorted(usable),
                **_steering_fields(table_fingerprint(startup), rt.off_path, rt.features),
            }))
        rt.activate(usable, startup, peers)
        # Every TP rank logs this line: with several nodes, each reads its own policy file.
        logger.info("specctl: active; depths usable by a table: %s%s; start-up table: %s%s; "
                    "depth 0 on the %s path (%s)%s",
                    sorted(usable),
                    f" (partly captured, refused: {sorted(partial)})" if partial else "",
                    table_fingerprint(startup), f" from {path}" if startup is not None else "",
                    rt.off_path, ", ".join(sorted(rt.features)) or "SGLang's own depth 0",
                    f"; waits for TP ranks 0-{peers.world_size - 1} to agree before a "
                    f"table takes control" if peers is not None else "")
    except Exception:
        _log_failure_once("on_states_built")
    return None


def _steering_fields(startup: str, off_path: str | None,
                     features: Iterable[OffPathFeature]) -> dict[str, Any]:
    """What every TP rank of any server must share (peers.py): the SGLang adapter, the start-up
    table's digest, what depth 0 runs and SGLang's own skip-extend variable."""
    assert ADAPTER is not None
    return {
        "sglang": ADAPTER.name, "startup": startup, "off_path": off_path,
        "off_path_features": sorted(features),
        settings.SGLANG_SKIP_EXTEND.name: settings.SGLANG_SKIP_EXTEND.get() or "",
    }


def shapes_build(ret: Any, worker: Any, *args: Any, **kwargs: Any) -> Any:
    """AFTER EAGLEWorkerV2.init_cuda_graphs: on a server given SPECCTL_SHAPES, capture each
    listed shape beside the start-up one and start steering over them (shapes.py), once the
    TP ranks agree (`build_shapes`). Anything that goes wrong leaves SGLang at its static
    start-up shape and says why."""
    global SHAPES
    listed = settings.SHAPES.get()
    if not listed or SHAPES is not None:
        return ret
    SHAPES = build_shapes(RUNTIME, worker, listed, default_peer_check)
    return ret


def build_shapes(rt: SchedulerRuntime, worker: Any, listed: Sequence[Shape],
                 peer_check: Callable[..., PeerCheck | None]) -> shapes.ShapeRegistry | None:
    """One scheduler's side of `shapes_build`: agree with the other TP ranks, capture, start
    steering on `rt`. `peer_check` is default_peer_check or one called like it (with the
    wording of a shape server's refusal). Returns the registry, or None where the server
    stays at its start-up shape with nothing captured (`rt.inactive_reason` says why)."""
    peers, registry = None, None
    try:
        reason = shapes.server_reason(worker, _resolved_args(getattr(worker, "server_args", None)))
        if reason is None:
            registry = shapes.ShapeRegistry.start(worker)
            peers, reason = _agree_on_shapes(peer_check, listed, registry.startup)
        if reason is None and registry is not None:
            wanted = shapes.to_capture(list(listed), registry.startup,
                                       settings.SGLANG_SKIP_EXTEND.get())
            _capture_shapes(worker, registry, wanted)
    except shapes.ShapeSetupError as err:
        reason = str(err)
    except Exception as err:
        _log_failure_once("shapes_build")
        reason = f"capturing the listed shapes failed ({type(err).__name__}: {err})"
    if reason is not None or registry is None:
        rt.deactivate(f"SPECCTL_SHAPES: {reason}", peers)
        logger.error("specctl: not steering, the server runs its start-up shape: %s", reason)
        return None
    try:
        _start_shape_steering(rt, registry, peers)
    except Exception:
        _log_failure_once("shapes_build:activate")
    return registry


def _agree_on_shapes(peer_check: Callable[..., PeerCheck | None], listed: Sequence[Shape],
                     startup: DraftShape) -> tuple[PeerCheck | None, str | None]:
    """(the TP check, why no rank captures); (None, None) on a server of one rank. Settled
    before any capture: capturing the target runs TP collectives, so a rank capturing another
    list, or none, would hang the others. Every rank reaches the same verdict (peers.py)."""
    try:
        peers = peer_check(stake=SHAPES_STAKE, fix=SHAPES_FIX)
    except Exception as err:
        return None, (f"cannot reach the other TP ranks through torch.distributed's store "
                      f"({type(err).__name__}: {err})")
    if peers is None:
        return None, None
    try:
        peers.publish(fingerprint(shape_peer_fields(listed, startup)))
        verdict = peers.verdict()
    except Exception as err:  # a broken store: refuse rather than guess
        verdict = f"cannot compare with the other TP ranks ({type(err).__name__}: {err})"
    return peers, None if verdict is None else f"no TP rank captures the listed shapes: {verdict}"


def shape_peer_fields(listed: Sequence[Shape], startup: DraftShape) -> dict[str, Any]:
    """What every TP rank of a shape server must share: a chain server's fields, the list in
    its order (the order of the captures, which names the depths too) and the start-up shape.
    The start-up table is the one its file holds: the capture it is checked against has not
    run yet."""
    return {"shapes": [label(s) for s in listed], "startup_shape": startup.label,
            **_steering_fields(_file_table_fingerprint(), OFF_PATH, FEATURES)}


def _file_table_fingerprint() -> str:
    """The start-up table's digest as its file reads; "none" without a file, or for one that
    does not read (no table runs from it then, on any rank)."""
    path = policy_file_from_env()
    try:
        return table_fingerprint(None if path is None else load_policy_file(path))
    except PolicyError:
        return table_fingerprint(None)


def _capture_shapes(worker: Any, registry: shapes.ShapeRegistry,
                    wanted: list[DraftShape]) -> None:
    import torch
    from sglang.srt.utils import get_available_gpu_memory

    build = ADAPTER.shape_build if ADAPTER is not None else None
    if build is None:  # the config check refuses first; a scheduler must not capture blind
        raise shapes.ShapeSetupError("this SGLang's adapter does not build draft shapes")
    module = sys.modules[type(worker).__module__]
    graphs = not module.check_cuda_graph_backend(module.Phase.DECODE, module.Backend.DISABLED)
    device, gpu_id = worker.device, getattr(worker, "gpu_id", 0)
    free = ((lambda: float(get_available_gpu_memory(device, gpu_id, empty_cache=False)))
            if torch.cuda.is_available() else None)
    for shape in wanted:
        state = shapes.capture(worker, shape, build=build, graphs=graphs, gpu_free_gb=free)
        registry.add(state)
        name = shapes.shape_label(shape)
        logger.info("specctl: shape %s captured in %.1f s%s%s", name, state.capture_s,
                    "" if state.memory_gb is None else f", {state.memory_gb:.2f} GB",
                    f"; refused: {registry.refused[name]}" if name in registry.refused else "")


def _start_shape_steering(rt: SchedulerRuntime, registry: shapes.ShapeRegistry,
                          peers: PeerCheck | None) -> None:
    rt.timer = make_timer()
    rt.use_off_path(*shape_off_path(registry))
    startup = None
    path = policy_file_from_env()
    if path is not None:
        try:
            startup = load_policy_file(path, captured_depths=registry.chains,
                                       captured_trees=registry.trees)
        except PolicyError as err:
            logger.error("specctl: start-up table not used, the start-up shape stays: %s", err)
            rt.last_rejection = str(err)
    rt.activate(registry.chains, startup, peers, captured_trees=registry.trees, agreed=True)
    logger.info("specctl: active on shapes %s (started at %s); start-up table: %s%s%s%s",
                ", ".join(sorted(shapes.shape_label(s) for s in registry.states)),
                registry.startup.label, table_fingerprint(startup),
                f" from {path}" if startup is not None else "",
                f"; off on the {rt.off_path} path" if registry.off is not None else "",
                f"; TP ranks 0-{peers.world_size - 1} agreed before capturing"
                if peers is not None else "")


def shape_off_path(registry: shapes.ShapeRegistry) -> tuple[str, frozenset[OffPathFeature]]:
    """What off runs on a shape server: with plain captured and the plugin's off path here,
    SGLang's depth 0 with the draft extend skipped (its other pieces assume a chain server's
    top-k 1 throughout); else SGLang's own depth 0, or none."""
    if registry.off is None or OFF_PATH != settings.SPECCTL \
            or OffPathFeature.SKIP_EXTEND not in FEATURES:
        return settings.SGLANG, frozenset()
    return settings.SPECCTL, frozenset({OffPathFeature.SKIP_EXTEND})


def shape_switch(original: Callable[..., Any], worker: Any, batch_size: int, *args: Any,
                 **kwargs: Any) -> Any:
    """AROUND EAGLEWorkerV2.activate_step_by_batch: on a shape server, the table's shape for
    this decode launch (the start-up shape while no table rules)."""
    registry = SHAPES
    if registry is None or not RUNTIME.active:
        return original(worker, batch_size, *args, **kwargs)
    try:
        chosen, shape = RUNTIME.choose_shape(batch_size)
        if shape is None:  # an off tier: SGLang's depth 0, captured when plain was listed
            shape = registry.off
        target = shape if chosen and shape in registry.states else registry.startup
        registry.switch(worker, target)
    except Exception:
        _log_failure_once("shape_switch")
    return None


def shape_draft(original: Callable[..., Any], draft_worker: Any, batch: Any, *args: Any,
                **kwargs: Any) -> Any:
    """AROUND EagleDraftWorker.draft: a narrower shape's draft reads the first top-k columns
    of the full-width draft input (shapes.narrowed_draft)."""
    registry = SHAPES
    if registry is None or registry.live.topk == registry.startup.topk:
        return original(draft_worker, batch, *args, **kwargs)
    with shapes.narrowed_draft(draft_worker, batch.spec_info, registry.live.topk):
        return original(draft_worker, batch, *args, **kwargs)


def choose_depth(original: Callable[..., int], params: Any, batch_size: int, *args: Any,
                 **kwargs: Any) -> int:
    """AROUND AdaptiveSpeculativeParams.get_steps_for_batch: the table's depth, if any."""
    rt = RUNTIME
    depth = None
    if rt.active:
        try:
            depth = rt.choose(batch_size)
        except Exception:
            _log_failure_once("choose_depth")
            depth = None
    if depth is None:
        depth = original(params, batch_size, *args, **kwargs)
    return depth


def feed_ema(original: Callable[..., Any], params: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND on_verify_complete: SGLang's own choice does not run while a table rules.

    Not even its EMA update: it would keep switching its own (unused) step and log each
    switch at INFO. On release SGLang resumes from the EMA it had when the table took over."""
    if RUNTIME.selector is not None:
        return None
    return original(params, *args, **kwargs)


_UNTIMED = object()  # a launch whose timer could not start (a real token may be None)


def time_launch(original: Callable[..., Any], worker: Any, batch: Any, *args: Any,
                **kwargs: Any) -> Any:
    """AROUND EAGLEWorkerV2.forward_batch_generation: bracket a decode launch for timing."""
    rt = RUNTIME
    # Reset even while inactive: a skip flag left from the last steered launch must not reach
    # this launch's extend.
    rt.launched = rt.launch_skips_extend = False
    if not rt.active:
        return original(worker, batch, *args, **kwargs)
    rt.spec_worker = worker
    try:
        token = rt.timer.begin()
    except Exception:  # no timing for this launch: its result is counted as unattributed
        _log_failure_once("time_launch")
        token = _UNTIMED
    result = original(worker, batch, *args, **kwargs)
    if token is _UNTIMED:
        return result
    try:
        if rt.launched:  # the depth choice ran: this was a decode launch
            result.specctl_launch = (rt.launch_explore, rt.timer.end(token))
            if SHAPES is not None:  # the shape it ran, read when its result is counted
                result.specctl_shape = SHAPES.live
        else:
            rt.timer.discard(token)
    except Exception:
        _log_failure_once("time_launch")
    return result


def on_apply_state(original: Callable[..., Any], worker: Any, state: Any, *args: Any,
                   **kwargs: Any) -> Any:
    """AROUND EAGLEWorkerV2.apply_runtime_state: count switches, bound SGLang's override log."""
    before = getattr(worker, "speculative_num_steps", None)
    out = original(worker, state, *args, **kwargs)
    try:
        if worker.speculative_num_steps != before:
            RUNTIME.depth_switches += 1
            _drop_superseded_override()
    except Exception:
        _log_failure_once("on_apply_state")
    return out


_context_getter: Callable[[], Any] | None = None


def _drop_superseded_override() -> None:
    global _context_getter
    if _context_getter is None:
        from sglang.srt.runtime_context import get_context

        _context_getter = get_context
    log = getattr(_context_getter(), "_overrides_log", None)
    if isinstance(log, list):
        override_log.drop_superseded(log)


def skip_extend(original: Callable[..., Any], draft_worker: Any, batch: Any, batch_result: Any,
                *args: Any, **kwargs: Any) -> Any:
    """AROUND EagleDraftWorker._draft_extend_for_decode: the skipped extend of the off path.

    Skips only when the depth choice of this launch said so (a table's depth-0 tier that
    probes no positive depth) and the worker really runs depth 0; SGLang's own stub then fills
    the draft inputs, exactly as its SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND switch does. A
    plain decode then hands the WAR barrier its replay's event (fence.py)."""
    rt = RUNTIME
    worker = rt.spec_worker
    if not rt.launch_skips_extend or worker is None \
            or getattr(worker, "speculative_num_steps", None) != 0:
        plain_decode.accept_lens_to_device(batch_result, batch.seq_lens.device)
        return original(draft_worker, batch, batch_result, *args, **kwargs)
    try:
        if SHAPES is not None:  # the stub at the start-up width, as every extend writes
            with shapes.full_width(worker, SHAPES.startup.topk):
                worker._stub_skipped_draft_extend(batch, batch_result)
        elif rt.host_trims:
            lean_host.stub_skipped_extend(worker, batch, batch_result)
        else:
            worker._stub_skipped_draft_extend(batch, batch_result)
    except Exception:
        _log_failure_once("skip_extend")  # the real extend overwrites whatever the stub set
        # a depth-0 plain decode kept its accept lengths on the host for a skipped extend
        plain_decode.accept_lens_to_device(batch_result, batch.seq_lens.device)
        return original(draft_worker, batch, batch_result, *args, **kwargs)
    rt.skipped_extends += 1
    if rt.plain_decode_path:  # its fence at the replay (fence.py)
        try:  # without the event (a verify ran) the barrier keeps its whole-forward fence
            replay = getattr(batch_result, fence.REPLAY_EVENT, None)
            if replay is not None and fence.hand_over(worker, replay):
                rt.replay_fences += 1
        except Exception:
            _log_failure_once("skip_extend:fence")
    return None


def skip_draft_prefill(original: Callable[..., Any], draft_worker: Any, batch: Any,
                       target_hidden_states: Any, next_token_ids: Any, *args: Any,
                       **kwargs: Any) -> Any:
    """AROUND EagleDraftWorker._draft_extend_for_prefill: no draft prefill while off.

    Skips when the admitted requests land in a depth-0 tier that skips its extend
    (draft_prefill.py); the draft input is then the skipped extend's stub over the target's
    bonus tokens. Anything unexpected runs SGLang's extend."""
    rt = RUNTIME
    worker = rt.spec_worker
    stub = None
    try:
        if (worker is not None
                and draft_prefill.skippable_batch(draft_worker, batch, args, kwargs)
                and rt.prefill_skips_draft(len(batch.reqs))):
            stub = draft_prefill.stub_draft_input(worker, batch, next_token_ids,
                                                  reuse_stubs=rt.host_trims)
    except Exception:  # SGLang's own extend then runs
        _log_failure_once("skip_draft_prefill")
    if stub is None:
        return original(draft_worker, batch, target_hidden_states, next_token_ids, *args,
                        **kwargs)
    rt.skipped_prefills += 1
    return stub


def lean_trivial_verify(original: Callable[..., Any], worker: Any, batch: Any, *args: Any,
                        **kwargs: Any) -> Any:
    """AROUND EAGLEWorkerV2._build_trivial_verify_input: under the host-work trims, the
    input's index tensors reused per batch size, and for a batch the plain decode path will
    run, no mask fill or positions until the verify needs them (lean_host.py)."""
    if not RUNTIME.host_trims or args or kwargs:
        return original(worker, batch, *args, **kwargs)
    try:
        for_plain = RUNTIME.plain_decode_path and plain_decode.expects(worker, batch)
        verify_input = lean_host.trivial_verify_input(original, worker, batch, for_plain)
        if lean_host.unfinished(verify_input):
            plain_decode.STATS.light_inputs += 1
        return verify_input
    except Exception:
        _log_failure_once("lean_trivial_verify")
        lean_host.VERIFY_INDEXES.clear()
        return original(worker, batch)


def lean_kv_lens(original: Callable[..., Any], tree_cache: Any, *args: Any,
                 **kwargs: Any) -> Any:
    """AROUND alloc_for_spec_decode: under the host-work trims, the next KV lengths handed
    over as a list where the release reads them one by one (lean_host.py)."""
    if RUNTIME.host_trims:
        try:
            lean_host.kv_lens_as_list(RELEASE, tree_cache, kwargs)
        except Exception:
            _log_failure_once("lean_kv_lens")
    return original(tree_cache, *args, **kwargs)


def lean_prepare(original: Callable[..., Any], batch: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND eagle_prepare_for_decode: under the host-work trims, 0.5.17's preparation with
    its KV lengths copied to the GPU once, from pinned memory (lean_host.py)."""
    if RUNTIME.host_trims and not args and not kwargs:
        try:
            ready = lean_host.prepares(RELEASE, batch)
            if ready:
                from sglang.srt.speculative import eagle_utils

                reserve = eagle_utils.get_alloc_reserve_per_decode()
                alloc = eagle_utils.alloc_for_spec_decode
        except Exception:
            _log_failure_once("lean_prepare")
            ready = False
        if ready:  # past here SGLang's own errors are raised as its body raises them
            RUNTIME.prepare_trims["prepare"] += 1
            return lean_host.prepare_for_decode(batch, reserve, alloc)
    return original(batch, *args, **kwargs)


def lean_tokens_required(original: Callable[..., Any], batch: Any, requests: Any,
                         page_size: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND ScheduleBatch._new_tokens_required_next_decode_spec_v2: under the host-work
    trims, 0.5.17's estimate at a page size of 1 without its page roundings (lean_host.py)."""
    if RUNTIME.host_trims and page_size == 1 and not args and not kwargs \
            and RELEASE in lean_host.PREPARE_RELEASES:
        try:
            from sglang.srt.managers import schedule_batch

            needed = lean_host.tokens_required(requests,
                                               schedule_batch.get_alloc_reserve_per_decode())
            RUNTIME.prepare_trims["estimate"] += 1
            return needed
        except Exception:
            _log_failure_once("lean_tokens_required")
    return original(batch, requests, page_size, *args, **kwargs)


def lean_seq_lens(original: Callable[..., Any], future_map: Any, batch: Any, *args: Any,
                  **kwargs: Any) -> Any:
    """AROUND FutureMap.resolve_seq_lens_cpu: under the host-work trims, 0.5.17's hand-over
    of the next lengths with its gathers through `index_select` (lean_host.py)."""
    if RUNTIME.host_trims and not args and not kwargs:
        try:
            # the module of the hooked method, loaded with it: where its ROCm and debug
            # switches are
            module = sys.modules.get("sglang.srt.managers.overlap_utils")
            ours = lean_host.resolves_seq_lens(RELEASE, future_map, module)
        except Exception:
            _log_failure_once("lean_seq_lens")
            ours = False
        if ours:  # past here SGLang's own errors are raised as its body raises them
            RUNTIME.prepare_trims["hand_over"] += 1
            return lean_host.resolve_seq_lens(future_map, batch)
    return original(future_map, batch, *args, **kwargs)


def lean_isolation(original: Callable[..., Any], scheduler: Any, batch: Any, *args: Any,
                   **kwargs: Any) -> Any:
    """AROUND Scheduler._forward_isolation: under the host-work trims, 0.5.17's isolation of
    a speculative batch with its snapshot and restore in one call each (lean_host.py)."""
    if RUNTIME.host_trims and not args and len(kwargs) == 1 and "overlap" in kwargs:
        try:
            fields = lean_host.isolation_fields(RELEASE, batch)
        except Exception:
            _log_failure_once("lean_isolation")
            fields = None
        if fields is not None:
            RUNTIME.prepare_trims["isolation"] += 1
            return lean_host.Isolation(scheduler, batch, bool(kwargs["overlap"]), fields)
    return original(scheduler, batch, *args, **kwargs)


def lean_free_group_end(original: Callable[..., Any], allocator: Any, *args: Any,
                        **kwargs: Any) -> Any:
    """AROUND BaseTokenToKVPoolAllocator.free_group_end: under the host-work trims, the
    page-size-1 allocator's freed group joined to its list in one concatenation
    (lean_host.py)."""
    if RUNTIME.host_trims and not args and not kwargs:
        try:
            ours = lean_host.free_group_is_ours(RELEASE, allocator)
        except Exception:
            _log_failure_once("lean_free_group_end")
            ours = False
        if ours:  # past here the group is being freed: no second try through SGLang's
            RUNTIME.prepare_trims["free_group_end"] += 1
            return lean_host.end_free_group(allocator)
    return original(allocator, *args, **kwargs)


def plain_decode_build(ret: Any, worker: Any, *args: Any, **kwargs: Any) -> Any:
    """AFTER EAGLEWorkerV2.init_cuda_graphs: the DECODE-mode target graphs for depth 0
    (plain_decode.py). A failed capture leaves depth 0 on the verify."""
    try:
        import torch
        from sglang.srt.utils import get_available_gpu_memory

        device, gpu_id = worker.device, getattr(worker, "gpu_id", 0)
        cuda = torch.cuda.is_available()
        plain_decode.build(worker, gpu_free_gb=(
            (lambda: float(get_available_gpu_memory(device, gpu_id, empty_cache=False)))
            if cuda else None))
    except Exception as err:
        _log_failure_once("plain_decode_build")
        plain_decode.disable(worker, f"capturing the DECODE graphs failed: {err}")
    return ret


def plain_decode_verify(original: Callable[..., Any], worker: Any, batch: Any, *args: Any,
                        **kwargs: Any) -> Any:
    """AROUND EAGLEWorkerV2.verify: a depth-0 decode batch on the target's DECODE graphs,
    its result shaped like the verify's (plain_decode.py)."""
    try:
        reason = plain_decode.batch_reason(worker, batch)
    except Exception:
        _log_failure_once("plain_decode_verify")
        reason = "error"
    if reason is None:
        try:
            result = plain_decode.decode(
                worker, batch,
                extend_skipped=RUNTIME.launch_skips_extend and RUNTIME.spec_worker is worker)
        except Exception as err:  # the batch was restored: the verify runs it
            _log_failure_once("plain_decode_verify")
            plain_decode.disable(worker, f"a plain decode failed: {err}")
            result = None
        if result is not None:
            plain_decode.STATS.launches += 1
            return result
        reason = "no DECODE graph for this batch size"
    if reason != plain_decode.NOT_DEPTH_0:
        plain_decode.STATS.fallbacks += 1
        plain_decode.STATS.last_fallback = reason
    # An input built light for this path gets the mask fill and positions the verify reads.
    lean_host.finish_for_verify(batch.spec_info, batch)
    return original(worker, batch, *args, **kwargs)


def emitted(reqs: Sequence[Any], runs: Any) -> tuple[int, int] | None:
    """(rows, tokens) that SGLang emits from one spec-v2 result, or None if `runs` is not
    the per-request token lists `_resolve_spec_v2_tokens` returns.

    Rows of requests that finished or were retracted before this result was processed
    (overlap scheduling launches them once more) are skipped by SGLang's output loop
    (`req.finished()` is `finished_reason is not None`), and grammar-constrained runs are
    already cut where the grammar ended."""
    if not isinstance(runs, list) or len(runs) != len(reqs):
        return None
    skipped = [i for i, r in enumerate(reqs) if r.is_retracted or r.finished_reason is not None]
    tokens = sum(map(len, runs))
    if skipped:
        tokens -= sum(len(runs[i]) for i in skipped)
    return len(reqs) - len(skipped), tokens


def count_result(original: Callable[..., Any], processor: Any, result: Any, batch: Any,
                 *args: Any, **kwargs: Any) -> Any:
    """AROUND _resolve_spec_v2_tokens: a depth-0 plain decode's result settled in one pass
    (plain_decode.resolve_tokens), any other by SGLang; then what it emitted counted at the
    depth it ran."""
    ret = None
    counted: tuple[int, int] | None = None
    try:
        if not args and not kwargs and plain_decode.plain_result(result, batch):
            ret, rows = plain_decode.resolve_tokens(processor, result, batch)
            counted = (rows, rows)  # one token a row
            plain_decode.STATS.settled += 1
    except Exception:
        _log_failure_once("count_result:plain")
        ret = None
    if ret is None:
        ret = original(processor, result, batch, *args, **kwargs)
    _count(ret, result, batch, counted)
    return ret


def _count(ret: Any, result: Any, batch: Any, counted: tuple[int, int] | None = None) -> None:
    """Count a result at its depth: `counted` (rows, tokens) where the settling knew them,
    else read from what SGLang's body returned."""
    rt = RUNTIME
    if not rt.active:
        return
    try:
        width = result.speculative_num_draft_tokens
        depth: int | str | None = None if not width else width - 1
        if width and SHAPES is not None:  # a shape server: a chain at its steps, a tree by label
            shape = getattr(result, "specctl_shape", None) or SHAPES.by_width(width)
            if shape is None:  # a width two captured shapes share, from an untimed launch
                rt.unattributed_results += 1
                return
            depth = shape.steps if shape.topk == 1 else shape.label
            if shape.topk > 1:
                rt.tree_results += 1
        if depth is not None:
            launched = len(batch.reqs)
            if counted is None:
                counted = emitted(batch.reqs, ret)
            if counted is None:  # unexpected return value: count every row, as SGLang sums
                assert ADAPTER is not None
                counted = (launched, ADAPTER.tokens_of(result, launched))
            rows, tokens = counted
            rt.unemitted_rows += launched - rows
            rt.record_result(depth, rows, tokens, getattr(result, "specctl_launch", None))
    except Exception:
        _log_failure_once("count_result")


def on_metrics_collector(ret: Any, collector: Any, labels: Mapping[str, Any], *args: Any,
                         **kwargs: Any) -> None:
    """AFTER SchedulerMetricsCollector.__init__: export beside SGLang's series (TP rank 0)."""
    try:
        if RUNTIME.exporter is None and str(labels.get("tp_rank", 0)) == "0":
            from sglang_hooks.exporter import PrometheusExporter

            RUNTIME.exporter = PrometheusExporter(labels)
            RUNTIME.flush()
    except Exception:
        _log_failure_once("on_metrics_collector")
    return None


def _output(updated: bool) -> Any:
    from sglang.srt.managers.io_struct import SetInternalStateReqOutput

    return SetInternalStateReqOutput(updated=updated)


def set_internal_state(original: Callable[..., Any], owner: Any, recv_req: Any, *args: Any,
                       **kwargs: Any) -> Any:
    """AROUND the scheduler's set_internal_state: apply a table, report truthfully."""
    requested = recv_req.server_args
    if not isinstance(requested, Mapping) or not has_policy_keys(requested):
        return original(owner, recv_req, *args, **kwargs)
    try:
        change = RUNTIME.apply_request(requested)
    except PolicyError as err:
        RUNTIME.reject(err)
        return _output(False)
    _, rest = split_policy_keys(requested)
    if rest:  # other keys in the same request: SGLang decides on those, all or nothing
        recv_req.server_args = rest
        try:
            out = original(owner, recv_req, *args, **kwargs)
        finally:
            recv_req.server_args = requested
        if not getattr(out, "updated", False):
            RUNTIME.reject(PolicyError("server_args", "SGLang refused the other keys of this "
                                       "request, so the table was not applied either"))
            return out
    RUNTIME.commit(change)
    return _output(True)


def _config_reason(owner: Any) -> str | None:
    """Why this server's configuration keeps the plugin from steering (what a push's 400 says,
    from the same server arguments), read off the scheduler; None when nothing is found."""
    if owner is None or ADAPTER is None:
        return None
    try:
        return unsupported_config_reason(ADAPTER.scheduler_of(owner).server_args)
    except Exception:
        return None


def get_internal_state(ret: Any, owner: Any, *args: Any, **kwargs: Any) -> Any:
    """AFTER the scheduler's get_internal_state: report the live table under "specctl".

    Also exports the counts still pending: after the last decode result before an idle
    spell nothing else would (admin requests are off the per-iteration path)."""
    try:
        report = RUNTIME.report()
        if RUNTIME.inactive_reason == NOT_STARTED:
            reason = _config_reason(owner)
            if reason is not None:
                report["inactive_reason"] = reason
        if SHAPES is not None:
            report["shapes"] = SHAPES.report()
        ret.internal_state["specctl"] = report
    except Exception:
        _log_failure_once("get_internal_state")
    RUNTIME.flush()
    return ret


# ----------------------------------------------------------------------------- HTTP side


def on_tokenizer_manager(ret: Any, manager: Any, server_args: Any, *args: Any,
                         **kwargs: Any) -> None:
    """AFTER TokenizerManager.__init__: say once, in the HTTP process, whether we can steer."""
    try:
        HTTP.inactive_reason = unsupported_config_reason(server_args)
    except Exception as err:
        HTTP.inactive_reason = f"cannot check the configuration: {err}"
    if HTTP.inactive_reason is not None:
        logger.warning("specctl: inactive on this server, SGLang runs unchanged: %s",
                       HTTP.inactive_reason)
    else:
        assert ADAPTER is not None
        logger.info("specctl: ready (%s); push tables with POST /set_internal_state",
                    ADAPTER.name)
    return None


def _bad_request(err: PolicyError) -> Exception:
    from fastapi import HTTPException

    # SGLang's HTTPException handler puts `detail` in ErrorResponse.message, a string.
    return HTTPException(status_code=400, detail=json.dumps(err.to_json()))


async def _live_states(manager: Any) -> list[dict[str, Any]]:
    """Every scheduler's plugin state; raises PolicyError if the plugin is inactive on one."""
    states = read_server_state({"internal_states": await manager.get_internal_state()})
    for state in states:
        if not state.get("active", True):
            raise PolicyError("specctl", f"the plugin is inactive on a scheduler: "
                              f"{state.get('inactive_reason')}")
    return states


def captured_everywhere(states: Sequence[Mapping[str, Any]]) -> frozenset[int]:
    """The depths every scheduler captured."""
    return frozenset.intersection(*(frozenset(s.get("captured_depths", ())) for s in states))


def trees_everywhere(states: Sequence[Mapping[str, Any]]) -> frozenset[DraftShape]:
    """The draft trees every scheduler captured."""
    return frozenset.intersection(*(frozenset(state_trees(s)) for s in states))


async def validate_push(original: Callable[..., Any], manager: Any, obj: Any, *args: Any,
                        **kwargs: Any) -> Any:
    """AROUND TokenizerManager.set_internal_state: a malformed table is a 400, not [false]."""
    requested = getattr(obj, "server_args", None)
    if isinstance(requested, Mapping) and has_policy_keys(requested):
        try:
            if HTTP.inactive_reason is not None:
                raise PolicyError("specctl", f"the plugin is inactive on this server: "
                                  f"{HTTP.inactive_reason}")
            validate_change(requested, None)  # shape first: no scheduler round trip for a typo
            states = await _live_states(manager)
            validate_change(requested, captured_everywhere(states),
                            trees_everywhere(states))
        except PolicyError as err:
            raise _bad_request(err) from None
    return await original(manager, obj, *args, **kwargs)


