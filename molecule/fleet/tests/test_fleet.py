"""A fleet changed by playbooks/rollout.yml while clients use it (issue 12), driven step by step: each step is one
real `ansible-playbook playbooks/rollout.yml` run against this scenario's inventory, with a restart witness on both
nodes and, where it matters, a client loop sending chat completions through the gateway the whole time.

The sequence (file order; pytest -x, each step starts from the state the one before left):
  01 the converge left both nodes on 0.31.0 behind the gateway, both UP in HAProxy
  02 from outside the fleet network (fleet-client, on the front network only) only the gateway's port answers
  03 rollout to vLLM 0.32.0 under the client loop: 0 failed requests, both nodes on 0.32.0, one restart each
  04 the same rollout again: no restart (MainPID unchanged), no drain, both reports "unchanged"
  05 a serving flag change (max-model-len halved) with a flag vLLM refuses on the second node only, under the client
     loop: the first node serves the change, the second is rolled back and serving, the play fails naming it and
     the cause, 0 failed requests
Measurements go to artifacts/fleet/measurements.json (per step: seconds, client counts and durations, each node's
drain wait, time out of the pool, stop and start seconds); each run's output to artifacts/fleet/<step>.log, the
client loop's counts to artifacts/fleet/client-<step>.json.
"""

from __future__ import annotations

import csv
import http.client
import json
import os
import re
import shlex
import ssl
import statistics
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import testinfra
import yaml

PROJECT = Path(os.environ.get("MOLECULE_PROJECT_DIRECTORY", Path(__file__).resolve().parents[3]))
SCENARIO = Path(__file__).resolve().parents[1]
ARTIFACTS = PROJECT / "artifacts" / "fleet"
NODES = ["fleet-node1", "fleet-node2"]
GATEWAY, CLIENT = "fleet-gateway", "fleet-client"
FRONT_ADDRESS = "10.212.13.10"    # the gateway on the front network (molecule.yml): what clients connect to
GATEWAY_PORT = 443
VLLM_PORT = 8000
CA = PROJECT / "artifacts" / "gateway-ca" / "ca.crt"
SOCKET = "/run/haproxy/gateway.sock"
KEY = yaml.safe_load((SCENARIO / "group_vars" / "all.yml").read_text())["vllm_node_api_key"]
ADDRESS = {node: yaml.safe_load((SCENARIO / "host_vars" / f"{node}.yml").read_text())["vllm_node_listen_address"]
           for node in NODES}
BAD_FLAG = "--rollout-test-unknown-flag"
# The client loop's bounds: it stops when the step's run ends, or at these.
CLIENT_MAX_REQUESTS = 20000
CLIENT_MAX_SECONDS = 3600

testinfra_hosts = [f"ansible://{NODES[0]}"]

# What the steps pass on: the extra vars in force (the fleet's inventory state after each successful rollout).
STATE: dict[str, Any] = {"vars": {}}


# ---- helpers -------------------------------------------------------------------------------------------------


def inventory() -> str:
    return str(Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "inventory")


def machine(name: str):
    """A testinfra host of the scenario (the `host` fixture is the first node only)."""
    return testinfra.get_host(f"ansible://{name}?ansible_inventory={inventory()}")


def record(step: str, **values: Any) -> None:
    """Keep a step's measured values for the report (and print them)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / "measurements.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data[step] = values
    path.write_text(json.dumps(data, indent=2) + "\n")
    print(f"MEASURED {step}: {json.dumps(values)}")


def rollout(step: str, extra_vars: dict[str, Any], timeout: int = 3600) -> tuple[int, str, float]:
    """Run playbooks/rollout.yml with these extra vars; (rc, output, seconds). The output is kept."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    vars_file = ARTIFACTS / f"{step}.vars.json"
    vars_file.write_text(json.dumps(extra_vars, indent=2) + "\n")
    env = dict(os.environ, ANSIBLE_ROLES_PATH=str(PROJECT / "roles"),
               ANSIBLE_COLLECTIONS_PATH=str(PROJECT / "collections"), ANSIBLE_CONFIG=str(PROJECT / "ansible.cfg"),
               ANSIBLE_FORCE_COLOR="0")
    log = ARTIFACTS / f"{step}.log"
    start = time.monotonic()
    with log.open("w") as out:  # written as it runs: `tail -f` shows where a long step is
        proc = subprocess.run(["ansible-playbook", "-i", inventory(), "playbooks/rollout.yml", "-e", f"@{vars_file}"],
                              cwd=PROJECT, env=env, stdout=out, stderr=subprocess.STDOUT, text=True, timeout=timeout,
                              check=False)
    return proc.returncode, log.read_text(), time.monotonic() - start


def witness(node) -> dict[str, str]:
    """The unit's main PID, invocation and state timestamps (monotonic µs), and the node's clock."""
    out = node.check_output("systemctl show -p MainPID -p InvocationID -p ActiveEnterTimestamp "
                            "-p ActiveEnterTimestampMonotonic -p ActiveExitTimestampMonotonic "
                            "-p InactiveEnterTimestampMonotonic -p InactiveExitTimestampMonotonic vllm")
    state = dict(line.split("=", 1) for line in out.splitlines())
    state["now"] = node.check_output("date +%s").strip()
    return state


def restarts(node, before: dict[str, str]) -> int:
    """Invocations of the unit that began after `before` (each start, a failed one included)."""
    out = node.check_output(
        f"journalctl --since @{int(before['now']) - 1} -o json --output-fields=INVOCATION_ID,_SYSTEMD_INVOCATION_ID "
        "UNIT=vllm.service + _SYSTEMD_UNIT=vllm.service")
    seen = set()
    for line in out.splitlines():
        entry = json.loads(line)
        seen.update(v for k, v in entry.items() if k in ("INVOCATION_ID", "_SYSTEMD_INVOCATION_ID") and v)
    return len(seen - {before["InvocationID"]})


def stop_start_seconds(state: dict[str, str]) -> dict[str, float | None]:
    """The last stop (active -> inactive) and start (inactive -> active, i.e. until /health answered) in seconds."""
    def span(a: str, b: str) -> float | None:
        x, y = int(state.get(a) or 0), int(state.get(b) or 0)
        return round((y - x) / 1e6, 1) if x and y and y >= x else None
    return {"stop_s": span("ActiveExitTimestampMonotonic", "InactiveEnterTimestampMonotonic"),
            "start_s": span("InactiveExitTimestampMonotonic", "ActiveEnterTimestampMonotonic")}


def node_get(node, name: str, path: str) -> tuple[int, str]:
    """A request to a node's vLLM from inside the node (its fleet address), with the key."""
    cmd = (f"curl -s -o /tmp/fleet-body -w '%{{http_code}}' -H {shlex.quote('Authorization: Bearer ' + KEY)} "
           f"http://{ADDRESS[name]}:{VLLM_PORT}{path}")
    status = node.run(cmd).stdout.strip()
    return int(status or 0), node.run("cat /tmp/fleet-body").stdout


def served(name: str) -> dict[str, Any]:
    """What a node serves: /version and /v1/models' entry (id, root, max_model_len)."""
    node = machine(name)
    status, version = node_get(node, name, "/version")
    assert status == 200, (name, status, version)
    status, models = node_get(node, name, "/v1/models")
    assert status == 200, (name, status, models)
    return {"version": json.loads(version)["version"], **json.loads(models)["data"][0]}


def gateway_servers() -> dict[str, dict[str, str]]:
    """HAProxy's view of the backend `vllm`: server -> status, weight, stot (requests sent to it so far)."""
    script = ("import socket,sys\ns=socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\ns.sendall(b'show stat\\n')\n"
              "d=b''\nwhile (c:=s.recv(65536)): d+=c\nprint(d.decode())")
    out = machine(GATEWAY).check_output(f"python3 -c {shlex.quote(script)} {SOCKET}")
    lines = [line for line in out.splitlines() if line.strip()]
    rows = csv.DictReader([lines[0].lstrip("# ")] + lines[1:])
    return {r["svname"]: {"status": r["status"], "weight": r["weight"], "stot": r["stot"]}
            for r in rows if r["pxname"] == "vllm" and r["svname"] not in ("FRONTEND", "BACKEND")}


def haproxy_log_since(since: str) -> list[str]:
    """HAProxy's own journal lines since an epoch second of the gateway (server state changes are logged there)."""
    out = machine(GATEWAY).check_output(f"journalctl -u haproxy --since @{since} -o cat")
    return [line for line in out.splitlines() if "vllm/" in line]


def report(name: str) -> dict[str, Any]:
    return json.loads((PROJECT / "artifacts" / "rollout" / f"{name}.json").read_text())


def tls() -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(CA))


class ClientLoop(threading.Thread):
    """Chat completions through the gateway, one after another, streamed and not in turn, until stopped or bounded
    (CLIENT_MAX_REQUESTS, CLIENT_MAX_SECONDS). A request fails on any status but 200, a connection error, an
    incomplete answer (no [DONE], an error event, not the requested number of tokens)."""

    def __init__(self, model: str) -> None:
        super().__init__(daemon=True)
        self.model, self.halt = model, threading.Event()
        self.sent = self.streamed = 0
        self.durations: list[float] = []
        self.failures: list[dict[str, Any]] = []
        self.first = self.last = 0.0

    def one(self, stream: bool) -> str:
        """'' when the request succeeded, else why not."""
        body = {"model": self.model, "messages": [{"role": "user", "content": "Count to five."}], "max_tokens": 8,
                "ignore_eos": True, "stream": stream}
        conn = http.client.HTTPSConnection(FRONT_ADDRESS, GATEWAY_PORT, context=tls(), timeout=120)
        try:
            conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                         headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
            response = conn.getresponse()
            if response.status != 200:
                return f"status {response.status}: {response.read()[:200]!r}"
            if not stream:
                answer = json.loads(response.read())
                tokens = answer.get("usage", {}).get("completion_tokens")
                return "" if tokens == 8 else f"{tokens} tokens instead of 8: {str(answer)[:200]}"
            events, done = 0, False
            while line := response.readline():
                if line.strip() == b"data: [DONE]":
                    done = True
                    break
                if line.startswith(b"data: "):
                    if b'"error"' in line:
                        return f"error event: {line[:200]!r}"
                    events += 1
            return "" if done and events > 0 else f"stream ended without [DONE] after {events} events"
        except (OSError, http.client.HTTPException, ValueError) as err:
            return f"{type(err).__name__}: {err}"
        finally:
            conn.close()

    def run(self) -> None:
        self.first = time.time()
        start = time.monotonic()
        while (not self.halt.is_set() and self.sent < CLIENT_MAX_REQUESTS
               and time.monotonic() - start < CLIENT_MAX_SECONDS):
            stream = self.sent % 2 == 1
            t0 = time.monotonic()
            why = self.one(stream)
            self.durations.append(time.monotonic() - t0)
            self.sent += 1
            self.streamed += stream
            if why:
                self.failures.append({"at": round(time.time(), 3), "stream": stream, "error": why})
            self.last = time.time()
            time.sleep(0.1)  # leave the 2 shared cores some room for the rollout itself

    def stop(self) -> dict[str, Any]:
        self.halt.set()
        self.join(timeout=180)
        d = sorted(self.durations)
        return {"sent": self.sent, "streamed": self.streamed, "failed": len(self.failures),
                "failures": self.failures[:20], "first": round(self.first, 3), "last": round(self.last, 3),
                "duration_s": {"min": round(d[0], 3), "p50": round(statistics.median(d), 3),
                               "p99": round(d[int(len(d) * 0.99) - 1 if len(d) > 1 else 0], 3),
                               "max": round(d[-1], 3)} if d else {}}


def under_load(step: str, extra_vars: dict[str, Any], model: str) -> tuple[int, str, float, dict[str, Any]]:
    """A rollout with the client loop running from before it starts until after it ends."""
    client = ClientLoop(model)
    client.start()
    time.sleep(5)  # requests in flight before the first drain
    try:
        rc, output, seconds = rollout(step, extra_vars)
        time.sleep(5)  # and after the last node is back
    finally:
        counts = client.stop()
    (ARTIFACTS / f"client-{step}.json").write_text(json.dumps(counts, indent=2) + "\n")
    return rc, output, seconds, counts


def task_results(output: str, task: str) -> list[str]:
    """The result lines (ok/changed/skipping/failed: [host]) of every run of a task named `task` in the output."""
    found: list[str] = []
    for block in re.split(r"^TASK \[", output, flags=re.M)[1:]:
        if task in block.split("]", 1)[0]:
            found += re.findall(r"^(ok|changed|skipping|failed|fatal): \[([^\]]+)\]", block, re.M)
    return [f"{status}:{host.split(' ')[0]}" for status, host in found]


@pytest.fixture(scope="module")
def model() -> str:
    return served(NODES[0])["id"]


# ---- the sequence --------------------------------------------------------------------------------------------


def test_01_converged_fleet(model):
    """Both nodes serve 0.31.0 on their fleet address, both UP in the gateway (leastconn), a completion through it."""
    (ARTIFACTS / "measurements.json").unlink(missing_ok=True)
    versions = {name: served(name)["version"] for name in NODES}
    assert versions == {name: "0.31.0" for name in NODES}
    servers = gateway_servers()
    assert {name: servers[name]["status"] for name in NODES} == {name: "UP" for name in NODES}
    assert "balance leastconn" in machine(GATEWAY).file("/etc/haproxy/haproxy.cfg").content_string
    client = ClientLoop(model)
    assert client.one(False) == "" and client.one(True) == ""
    for name in NODES:
        assert machine(name).file("/var/lib/vllm-node/benchmark-last.json").exists, "no baseline for the gate"
    record("01-converged", versions=versions, gateway=servers)


def test_02_only_the_gateway_answers_outside_the_fleet_network():
    """From fleet-client (front network only): the gateway's port answers; every TCP port listening on a node
    (vLLM's API on the fleet address included) and every other port of the gateway's front address do not."""
    client = machine(CLIENT)
    probe = ("import socket,sys,json\nout={}\nfor a in sys.argv[2:]:\n h,p=a.rsplit(':',1)\n"
             " try:\n  socket.create_connection((h,int(p)),timeout=float(sys.argv[1])).close(); out[a]=True\n"
             " except OSError: out[a]=False\nprint(json.dumps(out))")

    def reachable(timeout: float, targets: list[str]) -> dict[str, bool]:
        return json.loads(client.check_output(f"python3 -c {shlex.quote(probe)} {timeout} {' '.join(targets)}"))

    node_targets = []
    for name in NODES:
        ports = {int(line.split()[3].rsplit(":", 1)[1]) for line in machine(name).check_output("ss -Hltn").splitlines()}
        assert VLLM_PORT in ports
        node_targets += [f"{ADDRESS[name]}:{port}" for port in sorted(ports)]
    gateway_ports = {int(line.split()[3].rsplit(":", 1)[1])
                     for line in machine(GATEWAY).check_output("ss -Hltn").splitlines()}
    gateway_targets = [f"{FRONT_ADDRESS}:{port}" for port in sorted(gateway_ports | {VLLM_PORT, 22, 80})]
    for name in NODES:
        uid = machine(name).user("vllm").uid
        own = [line.split()[3] for line in machine(name).check_output("ss -Hltne").splitlines()
               if re.search(rf"\buid:{uid}\b", line)]
        beyond = [s for s in own
                  if not re.match(r"^127\.\d+\.\d+\.\d+:\d+$", s) and s != f"{ADDRESS[name]}:{VLLM_PORT}"]
        assert own and not beyond, f"{name}: the vllm user listens beyond loopback and its API address: {beyond}"
    nodes = reachable(2, node_targets)
    gateway = reachable(2, gateway_targets)
    record("02-outside", nodes=nodes, gateway=gateway)
    assert gateway[f"{FRONT_ADDRESS}:{GATEWAY_PORT}"], "the gateway does not answer from outside the fleet network"
    assert [t for t, ok in gateway.items() if ok] == [f"{FRONT_ADDRESS}:{GATEWAY_PORT}"]
    assert not any(nodes.values()), [t for t, ok in nodes.items() if ok]


def test_03_rollout_to_0_32_0_under_load(model):
    STATE["vars"] = {"vllm_node_vllm_version": "0.32.0"}
    before = {name: witness(machine(name)) for name in NODES}
    gateway_clock = machine(GATEWAY).check_output("date +%s").strip()
    stot_before = gateway_servers()
    rc, output, seconds, client = under_load("03-rollout-0.32.0", STATE["vars"], model)
    after = {name: witness(machine(name)) for name in NODES}
    stot_after = gateway_servers()
    drains = haproxy_log_since(gateway_clock)
    reports = {name: report(name) for name in NODES}
    record("03-rollout-0.32.0", rc=rc, seconds=round(seconds, 1), client=client,
           nodes={name: {"restarts": restarts(machine(name), before[name]), **stop_start_seconds(after[name]),
                         "drain_wait_s": reports[name]["seconds"]["drain_wait"],
                         "out_of_pool_s": reports[name]["seconds"]["out_of_pool"],
                         "requests_left_at_drain": reports[name]["drain"]["requests_left"],
                         "gateway_requests": int(stot_after[name]["stot"]) - int(stot_before[name]["stot"])}
                  for name in NODES},
           haproxy_log=drains[:12])
    assert rc == 0, f"rollout failed; see {ARTIFACTS / '03-rollout-0.32.0.log'}\n{output[-3000:]}"
    assert client["sent"] > 0 and client["failed"] == 0, client["failures"]
    for name in NODES:
        assert served(name)["version"] == "0.32.0"
        assert restarts(machine(name), before[name]) == 1, name
        assert reports[name]["outcome"] == "changed"
        assert gateway_servers()[name]["status"] == "UP"
    # the canary went first: its time out of the pool ended before the second node's began
    assert reports[NODES[0]]["times"]["enabled"] <= reports[NODES[1]]["times"]["drain"]
    assert [line for line in drains if "drain" in line.lower()], f"HAProxy logged no drain: {drains}"
    STATE["drain_logged"] = True


def test_04_a_rollout_that_changes_nothing_restarts_and_drains_nothing():
    before = {name: witness(machine(name)) for name in NODES}
    gateway_clock = machine(GATEWAY).check_output("date +%s").strip()
    rc, output, seconds = rollout("04-unchanged", STATE["vars"])
    after = {name: witness(machine(name)) for name in NODES}
    drain_tasks = task_results(output, "Drain the node at the gateways")
    record("04-unchanged", rc=rc, seconds=round(seconds, 1), drain_task=drain_tasks,
           main_pid={name: [before[name]["MainPID"], after[name]["MainPID"]] for name in NODES})
    assert rc == 0, output[-3000:]
    for name in NODES:
        assert after[name]["MainPID"] == before[name]["MainPID"] != "0", name
        assert restarts(machine(name), before[name]) == 0, name
        assert report(name)["outcome"] == "unchanged"
    assert drain_tasks and all(result.startswith("skipping:") for result in drain_tasks), drain_tasks
    assert STATE.get("drain_logged"), "step 03 did not show that HAProxy logs a drain: the check below proves nothing"
    assert not [line for line in haproxy_log_since(gateway_clock) if "drain" in line.lower()]


def test_05_a_node_that_fails_is_rolled_back_and_the_play_stops_naming_it(model):
    """max-model-len halved on the fleet; the second node also gets a flag vLLM refuses. The first node serves the
    change, the second fails to start, is rolled back (serving its previous configuration) and put back."""
    before_len = served(NODES[1])["max_model_len"]
    change = {"vllm_node_max_model_len": before_len // 2}
    once = {"vllm_node_extra_args": "{{ ['" + BAD_FLAG + "'] if inventory_hostname == '" + NODES[1] + "' else [] }}"}
    before = {name: witness(machine(name)) for name in NODES}
    rc, output, seconds, client = under_load("05-failure-on-node2", dict(STATE["vars"], **change, **once), model)
    after = {name: witness(machine(name)) for name in NODES}
    reports = {name: report(name) for name in NODES}
    first, second = served(NODES[0]), served(NODES[1])
    record("05-failure-on-node2", rc=rc, seconds=round(seconds, 1), client=client,
           nodes={name: {"restarts": restarts(machine(name), before[name]), **stop_start_seconds(after[name]),
                         "outcome": reports[name]["outcome"], "cause": reports[name]["cause"][:300],
                         "out_of_pool_s": reports[name]["seconds"]["out_of_pool"]} for name in NODES},
           served={NODES[0]: first["max_model_len"], NODES[1]: second["max_model_len"]})
    assert rc != 0, "the rollout passed with a node that cannot start"
    assert f"Rollout stopped at {NODES[1]}" in output
    assert f"unrecognized arguments: {BAD_FLAG}" in output, "the cause is not named"
    assert client["sent"] > 0 and client["failed"] == 0, client["failures"]
    assert first["max_model_len"] == before_len // 2 and restarts(machine(NODES[0]), before[NODES[0]]) == 1
    assert second["max_model_len"] == before_len and second["version"] == "0.32.0"
    assert reports[NODES[1]]["outcome"] == "failed" and BAD_FLAG in reports[NODES[1]]["cause"]
    assert BAD_FLAG not in machine(NODES[1]).file("/etc/systemd/system/vllm.service").content_string
    assert gateway_servers()[NODES[1]]["status"] == "UP"
    assert ClientLoop(model).one(False) == ""
