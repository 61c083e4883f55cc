"""What a served simulator was sent, for tests that check the order of a tool's requests."""

from __future__ import annotations

import json
from typing import Any


class RecordPosts:
    """ASGI wrapper noting (path, JSON body or None) of every POST, in arrival order, and with
    `headers` the (path, {header: value}) of each (names lower-cased)."""

    def __init__(
        self, app: Any, posts: list[tuple[str, Any]],
        headers: list[tuple[str, dict[str, str]]] | None = None,
    ) -> None:  # fmt: skip
        self.app, self.posts, self.headers = app, posts, headers

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope.get("type") != "http" or scope.get("method") != "POST":
            return await self.app(scope, receive, send)
        if self.headers is not None:
            self.headers.append((scope["path"], {
                k.decode().lower(): v.decode() for k, v in scope.get("headers", ())
            }))  # fmt: skip
        path, at, body = scope["path"], len(self.posts), bytearray()
        self.posts.append((path, None))  # a route that never reads its body stays None

        async def recording_receive() -> Any:
            message = await receive()
            if message["type"] == "http.request":
                body.extend(message.get("body", b""))
                if not message.get("more_body") and body:
                    self.posts[at] = (path, json.loads(body))
            return message

        return await self.app(scope, recording_receive, send)
