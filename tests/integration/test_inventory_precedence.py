"""Every value a user sets anywhere in an inventory wins over the project's defaults, in what the node runs.

The knobs are role defaults of roles/vllm_node (the lowest precedence). Each case builds a throwaway inventory in
tmp_path with the user's value in ONE place (group_vars/all/*.yml, a vaulted group_vars/all/vault.yml,
group_vars/vllm_nodes.yml, host_vars/<host>.yml, -e), runs the real roles (tests/integration/playbooks/
render_service.yml: vllm_node -> preflight -> vllm_service, not started) against a throwaway systemd container and
reads the unit and env file vllm_service wrote there. A negative control without the user's value shows the
default (port 8000, a generated key), so the checks can fail.
"""
from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness import playbook

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv" / "bin"
PLAYBOOK = ROOT / "tests/integration/playbooks/render_service.yml"
IMAGE = "local/debian-systemd:bookworm"
DOCKER = shutil.which("docker") or "/usr/bin/docker"
UNIT, ENV_FILE = "/etc/systemd/system/vllm.service", "/etc/vllm/vllm.env"
# Vaulted secrets: distinctive strings, so their absence from the playbook output means something.
VAULT_API_KEY = "sk-vaulted-" + "7Qm2x9Lk4Rw8Tz1Vb6Nc3Hd5"
VAULT_HF_TOKEN = "hf_vaulted_" + "Pq8Ws2Ez6Rt4Yu1Io9Ap3Sd7"
# The demo's serving settings: CPU build, the tiny test Llama (merged from the fixture catalog like a user model).
BASE = {"vllm_node_model": "tiny-llama", "vllm_node_gpu": "cpu", "vllm_node_gpu_count": 1,
        "vllm_node_vllm_version": "0.32.0", "vllm_node_vllm_variant": "cpu", "vllm_node_max_model_len": 4096}


def docker(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([DOCKER, *args], capture_output=True, text=True, check=check, timeout=120)


@pytest.fixture(scope="module")
def node() -> Iterator[str]:
    """One systemd container for the module; `/opt/vllm/current/bin/python` stands in for the venv's python
    so that systemd-analyze verify accepts the unit's ExecStart."""
    # Not skipped when missing: a green run must have rendered the unit (make integration builds the image first).
    assert docker("image", "inspect", IMAGE, check=False).returncode == 0, f"needs the {IMAGE} base image: make images"
    name = f"precedence-{uuid.uuid4().hex[:8]}"
    docker("run", "-d", "--name", name, "--hostname", name, "--cap-add", "SYS_ADMIN", "--security-opt",
           "seccomp=unconfined", "--cgroupns", "host", "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw", "--tmpfs", "/run",
           "--tmpfs", "/run/lock", "--tmpfs", "/tmp", "--stop-signal", "SIGRTMIN+3", IMAGE, "/lib/systemd/systemd")
    try:
        deadline = time.monotonic() + 60
        while docker("exec", name, "systemctl", "is-system-running", check=False).stdout.strip() not in (
                "running", "degraded"):
            assert time.monotonic() < deadline, "systemd did not come up in the container"
            time.sleep(1)
        docker("exec", name, "sh", "-c",
               "mkdir -p /opt/vllm/current/bin && ln -sf /usr/bin/python3 /opt/vllm/current/bin/python")
        yield name
    finally:
        docker("rm", "-f", name, check=False)


@dataclass
class Rendered:
    rc: int
    out: str
    unit: str
    env: str

    def argv(self) -> list[str]:
        """ExecStart's arguments, unquoted (the template double-quotes each and continues lines with '\\')."""
        match = re.search(r"^ExecStart=(.*?)(?<!\\)$", self.unit, re.M | re.S)
        assert match, self.unit
        return [re.sub(r"\\(.)", r"\1", arg) for arg in re.findall(r'"((?:[^"\\]|\\.)*)"', match.group(1))]

    def flag(self, name: str) -> str:
        argv = self.argv()
        return argv[argv.index(name) + 1]

    def api_key(self) -> str:
        return re.search(r"^VLLM_API_KEY=(.*)$", self.env, re.M).group(1)

    def token_digest(self) -> str:
        return re.search(r"model_download_token sha256=([0-9a-f]{64})", self.out).group(1)


def write_yaml(path: Path, data: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("---\n" + yaml.safe_dump(data, sort_keys=False))
    return path


def inventory(tmp_path: Path, host: str) -> Path:
    """A user's inventory: the host, the serving settings and the test models (as their own extra models)."""
    inv = tmp_path / "inventory"
    write_yaml(inv / "hosts.yml", {"all": {"children": {"vllm_nodes": {"hosts": {
        host: {"ansible_connection": "community.docker.docker"}}}}}})
    write_yaml(inv / "group_vars/all/serving.yml", {**BASE, "vllm_node_plan_file": str(tmp_path / "plan.json")})
    shutil.copy(ROOT / "tests/fixtures/catalog/models.yml", inv / "group_vars/all/models.yml")
    return inv


def render(node: str, inv: Path, *args: str) -> Rendered:
    """Fresh node state (no unit, no /etc/vllm), then the playbook; returns its output and the files written."""
    docker("exec", node, "sh", "-c", f"rm -rf /etc/vllm {UNIT} {UNIT}.*")
    # Pipelining: one `docker exec` per task instead of three (the module files are not copied in).
    rc, out, _ = playbook.run(PLAYBOOK, "--diff", "-v", *args, inventory=str(inv), timeout=600,
                              env=playbook.environment(ANSIBLE_PIPELINING="1"))
    unit = docker("exec", node, "cat", UNIT, check=False).stdout
    env_file = docker("exec", node, "cat", ENV_FILE, check=False).stdout
    return Rendered(rc, out, unit, env_file)


def vault(tmp_path: Path, path: Path) -> Path:
    """Encrypt `path` in place with ansible-vault; returns the password file."""
    password = tmp_path / "vault-password"
    password.write_text("correct horse battery staple\n")
    subprocess.run([str(BIN / "ansible-vault"), "encrypt", "--vault-password-file", str(password), str(path)],
                   check=True, capture_output=True, text=True)
    assert path.read_text().startswith("$ANSIBLE_VAULT;")
    return password


def test_without_a_user_value_the_defaults_are_rendered(node: str, tmp_path: Path) -> None:
    """Negative control: the product default port and a key generated on the node."""
    run = render(node, inventory(tmp_path, node))
    assert run.rc == 0, run.out[-3000:]
    assert run.flag("--port") == "8000"
    assert run.flag("--served-model-name") == "vllm-node-test/tiny-llama"
    assert run.api_key().startswith("sk-vllm-") and run.api_key() != VAULT_API_KEY
    assert run.token_digest() == hashlib.sha256(b"").hexdigest()


@pytest.mark.parametrize(("where", "port"), [
    ("group_vars/all/site.yml", 9000),
    ("group_vars/vllm_nodes.yml", 9001),
    ("host_vars/{host}.yml", 9002),
])
def test_a_port_set_in_the_inventory_is_rendered(node: str, tmp_path: Path, where: str, port: int) -> None:
    inv = inventory(tmp_path, node)
    write_yaml(inv / where.format(host=node), {"vllm_node_port": port, "vllm_node_served_model_name": f"mine-{port}"})
    run = render(node, inv)
    assert run.rc == 0, run.out[-3000:]
    assert run.flag("--port") == str(port)
    assert run.flag("--served-model-name") == f"mine-{port}"
    assert f":{port}/health" in run.unit, "the health waiter probes the user's port"


def test_extra_vars_are_rendered(node: str, tmp_path: Path) -> None:
    run = render(node, inventory(tmp_path, node), "-e", "vllm_node_port=9003", "-e", "vllm_node_listen_address=0.0.0.0")
    assert run.rc == 0, run.out[-3000:]
    assert (run.flag("--port"), run.flag("--host")) == ("9003", "0.0.0.0")


def test_vaulted_secrets_in_group_vars_all_are_used_and_never_printed(node: str, tmp_path: Path) -> None:
    """The case the old playbook group_vars silently broke: a vaulted key and token in group_vars/all."""
    inv = inventory(tmp_path, node)
    secret = write_yaml(inv / "group_vars/all/vault.yml",
                        {"vllm_node_api_key": VAULT_API_KEY, "vllm_node_hf_token": VAULT_HF_TOKEN})
    password = vault(tmp_path, secret)
    run = render(node, inv, "--vault-password-file", str(password))
    assert run.rc == 0, run.out[-3000:]
    assert run.api_key() == VAULT_API_KEY
    assert docker("exec", node, "cat", "/etc/vllm/api-key").stdout.strip() == VAULT_API_KEY
    assert run.token_digest() == hashlib.sha256(VAULT_HF_TOKEN.encode()).hexdigest()
    # no_log: neither secret appears in the output of a verbose --diff run, nor in the world-readable unit.
    assert VAULT_API_KEY not in run.out and VAULT_HF_TOKEN not in run.out
    assert VAULT_API_KEY not in run.unit and VAULT_HF_TOKEN not in run.unit
    assert not re.search(r"^Environment=.*VLLM_API_KEY", run.unit, re.M), "the key goes to the 0600 EnvironmentFile"


def test_the_key_is_made_once_then_kept_and_a_given_key_replaces_it(node: str, tmp_path: Path) -> None:
    """vllm_service decides the key once: the first run makes and keeps one (no shell on the node); the next run reads
    it back and changes nothing; a given key replaces it and is kept when the inventory stops giving it; --check on a
    node without a key file (the account already there) makes one and writes nothing."""
    inv = inventory(tmp_path, node)
    first = render(node, inv)
    assert first.rc == 0, first.out[-3000:]
    key = first.api_key()
    assert re.fullmatch(r"sk-vllm-[A-Za-z0-9]{43}", key), key
    assert key not in first.out
    assert docker("exec", node, "stat", "-c", "%U:%G %a", "/etc/vllm/api-key").stdout.strip() == "root:root 600"
    assert docker("exec", node, "cat", "/etc/vllm/api-key").stdout == key + "\n"

    def again(*args: str) -> playbook.Run:
        """The playbook on the node as it is (no reset)."""
        return playbook.run(PLAYBOOK, "--diff", *args, inventory=str(inv), timeout=600,
                            env=playbook.environment(ANSIBLE_PIPELINING="1"))

    second = again()
    assert second.rc == 0 and playbook.recap(second.output, node)["changed"] == 0, second.output[-3000:]
    assert docker("exec", node, "cat", "/etc/vllm/api-key").stdout == key + "\n"

    given = again("-e", "vllm_node_api_key=sk-given-0123456789abcdef")
    # the key file and the env file
    assert given.rc == 0 and playbook.recap(given.output, node)["changed"] >= 2, given.output[-3000:]
    assert "sk-given-0123456789abcdef" not in given.output
    assert docker("exec", node, "cat", "/etc/vllm/api-key").stdout == "sk-given-0123456789abcdef\n"
    assert "VLLM_API_KEY=sk-given-0123456789abcdef" in docker("exec", node, "cat", ENV_FILE).stdout

    kept = again()
    assert kept.rc == 0 and playbook.recap(kept.output, node)["changed"] == 0, kept.output[-3000:]
    assert docker("exec", node, "cat", "/etc/vllm/api-key").stdout == "sk-given-0123456789abcdef\n"

    checked = render(node, inv, "--check")   # /etc/vllm and the unit removed first
    assert checked.rc == 0, checked.out[-3000:]
    assert docker("exec", node, "test", "-e", "/etc/vllm/api-key", check=False).returncode == 1, "check mode wrote"
    assert "sk-vllm-" not in checked.out, "the key is no_log"
