"""HTTP in the tests: a request sent from a node with curl, and HTTPS through the gateway from the controller (TLS
checked against the demo CA the play generated)."""
from __future__ import annotations

import http.client
import json
import shlex
import ssl
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.project import ARTIFACTS

CA = ARTIFACTS / "gateway-ca" / "ca.crt"
BODY_FILE = "/tmp/harness-body"  # on the node: curl writes the body there, the status to stdout


def curl(host: Any, url: str, api_key: str | None = None, body: dict[str, Any] | None = None) -> tuple[int, str]:
    """HTTP status (0: no answer) and body of a request sent from the node with curl (POST when there is a body)."""
    cmd = f"curl -s -o {BODY_FILE} -w '%{{http_code}}' {shlex.quote(url)}"
    if api_key:
        cmd += f" -H {shlex.quote('Authorization: Bearer ' + api_key)}"
    if body is not None:
        cmd += f" -H 'Content-Type: application/json' -d {shlex.quote(json.dumps(body))}"
    status = host.run(cmd).stdout.strip()
    return int(status or 0), host.run(f"cat {BODY_FILE}").stdout


def chat(model: str, max_tokens: int, content: str = "hello", **extra: Any) -> dict[str, Any]:
    """A chat completion's body that generates exactly `max_tokens` (ignore_eos)."""
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "ignore_eos": True, **extra}


@dataclass
class Gateway:
    """The gateway at `address`:`port` as a client reaches it."""

    address: str
    port: int = 443
    ca: Path = field(default=CA)

    def tls(self) -> ssl.SSLContext:
        """Trusts the demo CA only."""
        return ssl.create_default_context(cafile=str(self.ca))

    def connection(self, timeout: float) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(self.address, self.port, context=self.tls(), timeout=timeout)

    def request(self, method: str, path: str, api_key: str | None = None, body: dict[str, Any] | None = None,
                timeout: float = 60) -> tuple[int, bytes]:
        """One HTTPS request, the path sent as given (no client-side normalisation); (status, body)."""
        conn = self.connection(timeout)
        headers = {"Content-Type": "application/json"}
        if api_key is not None:
            headers["Authorization"] = f"Bearer {api_key}"
        try:
            conn.request(method, path, body=json.dumps(body or {}) if method == "POST" else None, headers=headers)
            response = conn.getresponse()
            return response.status, response.read()
        finally:
            conn.close()

    def stream(self, api_key: str, body: dict[str, Any], timeout: float = 120) -> tuple[float, list[float], int]:
        """A streamed chat completion: (seconds to [DONE], arrival time of each data event, status)."""
        conn = self.connection(timeout)
        start = time.monotonic()
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                     headers={"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"})
        response = conn.getresponse()
        arrivals = []
        while line := response.readline():     # de-chunked; the connection stays open after [DONE]
            if line.strip() == b"data: [DONE]":
                break
            if line.startswith(b"data: "):
                arrivals.append(time.monotonic() - start)
        end = time.monotonic() - start
        conn.close()
        return end, arrivals, response.status

    def chat_once(self, api_key: str, model: str, stream: bool, max_tokens: int = 8,
                  content: str = "Count to five.", timeout: float = 120) -> str:
        """One chat completion of exactly `max_tokens` tokens (ignore_eos), checked: '' when it succeeded, else why
        not (any status but 200, a connection error, an incomplete answer: no [DONE], an error event, not the
        requested number of tokens; a stream reports its usage in its last event). `timeout` bounds each wait on
        the socket: a non-streamed answer comes whole, after the last token."""
        extra = {"stream": True, "stream_options": {"include_usage": True}} if stream else {"stream": False}
        body = chat(model, max_tokens, content, **extra)
        conn = self.connection(timeout)
        try:
            conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                         headers={"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"})
            response = conn.getresponse()
            if response.status != 200:
                return f"status {response.status}: {response.read()[:200]!r}"
            if not stream:
                answer = json.loads(response.read())
                return tokens_check(answer.get("usage"), max_tokens, answer)
            return stream_check(iter(response.readline, b""), max_tokens)
        except (OSError, http.client.HTTPException, ValueError) as err:
            return f"{type(err).__name__}: {err}"
        finally:
            conn.close()


def tokens_check(usage: dict[str, Any] | None, max_tokens: int, answer: Any) -> str:
    """'' when the usage counts `max_tokens` completion tokens, else what it counts."""
    tokens = (usage or {}).get("completion_tokens")
    return "" if tokens == max_tokens else f"{tokens} tokens instead of {max_tokens}: {str(answer)[:200]}"


def read_sizes(arrivals: Iterable[float]) -> list[int]:
    """How many stream events arrived at each distinct millisecond, in order: the reads the client saw. A proxy that
    buffers hands over a whole buffer's worth of events per read (but the last); an unbuffered one, read by a client
    that a loaded machine starves, gives some large reads and, whenever the client keeps up, small ones."""
    sizes: list[int] = []
    last: float | None = None
    for instant in (round(t, 3) for t in arrivals):
        if instant == last:
            sizes[-1] += 1
        else:
            sizes.append(1)
            last = instant
    return sizes


def stream_check(lines: Iterable[bytes], max_tokens: int) -> str:
    """Reads a chat completion's event stream line by line: '' when it ended with [DONE] after content events and
    its usage event counts `max_tokens`, else why not."""
    events, usage, last = 0, None, b""
    for line in lines:
        if line.strip() == b"data: [DONE]":
            return (tokens_check(usage, max_tokens, last) if events
                    else "stream ended with [DONE] before any content event")
        if line.startswith(b"data: "):
            event = json.loads(line[6:])
            if "error" in event:
                return f"error event: {line[:200]!r}"
            events += bool(event.get("choices"))
            usage, last = event.get("usage") or usage, line[:200]
    return f"stream ended without [DONE] after {events} events"
