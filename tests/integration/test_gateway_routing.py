"""The gateway's routing and admission (issue 31), with the real HAProxy of the nodes' distribution (Debian's 2.6,
scripts/ensure-test-tools.sh) running the configuration the gateway role renders, in front of two stand-in vLLM
servers on loopback (harness.backends): a conversation's requests stay on one replica (consistent hash of the
X-Session-Id header, else the body's `user` field) with bounded load; a request without a key goes to the least
busy one; a drained replica's keys move to the other and come back; a full queue answers 429 with Retry-After,
never a 5xx, and so does a request that waited out the queue timeout. vLLM's runtime LoRA load/unload paths are
403 to clients in every spelling vLLM would route (percent-encoded too) and never reach a replica (issue 30).
Several models behind one gateway (issue 27): a request goes to the pool of its JSON body's `model`, streamed or
not, with affinity and admission per model; /v1/models lists them all; an unknown model is 404, a body without a
model 400 and one over the limit 413, in vLLM's error shape, and the key and the allowlist come first. Priority
(issue 31): a queued request of a better X-Priority class is served before older ones, in every kind of backend; a
malformed, repeated or out-of-range value is served at class 0 in its turn; vLLM gets the class as X-Vllm-Priority.

The prefix-cache hit rate that affinity buys is measured with real vLLM in the fleet scenario, not here."""

from __future__ import annotations

import collections
import contextlib
import http.client
import json
import os
import shutil
import ssl
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from test_plan_playbook import ROOT

from ansible_collections.vllm_node.vllm_node.plugins.module_utils import haproxy_stat
from harness import haproxy, playbook
from harness.api import chat
from harness.backends import NamedBackend, free_port

KEY = "routing-test-key"
PLAY = """
- hosts: localhost
  gather_facts: false
  connection: local
  tasks:
    - ansible.builtin.include_vars: {file: %(root)s/roles/gateway/defaults/main.yml}
    - ansible.builtin.include_vars: {file: %(root)s/roles/gateway/vars/main.yml}
    - ansible.builtin.template:
        src: %(root)s/roles/gateway/templates/etc/haproxy/haproxy.cfg.j2
        dest: %(out)s
        mode: "0600"
    # routing by model: the map and the /v1/models answer, from the role's own values
    - ansible.builtin.copy:
        content: "{{ item.content }}"
        dest: "{{ item.path }}"
        mode: "0600"
      loop:
        - {path: "{{ __gateway_models_map_path }}", content: "{{ __gateway_routing.map }}"}
        - path: "{{ __gateway_models_list_path }}"
          content: "{{ __gateway_routing.models | vllm_node.vllm_node.gateway_models_list('', 1700000000) }}"
      when: __gateway_routing.models | length > 0
"""
HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
pytestmark = pytest.mark.skipif(
    not Path(HAPROXY).exists() and os.environ.get("CI") != "true",
    reason="no haproxy (scripts/ensure-test-tools.sh installs Debian's as root); under CI=true this fails instead")


class Gateway:
    """A running HAProxy with the role's configuration: its port, runtime socket and TLS trust."""

    def __init__(self, port: int, socket_path: Path, cafile: Path, process: subprocess.Popen[bytes]) -> None:
        self.port, self.socket_path, self.process = port, socket_path, process
        self.context = ssl.create_default_context(cafile=str(cafile))

    def post(self, body: dict[str, Any], session: str | None = None) -> tuple[int, str | None, str | None]:
        """One chat request: (status, the server that answered or None, Retry-After or None)."""
        headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
        if session:
            headers["X-Session-Id"] = session
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.context, timeout=30)
        try:
            conn.request("POST", "/v1/chat/completions", json.dumps({"model": "m", **body}), headers)
            resp = conn.getresponse()
            data = resp.read()
            server = json.loads(data).get("server") if resp.status == 200 else None
            return resp.status, server, resp.getheader("Retry-After")
        finally:
            conn.close()

    def call(self, method: str, path: str, body: bytes | None = None, key: str | None = KEY,
             headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
        """One request as a client sends it: (status, headers, body)."""
        sent = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {}),
                **(headers or {})}
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.context, timeout=30)
        try:
            conn.request(method, path, body, sent)
            resp = conn.getresponse()
            return resp.status, dict(resp.getheaders()), resp.read()
        finally:
            conn.close()

    def announce(self, length: int, key: str | None = KEY) -> tuple[int, bytes]:
        """A POST that announces a `length`-byte body and waits for a go-ahead before sending it (Expect:
        100-continue, as curl does for a large body): the answer HAProxy gives from the head alone."""
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.context, timeout=30)
        try:
            conn.putrequest("POST", "/v1/chat/completions")
            head = {"Content-Type": "application/json", "Content-Length": str(length), "Expect": "100-continue",
                    **({"Authorization": f"Bearer {key}"} if key else {})}
            for name, value in head.items():
                conn.putheader(name, value)
            conn.endheaders()
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def runtime(self, command: str) -> str:
        """A command to HAProxy's runtime API (what the rollout's drain and enable send)."""
        return haproxy.runtime_command(self.socket_path, command)

    def status(self, backend: str, server: str) -> str:
        """A server's status in `show stat` (UP, DRAIN, DOWN, MAINT ...)."""
        servers = haproxy.servers(self.runtime("show stat"), backend)
        assert server in servers, f"{backend}/{server} not in show stat"
        return str(servers[server]["status"])


def render_config(tmp_path: Path, extra: dict[str, Any]) -> Path:
    """The gateway role's haproxy.cfg for these settings, rendered by the real template."""
    out = tmp_path / "haproxy.cfg"
    play = tmp_path / "render.yml"
    play.write_text(PLAY % {"root": ROOT, "out": out})
    run = playbook.run(play, inventory="localhost,", extra_vars=extra, timeout=120)
    assert run.rc == 0, run.output
    return out


def certificate(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1: (chain + key PEM for HAProxy, the certificate clients trust)."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    pem = tmp_path / "gateway.pem"
    pem.write_text(cert.read_text() + key.read_text())
    return pem, cert


@contextlib.contextmanager
def start_gateway(tmp_path: Path, backends: list[NamedBackend], models: dict[str, list[str]] | None = None,
                  **settings: Any) -> Iterator[Gateway]:
    """Render, check (haproxy -c, as the role's validate does) and run HAProxy until the test ends; with `models`
    (backend name -> the model names it serves), routing by model."""
    pem, cert = certificate(tmp_path)
    keys = tmp_path / "keys"
    keys.write_text(KEY + "\n")
    port, sock = free_port(), tmp_path / "gateway.sock"
    entries = [{"name": b.name, "address": "127.0.0.1", "port": b.port,
                **({"models": models[b.name]} if models else {})} for b in backends]
    extra = {"gateway_listen_address": "127.0.0.1", "gateway_port": port, "gateway_backends": entries,
             "gateway_health_check_interval": 1, "gateway_api_keys": [KEY],
             "__gateway_pem_path": str(pem), "__gateway_keys_path": str(keys), "__gateway_runtime_socket": str(sock),
             "__gateway_models_map_path": str(tmp_path / "models.map"),
             "__gateway_models_list_path": str(tmp_path / "models.json"), **settings}
    config = render_config(tmp_path, extra)
    check = subprocess.run([HAPROXY, "-c", "-q", "-f", str(config)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    process = subprocess.Popen([HAPROXY, "-db", "-f", str(config)], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    gateway = Gateway(port, sock, cert, process)
    try:
        deadline = time.monotonic() + 20
        while not (sock.exists() and all_up(gateway.runtime("show stat"), len(backends))):
            assert time.monotonic() < deadline and process.poll() is None, "HAProxy did not see every server UP"
            time.sleep(0.3)
        yield gateway
    finally:
        process.terminate()
        process.wait(timeout=10)


def all_up(show_stat: str, servers: int) -> bool:
    """Whether every server of every backend is UP, `servers` of them checked on their own (the rest track them)."""
    parsed = haproxy_stat.parse_show_stat(show_stat)
    rows = [row for members in parsed.values() for row in members.values()]
    return sum(not row["tracked"] for row in rows) == servers and all(row["status"] == "UP" for row in rows)


@pytest.fixture
def backends() -> Iterator[list[NamedBackend]]:
    servers = [NamedBackend("replica-a").start(), NamedBackend("replica-b").start()]
    yield servers
    for server in servers:
        server.stop()


@pytest.fixture
def gateway(tmp_path: Path, backends: list[NamedBackend]) -> Iterator[Gateway]:
    """The role's defaults, but two requests at once per server and a short queue, so saturation is cheap."""
    with start_gateway(tmp_path, backends, gateway_backend_max_connections=2, gateway_queue_limit=4,
                       gateway_timeout_queue=20) as running:
        yield running


def wait_until_quiet(gateway: Gateway, backend: str = "vllm_affinity", wait: float = 20.0) -> bool:
    """Wait until every server of `backend` is UP with no session open; True if one was not UP meanwhile.

    Bounded load counts the sessions a server holds when a request arrives: on a loaded machine HAProxy may not
    have closed the previous request's session yet when the next one comes, and that one would move on the ring."""
    deadline, left_up = time.monotonic() + wait, False
    while True:
        servers = haproxy.servers(gateway.runtime("show stat"), backend)
        left_up |= any(s["status"] != "UP" for s in servers.values())
        if all(s["status"] == "UP" and s["scur"] == 0 for s in servers.values()):
            return left_up
        assert time.monotonic() < deadline, f"{backend} not quiet within {wait} s: {servers}"
        time.sleep(0.05)


def sessions_map(gateway: Gateway, keys: list[str], by: str = "header") -> dict[str, set[str | None]]:
    """Key -> the servers that answered its 4 requests (one per request, each after the last one's session closed).

    A server that left UP meanwhile (health checks time out on a starved machine) moves keys for a good reason,
    not the one under test: the map is then drawn once more."""
    for attempt in range(2):
        out: dict[str, set[str | None]] = {}
        left_up = False
        for key in keys:
            for _ in range(4):
                left_up |= wait_until_quiet(gateway)
                status, server, _ = (gateway.post({}, session=key) if by == "header" else gateway.post({"user": key}))
                assert status == 200
                out.setdefault(key, set()).add(server)
        if not left_up or attempt == 1:
            return out
    raise AssertionError("unreachable")


def test_a_conversation_stays_on_one_replica_and_conversations_spread(gateway: Gateway) -> None:
    by_header = sessions_map(gateway, [f"conversation-{i}" for i in range(24)])
    assert all(len(servers) == 1 for servers in by_header.values()), by_header
    share = collections.Counter(next(iter(s)) for s in by_header.values())
    assert set(share) == {"replica-a", "replica-b"} and min(share.values()) >= 6, share
    by_user = sessions_map(gateway, [f"user-{i}" for i in range(12)], by="user")
    assert all(len(servers) == 1 for servers in by_user.values()), by_user
    assert len({next(iter(s)) for s in by_user.values()}) == 2, by_user


def test_without_a_key_the_least_busy_replica_serves(gateway: Gateway) -> None:
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: gateway.post({"sleep": 0.5}), range(8)))
    assert {status for status, _, _ in answers} == {200}
    assert collections.Counter(server for _, server, _ in answers) == {"replica-a": 4, "replica-b": 4}


def test_a_drained_replica_hands_its_keys_over_and_gets_them_back(gateway: Gateway) -> None:
    keys = [f"conversation-{i}" for i in range(16)]
    def quiet_post(key: str) -> str | None:   # bounded load counts sessions HAProxy has not closed yet
        wait_until_quiet(gateway)
        return gateway.post({}, session=key)[1]

    before = {key: quiet_post(key) for key in keys}
    moved = [key for key, server in before.items() if server == "replica-a"]
    assert moved, before
    gateway.runtime("set server vllm/replica-a state drain")   # what roles/rollout's drain sends
    assert gateway.status("vllm_affinity", "replica-a") == "DRAIN"   # the tracking server follows
    during = {key: gateway.post({}, session=key)[1] for key in keys}
    assert set(during.values()) == {"replica-b"}, during
    gateway.runtime("set server vllm/replica-a state ready")
    after = {key: quiet_post(key) for key in keys}
    assert after == before


def test_a_hot_key_spills_over_instead_of_piling_onto_one_replica(tmp_path: Path,
                                                                  backends: list[NamedBackend]) -> None:
    """8 requests of one conversation at once, 8 slots a server: HAProxy's hash-balance-factor (150 %) lets its
    replica serve at most about 1.5 x the average, the rest go to the next replica on the ring."""
    with start_gateway(tmp_path, backends, gateway_backend_max_connections=8, gateway_queue_limit=0) as gateway:
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda _: gateway.post({"sleep": 1.5}, session="hot"), range(8)))
        assert {status for status, _, _ in answers} == {200}
        share = collections.Counter(server for _, server, _ in answers)
        assert len(share) == 2 and max(share.values()) <= 6, share


def test_saturation_answers_200_or_429_with_retry_after_only(gateway: Gateway) -> None:
    """30 requests at once (half keyed) against 2 x 2 slots and a queue of 4: no 5xx, no hang."""
    def one(i: int) -> tuple[int, str | None, str | None]:
        return gateway.post({"sleep": 1.0}, session=f"conversation-{i}" if i % 2 else None)

    started = time.monotonic()
    with ThreadPoolExecutor(30) as pool:
        answers = list(pool.map(one, range(30)))
    statuses = collections.Counter(status for status, _, _ in answers)
    assert set(statuses) <= {200, 429} and statuses[200] >= 4 and statuses[429] >= 1, statuses
    assert all(retry == "2" for status, _, retry in answers if status == 429)
    assert time.monotonic() - started < 30


@pytest.mark.parametrize("models", [None, {"replica-a": ["m"], "replica-b": ["m"]}], ids=["one pool", "by model"])
def test_a_request_that_waits_out_the_queue_gets_429_not_503(tmp_path: Path, backends: list[NamedBackend],
                                                             models: dict[str, list[str]] | None) -> None:
    """No queue limit, one slot per server, a 2 s queue timeout: the requests that never get a slot are told to
    come back (429 + Retry-After), which a client retries, not 503, which means the service is down. The same in the
    pool of a model (Gateway.post asks for model m)."""
    with start_gateway(tmp_path, backends, models=models, gateway_backend_max_connections=1, gateway_queue_limit=0,
                       gateway_timeout_queue=2) as gateway:
        with ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(lambda _: gateway.post({"sleep": 4.0}), range(6)))
        statuses = collections.Counter(status for status, _, _ in answers)
        assert statuses == {200: 2, 429: 4}, answers
        assert all(retry == "2" for status, _, retry in answers if status == 429)


# vLLM's runtime LoRA control (issue 30): the node loads and unloads adapters over loopback; a client never does.
# vLLM (Starlette) matches the percent-decoded path, so an encoded spelling must be refused as well.
LORA_CONTROL = ["/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/v1/load_lora_adapter/",
                "/v1/unload_lora_adapter?lora_name=x", "/v1/load%5flora_adapter", "/v1/unload%5Flora%5Fadapter",
                "/v1/%6coad_lora_adapter"]


@pytest.mark.parametrize("method", ["POST", "GET"])
def test_a_clients_lora_load_or_unload_is_refused_with_403_and_never_reaches_vllm(
        gateway: Gateway, backends: list[NamedBackend], method: str) -> None:
    body = json.dumps({"lora_name": "x", "lora_path": "/tmp/x"})
    for path in LORA_CONTROL:
        conn = http.client.HTTPSConnection("127.0.0.1", gateway.port, context=gateway.context, timeout=30)
        try:
            conn.request(method, path, body if method == "POST" else None,
                         {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
            resp = conn.getresponse()
            answer = resp.read()
        finally:
            conn.close()
        assert resp.status == 403, (method, path, resp.status, answer)
        assert b"path not served by this gateway" in answer, (path, answer)
    assert [b.served for b in backends] == [0, 0], "a LoRA control request reached a replica"
    # the rest of /v1/ still goes through
    assert gateway.post({})[0] == 200


# Several models (issue 27): alpha (and its adapter alpha-lora) on two replicas, beta on a third.
MODELS = {"alpha-1": ["alpha", "alpha-lora"], "alpha-2": ["alpha", "alpha-lora"], "beta-1": ["beta"]}
MAX_BODY = 65536


@pytest.fixture
def model_backends() -> Iterator[dict[str, NamedBackend]]:
    servers = {name: NamedBackend(name).start() for name in MODELS}
    yield servers
    for server in servers.values():
        server.stop()


@pytest.fixture
def model_gateway(tmp_path: Path, model_backends: dict[str, NamedBackend]) -> Iterator[Gateway]:
    """Routing by model, a 64 KiB body limit, one request at once per server and a queue of one per pool."""
    with start_gateway(tmp_path, list(model_backends.values()), models=MODELS, gateway_max_body_bytes=MAX_BODY,
                       gateway_backend_max_connections=1, gateway_queue_limit=1, gateway_timeout_queue=20) as running:
        yield running


def chat_bytes(model: Any, **fields: Any) -> bytes:
    """harness.api's chat request body for `model` (any JSON value), as bytes."""
    return json.dumps({**chat("", 8, **fields), "model": model}).encode()


def error_of(status: int, data: bytes, code: int) -> dict[str, Any]:
    """The `error` of a gateway's answer in vLLM's shape ({"error": {message, type, param, code}})."""
    assert status == code, (status, data)
    body = json.loads(data)
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["code"] == code
    return dict(body["error"])


def test_each_models_requests_reach_only_its_servers_streamed_or_not(model_gateway: Gateway,
                                                                     model_backends: dict[str, NamedBackend]) -> None:
    for model in ("alpha", "alpha-lora", "beta") * 4:
        status, _, data = model_gateway.call("POST", "/v1/chat/completions", chat_bytes(model))
        assert status == 200, data
        assert json.loads(data)["server"] in [n for n, served in MODELS.items() if model in served], (model, data)
    assert sorted(model_backends["beta-1"].models) == ["beta"] * 4
    assert sorted(model_backends["alpha-1"].models + model_backends["alpha-2"].models) == \
        ["alpha"] * 4 + ["alpha-lora"] * 4
    assert model_backends["alpha-1"].served and model_backends["alpha-2"].served, "leastconn within the pool"
    # a stream is forwarded as it comes: the first event arrives a gap before the last
    for model, servers in (("beta", {"beta-1"}), ("alpha", {"alpha-1", "alpha-2"})):
        conn = http.client.HTTPSConnection("127.0.0.1", model_gateway.port, context=model_gateway.context, timeout=30)
        try:
            conn.request("POST", "/v1/chat/completions", chat_bytes(model, stream=True, gap=1.0),
                         {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
            resp = conn.getresponse()
            assert resp.status == 200 and resp.getheader("Content-Type") == "text/event-stream"
            started = time.monotonic()
            first = json.loads(resp.readline().decode().removeprefix("data: "))
            first_at = time.monotonic() - started
            rest = resp.read().decode()
            total = time.monotonic() - started
        finally:
            conn.close()
        assert first["server"] in servers and first["event"] == 0
        assert rest.rstrip().endswith("data: [DONE]") and total - first_at > 2.5, (first_at, total)


def test_models_lists_every_model_the_gateway_serves(model_gateway: Gateway,
                                                     model_backends: dict[str, NamedBackend]) -> None:
    status, headers, data = model_gateway.call("GET", "/v1/models")
    assert status == 200 and headers["content-type"] == "application/json", (status, headers)
    listed = json.loads(data)
    assert listed["object"] == "list"
    assert [(m["id"], m["object"], m["owned_by"]) for m in listed["data"]] == [
        ("alpha", "model", "vllm"), ("alpha-lora", "model", "vllm"), ("beta", "model", "vllm")]
    assert all(isinstance(m["created"], int) for m in listed["data"])
    assert [b.served for b in model_backends.values()] == [0, 0, 0], "answered by the gateway"


def test_unknown_model_missing_model_and_a_body_too_large_are_refused_in_vllms_shape(
        model_gateway: Gateway, model_backends: dict[str, NamedBackend]) -> None:
    status, _, data = model_gateway.call("POST", "/v1/chat/completions", chat_bytes('gpt-"4o'))
    error = error_of(status, data, 404)
    assert error == {"message": 'The model `gpt-"4o` does not exist. Valid aliases: alpha, alpha-lora, beta.',
                     "type": "NotFoundError", "param": "model", "code": 404}
    for body in (b"not json", b'{"messages": []}', chat_bytes(None), chat_bytes(""), chat_bytes(["alpha"]),
                 chat_bytes({"id": "alpha"}), b'{"model": ', b'[{"model": "alpha"}]'):
        status, _, data = model_gateway.call("POST", "/v1/completions", body)
        error = error_of(status, data, 400)
        assert error["type"] == "BadRequestError" and "alpha, alpha-lora, beta" in error["message"], body
    # a GET names no model
    assert model_gateway.call("GET", "/v1/responses/resp-1")[0] == 400
    # the limit is the body's size: at it, routed; one byte over, 413, from Content-Length or chunked
    padded = chat_bytes("beta", pad="")
    at_limit = chat_bytes("beta", pad="x" * (MAX_BODY - len(padded)))
    assert len(at_limit) == MAX_BODY
    assert model_gateway.call("POST", "/v1/chat/completions", at_limit)[0] == 200
    over = at_limit[:-1] + b' }'
    assert len(over) == MAX_BODY + 1
    # just over the limit: read, then refused (the client gets the answer, not a cut stream)
    status, _, data = model_gateway.call("POST", "/v1/chat/completions", over)
    error = error_of(status, data, 413)
    assert f"limit of {MAX_BODY} bytes" in error["message"] and error["type"] == "Request Entity Too Large"
    # a Content-Length the buffer cannot hold is refused from the head, before any of the body is sent
    assert model_gateway.announce(MAX_BODY + 65537)[0] == 413
    assert model_gateway.announce(50 * 2 ** 20)[0] == 413
    for body, code in ((at_limit, 200), (over, 413), (over + b" " * 50000, 413)):
        conn = http.client.HTTPSConnection("127.0.0.1", model_gateway.port, context=model_gateway.context, timeout=30)
        try:
            conn.request("POST", "/v1/chat/completions", iter([body[i:i + 8192] for i in range(0, len(body), 8192)]),
                         {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}, encode_chunked=True)
            resp = conn.getresponse()
            assert resp.status == code, (len(body), resp.status, resp.read())
        finally:
            conn.close()
    assert [b.served for b in model_backends.values()] == [0, 0, 2]


def test_the_key_and_the_allowlist_come_before_any_model_check(model_gateway: Gateway,
                                                               model_backends: dict[str, NamedBackend]) -> None:
    for body in (chat_bytes("alpha"), chat_bytes("nope"), b"not json"):
        for key in (None, "wrong-key"):
            status, headers, _ = model_gateway.call("POST", "/v1/chat/completions", body, key=key)
            assert status == 401 and headers.get("www-authenticate") == "Bearer", (body[:40], key, status)
        assert model_gateway.call("POST", "/invocations", body)[0] == 403
        assert model_gateway.call("POST", "/v1/load_lora_adapter", body)[0] == 403
    assert model_gateway.announce(50 * 2 ** 20, key=None)[0] == 401
    assert model_gateway.call("GET", "/v1/models", key=None)[0] == 401
    assert model_gateway.call("GET", "/metrics")[0] == 403
    assert [b.served for b in model_backends.values()] == [0, 0, 0]


def test_a_conversation_stays_on_one_replica_of_its_model(model_gateway: Gateway) -> None:
    seen: dict[str, set[str]] = {}
    for i in range(12):
        for _ in range(3):
            wait_until_quiet(model_gateway, "model_alpha_affinity")   # bounded load counts open sessions
            status, _, data = model_gateway.call("POST", "/v1/chat/completions", chat_bytes("alpha"),
                                                 headers={"X-Session-Id": f"conversation-{i}"})
            assert status == 200
            seen.setdefault(f"conversation-{i}", set()).add(json.loads(data)["server"])
        status, _, data = model_gateway.call("POST", "/v1/chat/completions", chat_bytes("beta"),
                                             headers={"X-Session-Id": f"conversation-{i}"})
        assert json.loads(data)["server"] == "beta-1"
    assert all(len(servers) == 1 for servers in seen.values()), seen
    assert set().union(*seen.values()) == {"alpha-1", "alpha-2"}, seen


def test_a_full_queue_of_one_model_answers_429_while_the_other_model_serves(model_gateway: Gateway) -> None:
    """beta: one server, one request at once, a queue of one: of 5 slow requests at once, one runs, one (two when
    HAProxy's threads admit them together) waits, and the others are told at once to come back; alpha answers
    meanwhile."""
    def slow_beta(index: int) -> tuple[int, str | None, float]:
        started = time.monotonic()
        status, headers, _ = model_gateway.call("POST", "/v1/chat/completions", chat_bytes("beta", sleep=3.0))
        return status, headers.get("retry-after"), time.monotonic() - started

    with ThreadPoolExecutor(5) as pool:
        flood = pool.map(slow_beta, range(5))
        time.sleep(1.0)
        alpha_started = time.monotonic()
        alpha = model_gateway.call("POST", "/v1/chat/completions", chat_bytes("alpha"))
        alpha_took = time.monotonic() - alpha_started
        answers = list(flood)
    assert alpha[0] == 200 and alpha_took < 2.0, (alpha, alpha_took)
    statuses = collections.Counter(status for status, _, _ in answers)
    # one runs, one or more queued (HAProxy's threads may admit two at once), the rest told to come back
    assert set(statuses) == {200, 429} and statuses[200] >= 2 and statuses[429] >= 2, answers
    assert all(retry == "2" and took < 2.0 for status, retry, took in answers if status == 429), answers


def test_a_drain_where_the_server_is_checked_takes_it_out_of_all_its_models(model_gateway: Gateway) -> None:
    """What the rollout drains (rollout_gateway_backend "": the backends holding the server as one of its own, from
    show stat): alpha-1's one checked instance; its other model's pool and the affinity pools follow."""
    holding = haproxy_stat.holding_backends(haproxy_stat.parse_show_stat(model_gateway.runtime("show stat")),
                                            ["alpha-1"])
    assert holding == ["model_alpha"]
    model_gateway.runtime("set server model_alpha/alpha-1 state drain")
    for backend in ("model_alpha", "model_alpha_affinity", "model_alpha-lora", "model_alpha-lora_affinity"):
        assert model_gateway.status(backend, "alpha-1") == "DRAIN", backend
    for model in ("alpha", "alpha-lora") * 3:
        status, _, data = model_gateway.call("POST", "/v1/chat/completions", chat_bytes(model),
                                             headers={"X-Session-Id": f"s-{model}"})
        assert status == 200 and json.loads(data)["server"] == "alpha-2", (model, data)
    model_gateway.runtime("set server model_alpha/alpha-1 state ready")
    assert model_gateway.status("model_alpha-lora_affinity", "alpha-1") == "UP"


def test_health_is_ok_while_any_models_pool_has_a_server(model_gateway: Gateway,
                                                         model_backends: dict[str, NamedBackend]) -> None:
    assert model_gateway.call("GET", "/health", key=None)[0] == 200
    model_backends["beta-1"].stop()
    model_backends["alpha-1"].stop()
    time.sleep(4)   # 3 failed checks, 1 s apart
    assert model_gateway.call("GET", "/health", key=None)[0] == 200, "alpha-2 still serves"
    model_backends["alpha-2"].stop()
    deadline = time.monotonic() + 15
    while (status := model_gateway.call("GET", "/health", key=None)[0]) == 200:
        assert time.monotonic() < deadline, "still 200 with no server up"
        time.sleep(0.5)
    assert status == 503


# Priority (issue 31): X-Priority orders the gateway's queue (HAProxy's priority class) and becomes vLLM's
# X-Vllm-Priority; a value the gateway does not honour is class 0, served in its turn.
PRIORITY_QUEUE = [   # (tag, the request's headers), in the order they join the queue behind a busy server
    ("plain", [("X-Vllm-Priority", "-100")]),   # no class asked; vLLM's header from the client is replaced
    ("worse", [("X-Priority", "5")]),
    ("below-range", [("X-Priority", "-99")]),   # under gateway_priority_min (-10)
    ("malformed", [("X-Priority", "-3x")]),     # HAProxy alone would read -3
    ("repeated", [("X-Priority", "-4"), ("X-Priority", "-4")]),
    ("better", [("X-Priority", "-2")]),
]
# What the server sees: the better class first, then class 0 in arrival order, then the worse class.
PRIORITY_ORDER = ["busy", "better", "plain", "below-range", "malformed", "repeated", "worse"]
PRIORITY_SENT = {"busy": "0", "better": "-2", "worse": "5", "plain": "0", "below-range": "0", "malformed": "0",
                 "repeated": "0"}


def queued(gateway: Gateway, backend: str) -> int:
    """Requests waiting in `backend` now: its own queue and its servers' (`show stat` qcur)."""
    lines = gateway.runtime("show stat").splitlines()
    names = lines[0].lstrip("# ").split(",")
    rows = [dict(zip(names, line.split(","), strict=False)) for line in lines[1:] if line]
    return sum(int(row["qcur"] or 0) for row in rows if row["pxname"] == backend and row["svname"] != "FRONTEND")


def send_tagged(gateway: Gateway, tag: str, headers: list[tuple[str, str]], body: dict[str, Any]) -> int:
    """A chat request tagged `tag` (X-Tag) with these headers, repeated names included: its status."""
    conn = http.client.HTTPSConnection("127.0.0.1", gateway.port, context=gateway.context, timeout=60)
    try:
        data = json.dumps({"model": "m", **body}).encode()
        conn.putrequest("POST", "/v1/chat/completions")
        for name, value in [("Authorization", f"Bearer {KEY}"), ("Content-Type", "application/json"),
                            ("Content-Length", str(len(data))), ("X-Tag", tag), *headers]:
            conn.putheader(name, value)
        conn.endheaders(data)
        resp = conn.getresponse()
        resp.read()
        return resp.status
    finally:
        conn.close()


@pytest.mark.parametrize(("route", "models", "backend"), [
    ([], None, "vllm"),
    ([("X-Session-Id", "one-conversation")], None, "vllm_affinity"),
    ([], {"replica-a": ["m"]}, "model_m"),
], ids=["least busy", "affinity", "by model"])
def test_a_better_class_overtakes_the_queue_and_an_unhonoured_one_waits_its_turn(
        tmp_path: Path, route: list[tuple[str, str]], models: dict[str, list[str]] | None, backend: str) -> None:
    """One server with one slot, busy: six requests queue behind it, the last of a better class. It is served
    first, the worse class last, and the malformed, repeated and out-of-range ones at class 0 in their turn (none
    refused); each reaches the server with X-Vllm-Priority set to its class. The same in the affinity backend and
    a model's pool: the class is the request's, set in the frontend."""
    server = NamedBackend("replica-a").start()
    try:
        with start_gateway(tmp_path, [server], models=models, gateway_backend_max_connections=1,
                           gateway_priority_header="X-Priority") as gateway, ThreadPoolExecutor(8) as pool:
            answers = [pool.submit(send_tagged, gateway, "busy", route, {"sleep": 8})]
            deadline = time.monotonic() + 20
            while haproxy.servers(gateway.runtime("show stat"), backend)["replica-a"]["scur"] < 1:
                assert time.monotonic() < deadline, f"the busy request did not reach {backend}/replica-a"
                time.sleep(0.05)
            for tag, headers in PRIORITY_QUEUE:   # each joins the queue before the next is sent
                answers.append(pool.submit(send_tagged, gateway, tag, route + headers, {}))
                while queued(gateway, backend) < len(answers) - 1:
                    assert time.monotonic() < deadline, f"{tag}: {len(answers) - 1} requests not queued in {backend}"
                    time.sleep(0.05)
            assert server.served == 0, "the busy request ended before the queue was full: the order proves nothing"
            assert [answer.result() for answer in answers] == [200] * len(answers)
        served = [headers["x-tag"] for headers in server.headers]
        assert served == PRIORITY_ORDER
        assert {headers["x-tag"]: headers.get("x-vllm-priority") for headers in server.headers} == PRIORITY_SENT
    finally:
        server.stop()
