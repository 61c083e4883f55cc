"""A real HTTP server on loopback for stand-ins the simulator cannot be (a server that answers
late, one that reports what no real server reports yet): a handler class that answers with
`reply`, served on a free port for the length of a `with`."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class QuietHandler(http.server.BaseHTTPRequestHandler):
    def reply(self, body: bytes, status: int = 200) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def serving(handler: type[QuietHandler], **attributes: Any) -> Iterator[str]:
    """Serve `handler` on 127.0.0.1 (the server carries `attributes`); yields the base URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    for name, value in attributes.items():
        setattr(server, name, value)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
