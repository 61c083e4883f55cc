"""The hook functions registered with SGLang's HookRegistry (see adapters/ for the targets).

Each one is a thin translation from SGLang's objects to `runtime.SchedulerRuntime` calls.
Hooks on the per-iteration path do O(1) work and never touch the GPU synchronously. A hook
that fails logs once and lets SGLang's own code path continue: the plugin must never be
the reason a server stops serving.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from sglang_hooks.adapters.base import Adapter
from sglang_hooks.contract import (
    PolicyError,
    decode_table,
    has_policy_keys,
    read_server_state,
    split_policy_keys,
)
from sglang_hooks.gpu_timer import make_timer
from sglang_hooks.policy_file import load_policy_file, policy_file_from_env, table_fingerprint
from sglang_hooks.runtime import SchedulerRuntime

logger = logging.getLogger("specctl")

ADAPTER: Adapter | None = None
RUNTIME = SchedulerRuntime()


class _HttpSide:
    """What the HTTP/tokenizer process knows: why the plugin cannot work here, if it cannot."""

    inactive_reason: str | None = None


HTTP = _HttpSide()

_failed: set[str] = set()


def bind(adapter: Adapter) -> None:
    global ADAPTER
    ADAPTER = adapter
    RUNTIME.timer = make_timer()


def _log_failure_once(name: str) -> None:
    if name not in _failed:
        _failed.add(name)
        logger.exception("specctl: hook %s failed; SGLang continues without it", name)


# ----------------------------------------------------------------------------- config


def _resolved(server_args: Any, name: str, default: Any = None) -> Any:
    """A server arg as SGLang resolved it (0.5.23 resolves some values in a view)."""
    try:
        from sglang.srt.arg_groups.overrides import resolved_view

        return getattr(resolved_view(server_args), name, default)
    except Exception:
        return getattr(server_args, name, default)


def unsupported_config_reason(server_args: Any) -> str | None:
    """Why the plugin cannot steer this server, or None. Mirrors what SGLang refuses."""
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


def on_states_built(result: Any, controller: Any, cuda_graph_bs: Any = None, *args: Any,
                    **kwargs: Any) -> None:
    """AFTER AdaptiveController.init_states: every runtime state exists; start steering."""
    try:
        usable, partial = captured_depths(
            controller.params, controller.worker.speculative_num_steps, cuda_graph_bs
        )
        startup = None
        path = policy_file_from_env()
        if path is not None:
            try:
                startup = load_policy_file(path, captured_depths=usable)
            except PolicyError as err:
                logger.error("specctl: start-up table not used, SGLang's choice stays: %s", err)
                RUNTIME.last_rejection = str(err)
        RUNTIME.activate(usable, startup)
        # Every TP rank logs this line: with several nodes, each reads its own policy file,
        # and ranks running different tables would run different depths (a collective hang).
        logger.info("specctl: active; depths usable by a table: %s%s; start-up table: %s%s",
                    sorted(usable),
                    f" (partly captured, refused: {sorted(partial)})" if partial else "",
                    table_fingerprint(startup), f" from {path}" if startup is not None else "")
    except Exception:
        _log_failure_once("on_states_built")
    return None


def choose_depth(original: Callable[..., int], params: Any, batch_size: int, *args: Any,
                 **kwargs: Any) -> int:
    """AROUND AdaptiveSpeculativeParams.get_steps_for_batch: the table's depth, if any."""
    rt = RUNTIME
    if rt.active:
        try:
            depth = rt.choose(batch_size)
        except Exception:
            _log_failure_once("choose_depth")
            depth = None
        if depth is not None:
            return depth
    return original(params, batch_size, *args, **kwargs)


def feed_ema(original: Callable[..., Any], params: Any, *args: Any, **kwargs: Any) -> Any:
    """AROUND on_verify_complete: keep SGLang's EMA warm, but no EMA switch under a table."""
    new_step = original(params, *args, **kwargs)
    return None if RUNTIME.selector is not None else new_step


_UNTIMED = object()  # a launch whose timer could not start (a real token may be None)


def time_launch(original: Callable[..., Any], worker: Any, batch: Any, *args: Any,
                **kwargs: Any) -> Any:
    """AROUND EAGLEWorkerV2.forward_batch_generation: bracket a decode launch for timing."""
    rt = RUNTIME
    if not rt.active:
        return original(worker, batch, *args, **kwargs)
    rt.launched = False
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
        else:
            rt.timer.discard(token)
    except Exception:
        _log_failure_once("time_launch")
    return result


def count_result(ret: Any, processor: Any, result: Any, batch: Any, *args: Any,
                 **kwargs: Any) -> None:
    """AFTER _resolve_spec_v2_tokens: count the depth the result was launched with."""
    rt = RUNTIME
    if not rt.active:
        return None
    try:
        width = result.speculative_num_draft_tokens
        if width:
            bs = len(batch.reqs)
            assert ADAPTER is not None
            rt.record_result(width - 1, bs, ADAPTER.tokens_of(result, bs),
                             getattr(result, "specctl_launch", None))
    except Exception:
        _log_failure_once("count_result")
    return None


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
        table = RUNTIME.apply_request(requested)
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
    RUNTIME.commit(table)
    return _output(True)


def get_internal_state(ret: Any, owner: Any, *args: Any, **kwargs: Any) -> Any:
    """AFTER the scheduler's get_internal_state: report the live table under "specctl".

    Also exports the counts still pending: after the last decode result before an idle
    spell nothing else would (admin requests are off the per-iteration path)."""
    try:
        ret.internal_state["specctl"] = RUNTIME.report()
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


async def _live_captured_depths(manager: Any) -> frozenset[int]:
    states = read_server_state({"internal_states": await manager.get_internal_state()})
    for state in states:
        if not state.get("active", True):
            raise PolicyError("specctl", f"the plugin is inactive on a scheduler: "
                              f"{state.get('inactive_reason')}")
    depth_sets = [frozenset(s.get("captured_depths", ())) for s in states]
    return frozenset.intersection(*depth_sets)


async def validate_push(original: Callable[..., Any], manager: Any, obj: Any, *args: Any,
                        **kwargs: Any) -> Any:
    """AROUND TokenizerManager.set_internal_state: a malformed table is a 400, not [false]."""
    requested = getattr(obj, "server_args", None)
    if isinstance(requested, Mapping) and has_policy_keys(requested):
        try:
            if HTTP.inactive_reason is not None:
                raise PolicyError("specctl", f"the plugin is inactive on this server: "
                                  f"{HTTP.inactive_reason}")
            decode_table(requested)  # shape first: no scheduler round trip for a typo
            decode_table(requested, captured_depths=await _live_captured_depths(manager))
        except PolicyError as err:
            raise _bad_request(err) from None
    return await original(manager, obj, *args, **kwargs)


