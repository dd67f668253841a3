"""The gateway's haproxy.cfg (roles/gateway/templates/etc/haproxy/haproxy.cfg.j2) rendered as Ansible renders it: a
backend with an agent_port gets HAProxy's agent-check on that port (the node's GPU watch), one without gets none;
backends with models get one pool per model, each server checked once; a priority header sets the request's class
in the frontend, and vLLM's X-Vllm-Priority from it; the file passes `haproxy -c` where HAProxy is installed."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import jinja2
import pytest
import yaml

from ansible_collections.vllm_node.vllm_node.plugins.module_utils.gateway_routing import routing
from repo_root import ROOT

TEMPLATE = ROOT / "roles/gateway/templates/etc/haproxy/haproxy.cfg.j2"
DEFAULTS = yaml.safe_load((ROOT / "roles/gateway/defaults/main.yml").read_text())


def render(backends: list[dict[str, Any]], tmp_path: Path, **overrides: Any) -> str:
    """The template with the role's defaults, Ansible's trim_blocks, and the filters it uses."""
    env = jinja2.Environment(trim_blocks=True, undefined=jinja2.StrictUndefined)
    env.filters["regex_replace"] = lambda value, pattern, repl: re.sub(pattern, repl, str(value))
    env.filters["comment"] = lambda text: "# " + str(text)
    values = {**DEFAULTS, "ansible_managed": "managed", "__gateway_backends": backends,
              "__gateway_pem_path": str(tmp_path / "gateway.pem"), "__gateway_keys_path": str(tmp_path / "keys"),
              "__gateway_runtime_socket": str(tmp_path / "gateway.sock"),
              "__gateway_models_map_path": str(tmp_path / "models.map"),
              "__gateway_models_list_path": str(tmp_path / "models.json"), **overrides}
    values["__gateway_routing"] = routing(backends, values["gateway_max_body_bytes"])
    return env.from_string(TEMPLATE.read_text()).render(**values)


def server_lines(config: str, backend: str = "vllm") -> list[str]:
    """The server lines of one backend section."""
    section = config.split(f"\nbackend {backend}\n", 1)[1].split("\nbackend ", 1)[0]
    return [line.strip() for line in section.splitlines() if line.strip().startswith("server ")]


FLEET = [{"name": "fleet-node1", "address": "10.212.12.11", "port": 8000, "agent_port": 8021},
         {"name": "fleet-node2", "address": "10.212.12.12", "port": 8000, "agent_port": 8021},
         {"name": "old node", "address": "fd00::5", "port": 8000}]


def test_backends_with_an_agent_port_get_the_agent_check(tmp_path: Path) -> None:
    lines = server_lines(render(FLEET, tmp_path, gateway_agent_interval=3))
    assert lines == [
        "server fleet-node1 10.212.12.11:8000 agent-check agent-port 8021 agent-inter 3s",
        "server fleet-node2 10.212.12.12:8000 agent-check agent-port 8021 agent-inter 3s",
        "server old_node [fd00::5]:8000",
    ]
    # the affinity backend's servers track these, agent verdict included
    assert server_lines(render(FLEET, tmp_path), "vllm_affinity") == [
        "server fleet-node1 10.212.12.11:8000 track vllm/fleet-node1",
        "server fleet-node2 10.212.12.12:8000 track vllm/fleet-node2",
        "server old_node [fd00::5]:8000 track vllm/old_node",
    ]


def test_the_single_node_default_without_an_agent_gets_none(tmp_path: Path) -> None:
    config = render([{"name": "node", "address": "127.0.0.1", "port": 8000, "agent_port": None}], tmp_path)
    assert server_lines(config) == ["server node 127.0.0.1:8000"]
    assert "agent-check" not in config.split("backend vllm", 1)[1].split("# A backend with an agent_port")[0]


# Two nodes, the first with a LoRA adapter, a model served by both; 40 adapters more on the second and names HAProxy
# must quote (the 404's list of names is one long argument).
MODELS = [{**FLEET[0], "models": ["llama", "llama-sql"]},
          {**FLEET[1], "models": ["org/qwen", "llama"]},
          {**FLEET[2], "models": ['we"ird$HOME%d'] + [f"adapter-{i:02d}" for i in range(40)]}]


def test_backends_with_models_get_a_pool_per_model_each_server_checked_once(tmp_path: Path) -> None:
    config = render(MODELS[:2], tmp_path, gateway_max_body_bytes=2 ** 20)
    assert "backend vllm\n" not in config and "default_backend" not in config
    assert server_lines(config, "model_llama") == [
        "server fleet-node1 10.212.12.11:8000 agent-check agent-port 8021 agent-inter 2s",
        "server fleet-node2 10.212.12.12:8000 no-check track model_org_qwen/fleet-node2",
    ]
    assert server_lines(config, "model_llama-sql") == [
        "server fleet-node1 10.212.12.11:8000 no-check track model_llama/fleet-node1"]
    assert server_lines(config, "model_org_qwen") == [
        "server fleet-node2 10.212.12.12:8000 agent-check agent-port 8021 agent-inter 2s"]
    assert server_lines(config, "model_llama_affinity") == [
        "server fleet-node1 10.212.12.11:8000 track model_llama/fleet-node1",
        "server fleet-node2 10.212.12.12:8000 track model_llama/fleet-node2",
    ]
    # the whole body fits HAProxy's buffer, with 64 KiB for the head; each pool has its admission and health lines
    assert f"tune.bufsize {2 ** 20 + 65536}\n" in config
    assert "{ queue(model_org_qwen_affinity) ge 128 }" in config and "{ nbsrv(model_llama-sql) gt 0 }" in config
    assert "use_backend %[var(txn.pool)]\n" in config


def frontend(config: str) -> list[str]:
    """The frontend's lines, stripped (up to the first backend)."""
    section = config.split("\nfrontend vllm_api\n", 1)[1].split("\nbackend ", 1)[0]
    return [line.strip() for line in section.splitlines()]


def test_priority_is_off_by_default(tmp_path: Path) -> None:
    for backends in (FLEET, MODELS):
        config = render(backends, tmp_path)
        assert "set-priority-class" not in config and "X-Vllm-Priority" not in config


@pytest.mark.parametrize("backends", [FLEET, MODELS], ids=["one pool", "pools per model"])
def test_the_priority_header_sets_the_class_in_the_frontend_before_any_backend(
        tmp_path: Path, backends: list[dict[str, Any]]) -> None:
    """One rule in the frontend (the class is the request's: it holds in every backend it goes to, affinity and
    model pools too), honouring one integer within min..max, compared shifted by 2047 (HAProxy's integer patterns
    cannot be negative); vLLM's header follows the class."""
    lines = frontend(render(backends, tmp_path, gateway_priority_header="X-Prio", gateway_priority_min=-5,
                            gateway_priority_max=3))
    rules = [line for line in lines if line.startswith("http-request set-priority-class")]
    assert rules == ["http-request set-priority-class req.fhdr(X-Prio) if { req.fhdr_cnt(X-Prio) eq 1 } "
                     "{ req.fhdr(X-Prio) -m reg ^-?[0-9]{1,9}$ } { req.fhdr(X-Prio),add(2047) ge 2042 } "
                     "{ req.fhdr(X-Prio),add(2047) le 2050 }"]
    vllm_header = lines.index("http-request set-header X-Vllm-Priority %[prio_class]")
    routing = [i for i, line in enumerate(lines) if line.startswith(("use_backend", "default_backend"))]
    assert routing and lines.index(rules[0]) < vllm_header < min(routing)


@pytest.mark.skipif(shutil.which("haproxy") is None or shutil.which("openssl") is None,
                    reason="needs haproxy and openssl")
@pytest.mark.parametrize(("backends", "settings"), [(FLEET, {}), (MODELS, {}),
                                                    (FLEET, {"gateway_priority_header": "X-Priority"})],
                         ids=["one pool", "pools per model", "priority"])
def test_haproxy_accepts_the_rendered_file(tmp_path: Path, backends: list[dict[str, Any]],
                                           settings: dict[str, Any]) -> None:
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=gateway", "-days", "1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    (tmp_path / "gateway.pem").write_text(cert.read_text() + key.read_text())
    (tmp_path / "keys").write_text("sk-test\n")
    (tmp_path / "models.map").write_text(routing(backends, 1024)["map"])
    (tmp_path / "models.json").write_text('{"object":"list","data":[]}\n')
    config = tmp_path / "haproxy.cfg"
    config.write_text(render(backends, tmp_path, gateway_listen_address="127.0.0.1", gateway_port=18443,
                             **settings))
    proc = subprocess.run(["haproxy", "-c", "-f", str(config)], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "WARNING" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
