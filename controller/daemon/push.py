"""Push: send a table with `POST /set_internal_state`, classify the answer, read it back.

Answers (SGLang 0.5.23 and the specctl plugin / simulator):
    200 [true, ...]           every DP rank applied the table
    200 [..., false, ...]     a rank refused it: the reason is in /server_info `last_rejection`
    400 {"error": "invalid_policy", "field", "message"}   the plugin refused a bad table
    401 {"error": "Unauthorized"} / 403                     bad or missing admin key
    422                                                     a non-numeric value (SGLang's layer)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from controller.daemon.transport import ServerTransport, TransportError
from sglang_hooks.contract import (
    PolicyError,
    PolicyTable,
    parse_table,
    push_body,
    read_server_state,
)


@dataclass(frozen=True)
class LiveState:
    """What the server reports under /server_info -> internal_states[i]["specctl"]."""

    table: PolicyTable | None  # None: SGLang's own adaptive choice (no specctl table)
    captured_depths: tuple[int, ...]
    source: str
    last_rejection: str | None
    ranks_agree: bool
    max_running: int | None = None  # the server's running-request cap, when it reports one
    # Draft trees a shape server captured (`specctl serve --shapes`); empty on other servers.
    captured_trees: tuple[str, ...] = ()


class ServerStateError(RuntimeError):
    pass


def read_live(transport: ServerTransport) -> LiveState:
    """The live table and captured depths, or ServerStateError with a readable reason."""
    try:
        info = transport.server_info()
        ranks = read_server_state(info)
    except TransportError as err:
        raise ServerStateError(f"/server_info: {err}") from err
    except PolicyError as err:
        raise ServerStateError(f"/server_info: {err}") from err
    first = ranks[0]
    captured: set[int] | None = None
    for r in ranks:
        depths = {int(d) for d in r.get("captured_depths", [])}
        captured = depths if captured is None else captured & depths
    raw_table = first.get("table")
    try:
        table = None if raw_table is None else parse_table(raw_table)
    except PolicyError as err:
        raise ServerStateError(f"/server_info reports an unreadable table: {err}") from err
    agree = all(r.get("table") == raw_table for r in ranks)
    return LiveState(
        table=table,
        captured_depths=tuple(sorted(captured or ())),
        source=str(first.get("source", "none")),
        last_rejection=first.get("last_rejection"),
        ranks_agree=agree,
        max_running=_max_running(info),
        captured_trees=tuple(str(t) for t in first.get("captured_trees") or ()),
    )


def _max_running(info: Any) -> int | None:
    """SGLang's `max_running_requests` (per DP rank when it reports the effective value)."""
    if not isinstance(info, dict):
        return None
    states = info.get("internal_states")
    values = [info.get("max_running_requests")]
    if isinstance(states, list) and states and isinstance(states[0], dict):
        values.insert(0, states[0].get("effective_max_running_requests_per_dp"))
    for v in values:
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


@dataclass(frozen=True)
class PushResult:
    outcome: str  # "applied" | "refused" | "unauthorized" | "error"
    status: int | None
    detail: str

    @property
    def applied(self) -> bool:
        return self.outcome == "applied"


def _describe_body(body: Any) -> str:
    if isinstance(body, dict):
        if body.get("error") == "invalid_policy":
            return f"{body.get('field')}: {body.get('message')}"
        if "error" in body:
            return str(body["error"])
        if "detail" in body:
            return str(body["detail"])[:300]
    return str(body)[:300]


def send_table(
    transport: ServerTransport, table: PolicyTable | None, admin_key: str | None
) -> PushResult:
    """POST the table; never raises for a refusal or an unreachable server."""
    try:
        status, body = transport.set_internal_state(push_body(table), admin_key)
    except TransportError as err:
        return PushResult("error", None, str(err))
    if status == 200:
        if isinstance(body, list) and body and all(isinstance(x, bool) for x in body):
            if all(body):
                return PushResult("applied", status, f"applied on {len(body)} DP rank(s)")
            reason = _rejection_reason(transport)
            return PushResult(
                "refused", status, f"{body.count(False)} of {len(body)} rank(s) refused: {reason}"
            )
        return PushResult("refused", status, f"unexpected answer {_describe_body(body)}")
    if status in (401, 403):
        return PushResult(
            "unauthorized",
            status,
            f"HTTP {status} {_describe_body(body)}: check the target's admin_key "
            "(the server's --admin-api-key)",
        )
    if status in (400, 422):
        return PushResult("refused", status, f"HTTP {status} {_describe_body(body)}")
    return PushResult("error", status, f"HTTP {status} {_describe_body(body)}")


def _rejection_reason(transport: ServerTransport) -> str:
    try:
        live = read_live(transport)
    except ServerStateError as err:
        return f"(reason unavailable: {err})"
    return live.last_rejection or "(the server gave no reason)"


def same_tiers(a: PolicyTable | None, b: PolicyTable | None) -> bool:
    """Tables equal apart from their version number."""
    if a is None or b is None:
        return a is b
    return a.tiers == b.tiers


def verify_table(transport: ServerTransport, table: PolicyTable | None) -> tuple[bool, str]:
    """Read /server_info back and check every DP rank runs `table`."""
    try:
        live = read_live(transport)
    except ServerStateError as err:
        return False, str(err)
    if not live.ranks_agree:
        return False, "DP ranks report different tables"
    if not same_tiers(live.table, table) or (
        table is not None and live.table is not None and live.table.version != table.version
    ):
        got = "none" if live.table is None else live.table.describe()
        return False, f"server reports {got} (version {getattr(live.table, 'version', 0)})"
    return True, "verified"
