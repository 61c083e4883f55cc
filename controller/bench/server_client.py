"""One server seen through the contract: read its table back, push a table, scrape `/metrics`.

Every failure becomes a `ServerError` whose message says what went wrong and what to do, so the
commands can print it as is: an unreachable URL, a missing or wrong admin key or API key (401),
a server without the specctl plugin, a table the server refuses (its 400 names the field).

Two keys, as SGLang has them: the API key (`--api-key` on the server) guards every ordinary
route (`/server_info`, `/v1/*`, `/generate`), and goes with every request but the admin ones;
the admin key (`--admin-api-key`) guards `/set_internal_state`, `/freeze_gc` and
`/flush_cache`, which get it instead (SGLang falls back to the API key there when no admin key
is set, so a server with only an API key takes the API key on those too).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import httpx

from controller.bench.metrics import MetricsFormatError, Scrape, parse_scrape
from sglang_hooks.contract import (
    OFF_PATH_KEY,
    OFF_PATH_SGLANG,
    PolicyError,
    PolicyTable,
    parse_rejection,
    parse_table,
    push_body,
    read_server_state,
    state_trees,
)
from sglang_hooks.draft_shape import DraftShape

ADMIN_KEY_ENV = "SPECCTL_ADMIN_KEY"
# The API key's variable: the plugin's smoke check (sglang_hooks/smoke.py) reads the same one.
API_KEY_ENV = "SPECCTL_API_KEY"


class ServerError(RuntimeError):
    """A server could not be reached, or refused or garbled a request."""


class KeyRefused(ServerError):
    """A server answered 401/403: a key is missing or wrong (the message says which)."""


def admin_key_from_env(explicit: str | None) -> str | None:
    return explicit if explicit else os.environ.get(ADMIN_KEY_ENV) or None


def bearer(key: str | None) -> dict[str, str]:
    """The Authorization header SGLang checks, or none without a key."""
    return {"Authorization": f"Bearer {key}"} if key else {}


def api_key_refused(url: str, path: str, status: int, api_key: str | None) -> KeyRefused:
    """The one line for a 401/403 on an ordinary route: which key is missing or wrong."""
    hint = (
        "the API key given (--api-key) was refused; use the value of the server's --api-key"
        if api_key
        else f"it needs the server's --api-key: pass --api-key or set {API_KEY_ENV}"
    )
    return KeyRefused(f"{url}{path} answered {status} Unauthorized: {hint}")


@dataclass(frozen=True)
class ServerState:
    """The specctl state a server reports in `/server_info` (rank 0; ranks must agree)."""

    table: PolicyTable | None
    version: int
    captured_depths: tuple[int, ...]
    source: str
    last_rejection: str | None
    ranks: int
    captured_trees: tuple[DraftShape, ...] = ()  # draft trees a table may name
    # The plugin's extras: an inactive plugin refuses every push (None: not reported).
    inactive_reason: str | None = None
    # What depth 0 runs (rank 0's `off_path`: the path and its pieces; None: not reported).
    off_path: dict[str, Any] | None = None
    # A server that switches draft shapes: its live and start-up shape, switches and each
    # shape's capture (rank 0's `shapes`; None: not such a server).
    shapes: dict[str, Any] | None = None

    def describe_shapes(self) -> str | None:
        """The live shape and what the shapes cost, in one line; None where none are switched."""
        found = self.shapes
        if found is None:
            return None
        costs = ", ".join(
            f"{name} {c['capture_s']:g} s / {c['memory_gb']:g} GB"
            for name, c in found["captured"].items() if c["memory_gb"] is not None)
        refused = "; refused: " + ", ".join(f"{k} ({v})" for k, v in found["refused"].items()) \
            if found["refused"] else ""
        return (f"live {found['live']} (started at {found['startup']}), "
                f"{found['switches']:,} switches" + (f"; captured {costs}" if costs else "")
                + refused)

    def describe(self) -> str:
        if self.table is not None:
            return self.table.describe()
        if self.shapes is not None:  # a shape server with no table runs its start-up shape
            return f"released (the start-up shape, {self.shapes['startup']})"
        return "released (SGLang's own choice)"

    def describe_off_path(self) -> str | None:
        """What depth 0 runs, in a few words; None where the server does not say."""
        path = self.off_path
        if path is None:
            return None
        if path["path"] is None:
            return "not steering yet"
        if path["path"] == OFF_PATH_SGLANG:
            return "SGLang's own (SPECCTL_OFF_PATH=sglang)"
        return f"{path['path']}: {', '.join(path['features']) or 'no piece'}"


def _off_path(rank: dict[str, Any]) -> dict[str, Any] | None:
    """A rank's `off_path` report, if it has the plugin's shape."""
    reported = rank.get(OFF_PATH_KEY)
    if not isinstance(reported, dict):
        return None
    path, features = reported.get("path"), reported.get("features")
    if not (path is None or isinstance(path, str)) or not isinstance(features, list):
        return None
    return {"path": path, "features": [str(f) for f in features]}


def _shapes(rank: dict[str, Any]) -> dict[str, Any] | None:
    """A rank's `shapes` report, if it has the plugin's form."""
    found = rank.get("shapes")
    if not isinstance(found, dict):
        return None
    live, startup, switches = found.get("live"), found.get("startup"), found.get("switches")
    captured, refused = found.get("captured"), found.get("refused") or {}
    if not (isinstance(live, str) and isinstance(startup, str) and isinstance(switches, int)
            and isinstance(captured, dict) and isinstance(refused, dict)):
        return None
    costs = {str(k): {"capture_s": float(v["capture_s"]),
                      "memory_gb": None if v.get("memory_gb") is None else float(v["memory_gb"])}
             for k, v in captured.items()
             if isinstance(v, dict) and _number(v.get("capture_s"))
             and (v.get("memory_gb") is None or _number(v.get("memory_gb")))}
    return {"live": live, "startup": startup, "switches": switches, "captured": costs,
            "refused": {str(k): str(v) for k, v in refused.items()}}


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _inactive_reason(ranks: list[dict[str, Any]]) -> str | None:
    """Why the plugin is inactive on some DP rank, or None if every rank steers (or the
    server does not report `active`, as older plugins did not)."""
    for i, rank in enumerate(ranks):
        if rank.get("active", True) is False:
            reason = rank.get("inactive_reason") or "no reason reported"
            return reason if len(ranks) == 1 else f"DP rank {i}: {reason}"
    return None


class ServerClient:
    """Synchronous admin client for one server (the load itself runs in `loadgen`)."""

    def __init__(
        self,
        url: str,
        admin_key: str | None = None,
        timeout_s: float = 10.0,
        *,
        api_key: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.admin_key = admin_key
        self.api_key = api_key
        # Extra headers (a gateway's own) first, the API key over them: every request carries
        # them; the admin routes replace the Authorization header with the admin key's.
        self._http = httpx.Client(
            base_url=self.url, timeout=timeout_s, headers={**(headers or {}), **bearer(api_key)}
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ServerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ transport

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, **kwargs)
        except httpx.TimeoutException:
            raise ServerError(
                f"{self.url}{path} did not answer in time; is the server overloaded or hung?"
            ) from None
        except httpx.TransportError as err:
            raise ServerError(
                f"cannot reach {self.url} ({type(err).__name__}: {err}); is the server running, "
                "and is --url right (e.g. http://127.0.0.1:30000)?"
            ) from None

    def _admin_headers(self) -> dict[str, str]:
        return bearer(self.admin_key)

    def _refused(self, path: str, resp: httpx.Response) -> KeyRefused | None:
        """The API-key line for a 401/403 on an ordinary route, or None for any other answer."""
        if resp.status_code in (401, 403):
            return api_key_refused(self.url, path, resp.status_code, self.api_key)
        return None

    # ------------------------------------------------------------------ maintenance

    def freeze_gc(self) -> None:
        """SGLang's `/freeze_gc`: the server's processes move every object they hold to the
        permanent generation, so later collections stop scanning them (SGLang logs collections
        of about a million objects taking half a second otherwise)."""
        resp = self._request("POST", "/freeze_gc", headers=self._admin_headers())
        if resp.status_code == 200:
            return
        if resp.status_code in (401, 403):
            raise KeyRefused(
                f"{self.url} refused /freeze_gc ({resp.status_code}): give the server's "
                "--admin-api-key with --admin-key"
            )
        if resp.status_code == 404:
            raise ServerError(f"{self.url} has no /freeze_gc (SGLang older than it?)")
        raise ServerError(
            f"POST {self.url}/freeze_gc answered {resp.status_code}: {resp.text[:200]}"
        )

    def flush_cache(self) -> bool:
        """SGLang's `/flush_cache`: drop the prefix cache, so the next requests prefill their
        prompts whole (an admin route where the server has an admin key; SGLang refuses while
        requests run). Best effort: False where it was missing, refused or unreachable."""
        try:
            resp = self._request("POST", "/flush_cache", headers=self._admin_headers())
        except ServerError:
            return False
        return resp.status_code == 200

    # ------------------------------------------------------------------ read

    def health(self) -> bool:
        return self._request("GET", "/health").status_code == 200

    def server_info(self) -> dict[str, Any]:
        resp = self._request("GET", "/server_info")
        if (refused := self._refused("/server_info", resp)) is not None:
            raise refused
        if resp.status_code != 200:
            raise ServerError(
                f"GET {self.url}/server_info answered {resp.status_code}: {resp.text[:200]}"
            )
        try:
            info = resp.json()
        except ValueError:
            raise ServerError(
                f"GET {self.url}/server_info did not return JSON; is this SGLang?"
            ) from None
        if not isinstance(info, dict):
            raise ServerError(
                f"GET {self.url}/server_info returned {type(info).__name__}, not an object"
            )
        return info

    def state(self) -> ServerState:
        try:
            ranks = read_server_state(self.server_info())
        except PolicyError as err:
            raise ServerError(f"{self.url}: {err.field}: {err.message}") from None
        first = ranks[0]
        versions = {r.get("version") for r in ranks}
        if len(versions) > 1:
            raise ServerError(
                f"{self.url}: DP ranks report different table versions "
                f"{sorted(map(str, versions))}; a push is still being applied, try again"
            )
        try:
            table = None if first.get("table") is None else parse_table(first["table"])
        except PolicyError as err:
            raise ServerError(f"{self.url} reports an invalid table: {err}") from None
        try:
            trees = state_trees(first)
        except PolicyError as err:
            raise ServerError(f"{self.url} reports unreadable {err.field}: {err.message}") from None
        return ServerState(
            table=table,
            version=int(first.get("version") or 0),
            captured_depths=tuple(sorted(first.get("captured_depths") or ())),
            captured_trees=trees,
            source=str(first.get("source", "?")),
            last_rejection=first.get("last_rejection"),
            ranks=len(ranks),
            inactive_reason=_inactive_reason(ranks),
            off_path=_off_path(first),
            shapes=_shapes(first),
        )

    def metrics_text(self) -> str:
        resp = self._request("GET", "/metrics")
        if (refused := self._refused("/metrics", resp)) is not None:
            raise refused
        if resp.status_code != 200:
            raise ServerError(
                f"GET {self.url}/metrics answered {resp.status_code}; start SGLang with "
                "--enable-metrics"
            )
        return resp.text

    def scrape(self) -> Scrape:
        try:
            return parse_scrape(self.metrics_text())
        except MetricsFormatError as err:
            raise ServerError(f"{self.url}/metrics: {err}") from None

    def scrape_or_none(self) -> Scrape | None:
        """`scrape`, or None where the server cannot be read (a level goes on without it)."""
        try:
            return self.scrape()
        except ServerError:
            return None

    def model_id(self) -> str | None:
        """The served model's id from `/v1/models`, if the server lists one."""
        try:
            resp = self._request("GET", "/v1/models")
            data = resp.json()["data"] if resp.status_code == 200 else []
            return str(data[0]["id"]) if data else None
        except (ServerError, ValueError, KeyError, IndexError, TypeError):
            return None

    # ------------------------------------------------------------------ write

    def push(self, table: PolicyTable | None) -> ServerState:
        """Push `table` (None releases control), then read it back; raise unless it is live."""
        resp = self._request(
            "POST", "/set_internal_state", json=push_body(table), headers=self._admin_headers()
        )
        self._raise_for_push(resp, table)
        state = self.state()
        want = None if table is None else table.to_json()
        got = None if state.table is None else state.table.to_json()
        if want != got:
            raise ServerError(
                f"{self.url} accepted the push but reports table {state.describe()!r} "
                f"(version {state.version}); another controller may be pushing at the same time"
            )
        return state

    def _raise_for_push(self, resp: httpx.Response, table: PolicyTable | None) -> None:
        what = "release control" if table is None else f"push table {table.describe()!r}"
        if resp.status_code == 401:
            hint = (
                "the key given was refused"
                if self.admin_key
                else f"no admin key was given: pass --admin-key or set {ADMIN_KEY_ENV}"
            )
            raise KeyRefused(
                f"{self.url} refused to {what}: 401 Unauthorized ({hint}); use the value of the "
                "server's --admin-api-key"
            )
        body: Any
        try:
            body = resp.json()
        except ValueError:
            body = resp.text[:200]
        rejection = parse_rejection(body) if resp.status_code == 400 else None
        if rejection is not None:
            raise ServerError(f"{self.url} refused to {what}: {rejection}")
        if resp.status_code in (400, 422):
            # SGLang answers request-validation errors with 400 (older FastAPI setups: 422).
            message = body.get("message", body) if isinstance(body, dict) else body
            raise ServerError(
                f"{self.url} refused to {what}: {resp.status_code} (the server does not accept "
                f"specctl's numeric settings): {message}"
            )
        if resp.status_code != 200:
            raise ServerError(f"{self.url} refused to {what}: {resp.status_code} {body}")
        # SGLang answers one bool per DP rank; a dict form ({"updated": ...}) is tolerated.
        flags: list[Any] = []
        if isinstance(body, list):
            flags = body
        elif isinstance(body, dict):
            flags = [body.get("updated", body.get("success", True))]
        if any(flag is False for flag in flags):
            reason = self.state().last_rejection or "no reason reported"
            raise ServerError(f"{self.url} refused to {what} on some DP rank: {reason}")
