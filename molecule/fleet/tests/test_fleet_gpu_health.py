"""The GPU watch in the fleet (issue 28), after test_fleet.py in the same verify: a simulated Xid 79 on fleet-node2
takes it out of the gateway's rotation by itself (the node's timer writes the FAIL verdict, its agent answers
HAProxy's agent-check `down #...`) while a client loop through the gateway sees no failed request, and once the Xid is
cleared the node comes back by itself and gets requests again. Nothing here talks to HAProxy's runtime API.

The simulation's boundary: the node's dmesg stand-in (tests/fixtures/gpu_node/dmesg) prints the file its data file's
"kernel_log" key names; prepare.yml put kern-clean.log and kern-xid79.log there, and this test switches between them.
Figures go to artifacts/fleet/measurements.json under "07-gpu-watch".
"""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness import api, haproxy
from harness.clients import ClientLoop
from harness.figures import Figures
from harness.project import PROJECT, machine

SCENARIO = Path(__file__).resolve().parents[1]
FIGURES = Figures(PROJECT / "artifacts" / "fleet" / "measurements.json")
SICK, HEALTHY = "fleet-node2", "fleet-node1"
GATEWAY = "fleet-gateway"
FRONT = api.Gateway("10.212.13.10", 443)
SOCKET = "/run/haproxy/gateway.sock"
KEY = yaml.safe_load((SCENARIO / "group_vars" / "all.yml").read_text())["vllm_node_api_key"]
BACKENDS = {b["name"]: b for b in
            yaml.safe_load((SCENARIO / "group_vars" / "gateways.yml").read_text())["gateway_backends"]}
DATA = "/etc/vllm-node-fake-gpus.json"
# The watch checks every 10 s (group_vars/all.yml), HAProxy asks the agent every 2 s (gateway_agent_interval) and
# puts a server back after 2 passing health checks 2 s apart: each change must show within this.
CHANGE_WITHIN_S = 45

testinfra_hosts = [f"ansible://{HEALTHY}"]


def backend_rows() -> dict[str, dict[str, Any]]:
    """The backend vllm's servers as the project's parser reads them (status, weight, scur, stot, admin state)."""
    return haproxy.servers(haproxy.runtime_command_on(machine(GATEWAY), SOCKET, "show stat"), "vllm")


def sessions_total(name: str) -> int:
    """Requests HAProxy has sent to a server so far (the stot column)."""
    return int(backend_rows()[name]["stot"])


def agent_answer(name: str) -> str:
    """What the node's agent answers HAProxy, asked from the gateway as HAProxy asks it (connect, read, close)."""
    backend = BACKENDS[name]
    script = ("import socket,sys\ns=socket.create_connection((sys.argv[1],int(sys.argv[2])),timeout=5)\n"
              "d=b''\nwhile (c:=s.recv(4096)): d+=c\nprint(d.decode().strip())")
    return machine(GATEWAY).check_output(
        f"python3 -c {shlex.quote(script)} {backend['address']} {backend['agent_port']}").strip()


def simulate_kernel_log(name: str, log: str) -> None:
    """Point the node's simulated dmesg at another kernel log (the data file's kernel_log key)."""
    script = ("import json,sys\np=sys.argv[1]\nd=json.load(open(p))\nd['kernel_log']=sys.argv[2]\n"
              "open(p+'.new','w').write(json.dumps(d,indent=2))\nimport os\nos.replace(p+'.new',p)")
    machine(name).check_output(f"python3 -c {shlex.quote(script)} {DATA} {log}")


def wait_for_status(name: str, prefix: str, within: float) -> float:
    """Seconds until HAProxy shows `name` with a status starting with `prefix`; fails after `within` seconds."""
    start = time.monotonic()
    while True:
        status = backend_rows()[name]["status"]
        if status.startswith(prefix):
            return round(time.monotonic() - start, 1)
        assert time.monotonic() - start < within, f"{name} still {status} after {within} s (wanted {prefix})"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def served_model() -> str:
    status, body = FRONT.request("GET", "/v1/models", KEY)
    assert status == 200, (status, body[:200])
    return json.loads(body)["data"][0]["id"]


@pytest.fixture()
def clean_kernel_log():
    """Whatever happens, the sick node's kernel log is clean again afterwards."""
    yield
    simulate_kernel_log(SICK, "kern-clean.log")


def test_07_an_xid_takes_the_node_out_by_itself_and_it_comes_back(served_model, clean_kernel_log):
    for name in BACKENDS:  # test_fleet.py's last step may have just put a rolled-back node back
        wait_for_status(name, "UP", CHANGE_WITHIN_S)
    assert agent_answer(SICK) == "up" and agent_answer(HEALTHY) == "up"
    config = machine(GATEWAY).file("/etc/haproxy/haproxy.cfg").content_string
    assert f"agent-check agent-port {BACKENDS[SICK]['agent_port']}" in config
    client = ClientLoop(lambda _kind, stream: FRONT.chat_once(KEY, served_model, stream), 20000, 900)
    client.start()
    try:
        time.sleep(5)  # requests in flight on both nodes before the fault
        simulate_kernel_log(SICK, "kern-xid79.log")
        out_after = wait_for_status(SICK, "DOWN", CHANGE_WITHIN_S)
        answer = agent_answer(SICK)
        assert answer.startswith("down #GPU health FAIL: GPU 1 (serial 1792525000001; bus 0000:28:00.0): xid_79"), \
            answer
        assert backend_rows()[HEALTHY]["status"] == "UP" and agent_answer(HEALTHY) == "up"
        sent_while_down = sessions_total(SICK)
        time.sleep(10)
        assert sessions_total(SICK) == sent_while_down, "HAProxy sent requests to the node it took out"
        simulate_kernel_log(SICK, "kern-clean.log")
        back_after = wait_for_status(SICK, "UP", CHANGE_WITHIN_S)
        assert agent_answer(SICK) == "up"
        sent_when_back = sessions_total(SICK)
        deadline = time.monotonic() + 30
        while sessions_total(SICK) == sent_when_back:
            assert time.monotonic() < deadline, "the node is UP again but gets no request"
            time.sleep(1)
        time.sleep(3)
    finally:
        counts = client.stop()
    FIGURES.record("07-gpu-watch", dict(out_of_rotation_s=out_after, back_s=back_after, clients=counts))
    assert counts["sent"] > 0 and counts["failed"] == 0, counts["failures"]
