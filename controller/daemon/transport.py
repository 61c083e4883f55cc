"""How the daemon talks to one server: over HTTP, or in-process to a simulated server.

Both implement `ServerTransport`, so the scraper and the push client cannot tell a real SGLang
server from `sims.server.SimulatedServer`: the simulator is reached through the same metrics
text, the same /server_info document and the same admin RPC body.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

import httpx


class TransportError(RuntimeError):
    """The server could not be reached, timed out or answered something unreadable."""

    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind  # "unreachable" | "timeout" | "http_status" | "bad_body"
        super().__init__(message)


class ServerTransport(Protocol):
    def metrics_text(self) -> str: ...

    def server_info(self) -> dict[str, Any]: ...

    def set_internal_state(self, body: dict[str, Any], admin_key: str | None) -> tuple[int, Any]:
        """POST /set_internal_state; returns (HTTP status, decoded JSON body or text)."""
        ...

    def close(self) -> None: ...


def bearer(key: str | None) -> str | None:
    return None if key is None else f"Bearer {key}"


class HttpTransport:
    """A real server (or `specctl sim serve`) over HTTP, with a timeout on every call."""

    def __init__(self, base_url: str, timeout_s: float, api_key: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        headers = {} if api_key is None else {"Authorization": f"Bearer {api_key}"}
        self._client = httpx.Client(base_url=self.base_url, timeout=timeout_s, headers=headers)

    def _get(self, path: str) -> httpx.Response:
        try:
            resp = self._client.get(path)
        except httpx.TimeoutException as err:
            raise TransportError(
                "timeout", f"GET {self.base_url}{path}: timed out ({err})"
            ) from err
        except httpx.HTTPError as err:
            raise TransportError("unreachable", f"GET {self.base_url}{path}: {err}") from err
        if resp.status_code != 200:
            raise TransportError(
                "http_status", f"GET {self.base_url}{path}: HTTP {resp.status_code}"
            )
        return resp

    def metrics_text(self) -> str:
        return self._get("/metrics").text

    def server_info(self) -> dict[str, Any]:
        resp = self._get("/server_info")
        try:
            data = resp.json()
        except json.JSONDecodeError as err:
            raise TransportError("bad_body", f"/server_info is not JSON: {err}") from err
        if not isinstance(data, dict):
            raise TransportError("bad_body", "/server_info is not a JSON object")
        return data

    def set_internal_state(self, body: dict[str, Any], admin_key: str | None) -> tuple[int, Any]:
        headers = {}
        auth = bearer(admin_key)
        if auth is not None:
            headers["Authorization"] = auth
        try:
            resp = self._client.post("/set_internal_state", json=body, headers=headers)
        except httpx.TimeoutException as err:
            raise TransportError("timeout", f"POST /set_internal_state timed out ({err})") from err
        except httpx.HTTPError as err:
            raise TransportError("unreachable", f"POST /set_internal_state: {err}") from err
        try:
            return resp.status_code, resp.json()
        except json.JSONDecodeError:
            return resp.status_code, resp.text

    def close(self) -> None:
        self._client.close()


class SimulatorLike(Protocol):
    def metrics_text(self) -> str: ...

    def server_info(self) -> dict[str, Any]: ...

    def set_internal_state(
        self, body: dict[str, Any], authorization: str | None
    ) -> tuple[int, Any]: ...


class InProcessTransport:
    """A `SimulatedServer` called directly: same payloads, no sockets (for fast evaluation)."""

    def __init__(self, server: SimulatorLike) -> None:
        self.server = server

    def metrics_text(self) -> str:
        return self.server.metrics_text()

    def server_info(self) -> dict[str, Any]:
        return self.server.server_info()

    def set_internal_state(self, body: dict[str, Any], admin_key: str | None) -> tuple[int, Any]:
        # Round-trip through JSON so the simulator sees exactly what HTTP would carry.
        wire = json.loads(json.dumps(body))
        status, payload = self.server.set_internal_state(wire, bearer(admin_key))
        return status, json.loads(json.dumps(payload))

    def close(self) -> None:
        return None
