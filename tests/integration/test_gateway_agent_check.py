"""HAProxy (the machine's own, as the gateway role installs it from the distribution) follows the GPU watch's agent:
the gateway's haproxy.cfg backend line with an agent_port, a stand-in vLLM answering /health, and an agent that
answers each connection with gpu_watch.py's reply for the verdict file, as the node's socket-activated unit does.
A FAIL verdict takes the server DOWN with the reason in the stats, a PASS puts it back UP; a drain set through the
runtime API stays while the agent says up."""
from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ansible_collections.vllm_node.vllm_node.plugins.module_utils import gpu_watch
from harness import haproxy
from harness.backends import NamedBackend
from harness.haproxy import AnsweringSocket

pytestmark = pytest.mark.skipif(shutil.which("haproxy") is None, reason="needs haproxy")


@pytest.fixture()
def gateway(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """haproxy with one server (a /health stand-in) and its agent; (verdict file, runtime socket)."""
    verdict = tmp_path / "verdict.json"
    vllm = NamedBackend("node1")   # answers HAProxy's GET /health with 200
    vllm.start()
    # the node's agent: gpu_watch.py's reply for the verdict file, as its socket-activated unit answers
    try:
        with AnsweringSocket(lambda: (gpu_watch.agent_reply(gpu_watch.read_document(str(verdict))) + "\n").encode()) \
                as agent, haproxy.one_server(tmp_path, "node1", vllm.port,
                                             f"agent-check agent-port {agent.address} agent-inter 1s") as runtime:
            yield verdict, runtime
    finally:
        vllm.stop()


def status_becomes(runtime: Path, prefix: str, within: float = 20) -> str:
    deadline = time.monotonic() + within
    while True:
        status = haproxy.servers(haproxy.runtime_command(runtime, "show stat"), "vllm")["node1"]["status"]
        if status.startswith(prefix):
            return status
        assert time.monotonic() < deadline, f"still {status}, wanted {prefix}"
        time.sleep(0.3)


def write_verdict(path: Path, verdict: str, reason: str = "") -> None:
    path.write_text(json.dumps({"checked_at": time.time(), "verdict": verdict, "reason": reason}))


def test_haproxy_takes_the_server_out_on_a_fail_and_back_on_a_pass(gateway: tuple[Path, Path]) -> None:
    verdict, runtime = gateway
    write_verdict(verdict, "PASS")
    status_becomes(runtime, "UP")
    write_verdict(verdict, "FAIL", "GPU 1 (serial 1792525000001, bus 0000:28:00.0): xid_79")
    status_becomes(runtime, "DOWN")
    servers = haproxy.runtime_command(runtime, "show servers state vllm")
    assert "node1" in servers
    stat = haproxy.runtime_command(runtime, "show stat")
    assert "GPU health FAIL: GPU 1 (serial 1792525000001; bus 0000:28:00.0): xid_79" in stat
    write_verdict(verdict, "PASS")
    assert status_becomes(runtime, "UP") == "UP"


def test_a_drain_through_the_runtime_api_stays_while_the_agent_says_up(gateway: tuple[Path, Path]) -> None:
    verdict, runtime = gateway
    write_verdict(verdict, "WARN")
    status_becomes(runtime, "UP")
    haproxy.runtime_command(runtime, "set server vllm/node1 state drain")
    status_becomes(runtime, "DRAIN")
    time.sleep(3)  # three agent answers of "up"
    assert haproxy.servers(haproxy.runtime_command(runtime, "show stat"), "vllm")["node1"]["admin_drain"]
