"""Stand-ins for vLLM servers on loopback, for the gateway's routing tests: each answers `GET /health` and any POST
with its own name, after the pause the request's JSON body asks for (`"sleep": seconds`), and counts what it
served. Real HAProxy routes to them; nothing else leaves the machine."""
from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class QuietServer(ThreadingHTTPServer):
    """HAProxy's health checks close their connections early: not an error worth a traceback."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        return


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class NamedBackend:
    """One stand-in server: `name` on 127.0.0.1:`port`, started by start(), stopped by stop()."""

    def __init__(self, name: str, port: int | None = None) -> None:
        self.name, self.port = name, port or free_port()
        self.served = 0
        self.lock = threading.Lock()
        self.server: QuietServer | None = None

    def handler(self) -> type[BaseHTTPRequestHandler]:
        """The request handler class bound to this backend."""
        backend = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:   # quiet: the test reads the answers, not a log
                return

            def answer(self) -> None:
                body = json.dumps({"server": backend.name}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:   # noqa: N802 (http.server's name)
                self.answer()

            def do_POST(self) -> None:   # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                request = json.loads(self.rfile.read(length) or b"{}")
                time.sleep(float(request.get("sleep", 0)))
                with backend.lock:
                    backend.served += 1
                self.answer()

        return Handler

    def start(self) -> NamedBackend:
        """Listen and serve in a daemon thread."""
        self.server = QuietServer(("127.0.0.1", self.port), self.handler())
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop listening (the health checks then fail)."""
        if self.server:
            self.server.shutdown()
            self.server.server_close()
            self.server = None
