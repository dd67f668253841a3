"""Stand-ins for vLLM servers on loopback. For the gateway's routing tests, NamedBackend: each answers
`GET /health` and any POST with its own name, after the pause the request's JSON body asks for (`"sleep": seconds`),
as server-sent events when the body asks for `"stream": true` (three events `"gap"` seconds apart, then [DONE]),
and counts what it served and the models and headers it was asked with; real HAProxy routes to them. For the LoRA
sync, FakeVllm: vLLM's model list and runtime load/unload API. For the rollout's drain, GaugeVllm: /health and the
request gauges of /metrics; for the rollout's pre-change benchmark, BenchVllm: those, the model list and completions
at a speed the test changes. Nothing leaves the machine."""
from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self


class QuietServer(ThreadingHTTPServer):
    """HAProxy's health checks close their connections early: not an error worth a traceback."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        return


class QuietHandler(BaseHTTPRequestHandler):
    """HTTP/1.1 (keep-alive, as vLLM's server) and no request log: the tests read the answers."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        return

    def send(self, status: int, data: bytes, content_type: str) -> None:
        """One whole answer with its Content-Length."""
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class LoopbackServer:
    """An HTTP stand-in on 127.0.0.1:`port`: a subclass gives handler(); start() serves it in a daemon thread,
    stop() stops listening."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.lock = threading.Lock()
        self.server: QuietServer | None = None

    def handler(self) -> type[BaseHTTPRequestHandler]:
        """The request handler class bound to this server."""
        raise NotImplementedError

    def start(self) -> Self:
        """Listen and serve in a daemon thread."""
        self.server = QuietServer(("127.0.0.1", self.port), self.handler())
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop listening (a health check then fails)."""
        if self.server:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


class NamedBackend(LoopbackServer):
    """One stand-in server: `name` on 127.0.0.1:`port`, started by start(), stopped by stop()."""

    def __init__(self, name: str, port: int | None = None) -> None:
        super().__init__(port)
        self.name = name
        self.served = 0
        self.models: list[Any] = []   # each POST's `model`, in order
        self.headers: list[dict[str, str]] = []   # each POST's headers (lower-case names), in the same order

    def handler(self) -> type[BaseHTTPRequestHandler]:
        """The request handler class bound to this backend."""
        backend = self

        class Handler(QuietHandler):
            def answer(self) -> None:
                self.send(200, json.dumps({"server": backend.name}).encode(), "application/json")

            def do_GET(self) -> None:   # noqa: N802 (http.server's name)
                self.answer()

            def stream(self, gap: float) -> None:
                """Three events `gap` seconds apart and [DONE], chunked, as vLLM streams a completion."""
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                events = [f"data: {json.dumps({'server': backend.name, 'event': i})}\n\n" for i in range(3)]
                for i, event in enumerate(events + ["data: [DONE]\n\n"]):
                    if i:
                        time.sleep(gap)
                    data = event.encode()
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")

            def body(self) -> bytes:
                """The request body, sent with a Content-Length or chunked."""
                if "chunked" not in (self.headers.get("Transfer-Encoding") or "").lower():
                    return self.rfile.read(int(self.headers.get("Content-Length") or 0))
                data = b""
                while size := int(self.rfile.readline().split(b";")[0], 16):
                    data += self.rfile.read(size)
                    self.rfile.readline()
                self.rfile.readline()
                return data

            def do_POST(self) -> None:   # noqa: N802
                request = json.loads(self.body() or b"{}")
                time.sleep(float(request.get("sleep", 0)))
                with backend.lock:
                    backend.served += 1
                    backend.models.append(request.get("model"))
                    backend.headers.append({k.lower(): v for k, v in self.headers.items()})
                if request.get("stream"):
                    self.stream(float(request.get("gap", 0)))
                else:
                    self.answer()

        return Handler


class FakeVllm(LoopbackServer):
    """A stand-in for vLLM's model list and runtime LoRA API on loopback: GET /health (200, without the key), GET
    /v1/models (the base, then each adapter with its parent and root), POST /v1/load_lora_adapter and
    /v1/unload_lora_adapter with vLLM's answers (200 text, 400 for a name already loaded, 404 for one not loaded, 401
    without the key). `refuse` maps an adapter name to the (status, message) its load answers; `calls` records every
    request (method, path, body)."""

    def __init__(self, base: str = "base-model", api_key: str = "", adapters: dict[str, str] | None = None) -> None:
        super().__init__()
        self.base, self.api_key = base, api_key
        self.adapters: dict[str, str] = dict(adapters or {})
        self.refuse: dict[str, tuple[int, str]] = {}
        self.calls: list[tuple[str, str, dict[str, Any] | None]] = []

    @property
    def url(self) -> str:
        """Where it listens."""
        return f"http://127.0.0.1:{self.port}"

    def posts(self) -> list[tuple[str, dict[str, Any] | None]]:
        """The POSTs it received (path, body), in order."""
        return [(path, body) for method, path, body in self.calls if method == "POST"]

    def answer(self, method: str, path: str, body: dict[str, Any] | None) -> tuple[int, Any]:
        """(status, JSON-able body or text) for one request, as vLLM 0.32 answers it."""
        if method == "GET" and path == "/v1/models":
            base = {"id": self.base, "object": "model", "root": f"/models/{self.base}", "parent": None}
            return 200, {"object": "list", "data": [base] + [
                {"id": name, "object": "model", "root": root, "parent": self.base}
                for name, root in self.adapters.items()]}
        name = str((body or {}).get("lora_name") or "")
        if method == "POST" and path == "/v1/load_lora_adapter":
            if name in self.adapters:
                return 400, {"error": {"message": f"The lora adapter '{name}' has already been loaded.",
                                       "type": "InvalidUserInput", "code": 400}}
            if name in self.refuse:
                status, message = self.refuse[name]
                return status, {"error": {"message": message, "type": "BadRequestError", "code": status}}
            self.adapters[name] = str((body or {}).get("lora_path") or "")
            return 200, f"Success: LoRA adapter '{name}' added successfully."
        if method == "POST" and path == "/v1/unload_lora_adapter":
            if name not in self.adapters:
                return 404, {"error": {"message": f"The lora adapter '{name}' cannot be found.",
                                       "type": "NotFoundError", "code": 404}}
            del self.adapters[name]
            return 200, f"Success: LoRA adapter '{name}' removed successfully."
        return 404, {"detail": "Not Found"}

    def handler(self) -> type[BaseHTTPRequestHandler]:
        """The request handler class bound to this stand-in."""
        fake = self

        class Handler(QuietHandler):
            def respond(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                with fake.lock:
                    fake.calls.append((method, self.path, body))
                    if self.path == "/health":   # vLLM answers it without the key
                        status, payload = 200, ""
                    elif fake.api_key and self.headers.get("Authorization") != f"Bearer {fake.api_key}":
                        status, payload = 401, {"error": "Unauthorized"}
                    else:
                        status, payload = fake.answer(method, self.path, body)
                text = payload if isinstance(payload, str) else json.dumps(payload)
                self.send(status, text.encode(), "text/plain" if isinstance(payload, str) else "application/json")

            def do_GET(self) -> None:   # noqa: N802 (http.server's name)
                self.respond("GET")

            def do_POST(self) -> None:   # noqa: N802
                self.respond("POST")

        return Handler


class GaugeVllm(LoopbackServer):
    """A stand-in for what the rollout's drain reads of a vLLM: GET /health (200) and GET /metrics with the gauges
    vllm:num_requests_running and vllm:num_requests_waiting at `running` and `waiting` (as vLLM exposes them, per
    model and engine). `scrapes` counts the /metrics requests it answered."""

    def __init__(self, model: str, running: int = 0, waiting: int = 0) -> None:
        super().__init__()
        self.model, self.running, self.waiting = model, running, waiting
        self.scrapes = 0

    @property
    def url(self) -> str:
        """Where it listens."""
        return f"http://127.0.0.1:{self.port}"

    def metrics(self) -> str:
        """The /metrics text: the two gauges, one sample each."""
        labels = f'engine="0",model_name="{self.model}"'
        return (f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{{labels}}} {self.running}.0\n"
                f"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{{labels}}} {self.waiting}.0\n")

    def handler(self) -> type[BaseHTTPRequestHandler]:
        """The request handler class bound to this stand-in."""
        fake = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:   # noqa: N802 (http.server's name)
                if self.path == "/metrics":
                    with fake.lock:
                        fake.scrapes += 1
                        text = fake.metrics()
                else:
                    text = ""
                self.send(200 if self.path in ("/health", "/metrics") else 404, text.encode(),
                          "text/plain; version=0.0.4")

        return Handler


class BenchVllm(GaugeVllm):
    """GaugeVllm with what `vllm bench serve` (tests/fixtures/vllm_bench) needs: GET /v1/models (the served name and
    its root) and POST /v1/chat/completions answered after `delay` seconds. POST /change (the test's stand-in for a
    rollout's change) sets `delay` to its body's "delay". `events` lists, in order, what it saw: "metrics" (a /metrics
    scrape), "completion" (one answered completion) and "change"."""

    def __init__(self, model: str, delay: float) -> None:
        super().__init__(model)
        self.delay = delay
        self.events: list[str] = []

    def handler(self) -> type[BaseHTTPRequestHandler]:
        """The request handler class bound to this stand-in."""
        fake = self

        class Handler(QuietHandler):
            def do_GET(self) -> None:   # noqa: N802 (http.server's name)
                with fake.lock:
                    if self.path == "/metrics":
                        fake.scrapes += 1
                        fake.events.append("metrics")
                        self.send(200, fake.metrics().encode(), "text/plain; version=0.0.4")
                        return
                if self.path == "/v1/models":
                    data = {"object": "list", "data": [{"id": fake.model, "object": "model",
                                                        "root": f"/models/{fake.model}", "parent": None}]}
                    self.send(200, json.dumps(data).encode(), "application/json")
                else:
                    self.send(200 if self.path == "/health" else 404, b"", "text/plain")

            def do_POST(self) -> None:   # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}") if length else {}
                if self.path == "/change":
                    with fake.lock:
                        fake.delay = float(body["delay"])
                        fake.events.append("change")
                    self.send(200, b"{}", "application/json")
                    return
                with fake.lock:
                    delay = fake.delay
                time.sleep(delay)
                with fake.lock:
                    fake.events.append("completion")
                answer = {"object": "chat.completion", "model": fake.model,
                          "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                       "finish_reason": "length"}]}
                self.send(200, json.dumps(answer).encode(), "application/json")

        return Handler
