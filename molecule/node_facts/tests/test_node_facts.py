"""node_facts on the simulated GPU node: re-run the role in several cases (tests/dump_facts.yml, one playbook run per
node) and compare its facts with what the node itself says."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness import playbook

DUMP = Path(__file__).resolve().parent / "dump_facts.yml"
VARIANTS = "/etc/vllm-node-fake-gpus.d"


def ansible_playbook(host: Any, path: str, *args: str, all_nodes: bool = False) -> playbook.Run:
    """ansible-playbook from the controller venv against this test's node (or every node of the scenario, in
    parallel), through molecule's own inventory (docker connection)."""
    inventory = host.backend.ansible_inventory
    target = [] if inventory else ["-i", f"{host.backend.host},", "-c", "community.docker.docker"]
    limit = host.backend.host if inventory and not all_nodes else None
    return playbook.run(path, *target, *args, inventory=inventory, limit=limit, timeout=900,
                        env=playbook.environment(drop=("ANSIBLE_CALLBACKS_ENABLED",)))


_RUNS: dict[str, tuple[playbook.Run, Path]] = {}


def node_facts(host: Any, tmp_path_factory: pytest.TempPathFactory, case: str) -> dict[str, Any]:
    """The facts node_facts set in one case of dump_facts.yml (one playbook run for all nodes and cases)."""
    key = host.backend.ansible_inventory or host.backend.host
    if key not in _RUNS:
        out = tmp_path_factory.mktemp("facts")
        _RUNS[key] = (ansible_playbook(host, str(DUMP), "-e", f"facts_dir={out}", all_nodes=True), out)
    proc, out = _RUNS[key]
    assert proc.rc == 0, proc.output
    return json.loads((out / f"{host.backend.host}-{case}.json").read_text())


def fake_gpus(host: Any, name: str = "/etc/vllm-node-fake-gpus.json") -> list[dict[str, Any]]:
    return json.loads(host.file(name).content_string)["gpus"]


def test_default_node_reports_eight_blackwell_gpus_from_nvidia_smi(host: Any, tmp_path_factory: Any) -> None:
    facts = node_facts(host, tmp_path_factory, "default")
    assert facts["node_facts_gpu_source"] == "nvidia-smi"
    assert facts["node_facts_driver_version"] == "580.95.05"
    expected = [{"index": g["index"], "name": g["name"], "memory_total_mib": g["memory_total_mib"],
                 "compute_capability": g["compute_cap"], "pci_bus_id": g["pci_bus_id"],
                 "pci_device_id": g["pci_device_id"]} for g in fake_gpus(host)]
    assert facts["node_facts_gpus"] == expected
    assert len(expected) == 8
    assert {g["memory_total_mib"] for g in expected} == {97887}
    assert {g["compute_capability"] for g in expected} == {"12.0"}
    # The tools on the node must agree with what the role parsed.
    listed = host.check_output("nvidia-smi -L").splitlines()
    assert len(listed) == len(facts["node_facts_gpus"])


def test_os_memory_cpus_and_disk_match_the_node(host: Any, tmp_path_factory: Any) -> None:
    facts = node_facts(host, tmp_path_factory, "default")
    lines = host.file("/etc/os-release").content_string.splitlines()
    os_release = dict(line.split("=", 1) for line in lines if "=" in line)
    assert facts["node_facts_os"]["codename"] == os_release["VERSION_CODENAME"].strip('"')
    assert facts["node_facts_os"]["family"] == "Debian"
    assert facts["node_facts_os"]["distribution"] == {"debian": "Debian", "ubuntu": "Ubuntu"}[os_release["ID"]]
    assert facts["node_facts_os"]["version"].startswith(os_release["VERSION_ID"].strip('"').split(".")[0])
    meminfo = host.file("/proc/meminfo").content_string.split()
    assert facts["node_facts_memory_total_mib"] == int(meminfo[meminfo.index("MemTotal:") + 1]) // 1024
    assert facts["node_facts_cpu_count"] == int(host.check_output("nproc"))
    assert facts["node_facts_cpu_amx"] is ("amx_tile" in host.file("/proc/cpuinfo").content_string.split())
    # /srv/vllm/models does not exist: the nearest existing parent (/srv/vllm, made by prepare) is measured.
    assert not host.file("/srv/vllm/models").exists
    assert facts["node_facts_disk_path"] == "/srv/vllm"
    # Other containers write to the same disk meanwhile: the fact must lie between the readings taken right before
    # and right after the role (dump_facts.yml), give or take 64 MiB; a later df could be off by gigabytes.
    before, after = facts["disk_free_around"]
    slack = 64 * 2**20
    assert min(before, after) - slack <= facts["node_facts_disk_free_bytes"] <= max(before, after) + slack
    assert int(host.check_output("df -B1 --output=avail /srv/vllm | tail -n 1")) > 0


@pytest.mark.parametrize(("case", "source", "count"), [("proprietary", "lspci", 8), ("no-driver", "lspci", 8),
                                                    ("none", "none", 0)])
def test_fallbacks_when_nvidia_smi_cannot_answer(host: Any, tmp_path_factory: Any, case: str, source: str,
                                                 count: int) -> None:
    facts = node_facts(host, tmp_path_factory, case)
    assert facts["node_facts_gpu_source"] == source
    assert len(facts["node_facts_gpus"]) == count
    assert facts["node_facts_driver_version"] == ""
    assert "couldn't communicate with the NVIDIA driver" in facts["node_facts_nvidia_smi_message"]
    if count:
        bus_ids = [g["pci_bus_id"] for g in fake_gpus(host, f"{VARIANTS}/gpus-{case}.json")]
        assert [g["pci_bus_id"] for g in facts["node_facts_gpus"]] == bus_ids
        assert {g["pci_device_id"] for g in facts["node_facts_gpus"]} == {"10de:2bb5"}
        assert all(g["memory_total_mib"] is None and g["compute_capability"] is None for g in facts["node_facts_gpus"])
        assert [g["index"] for g in facts["node_facts_gpus"]] == list(range(count))


def test_no_gpu_tools_at_all(host: Any, tmp_path_factory: Any) -> None:
    """A bare host without pciutils nor a driver: no GPU, no failure."""
    facts = node_facts(host, tmp_path_factory, "no-tools")
    assert (facts["node_facts_gpu_source"], facts["node_facts_gpus"]) == ("none", [])


def test_check_mode_reports_the_same_facts(host: Any, tmp_path_factory: Any) -> None:
    facts = node_facts(host, tmp_path_factory, "check")
    assert facts["node_facts_gpus"] == node_facts(host, tmp_path_factory, "default")["node_facts_gpus"]
    proc = _RUNS[host.backend.ansible_inventory or host.backend.host][0]
    changed = [line for line in proc.output.splitlines()
               if line.startswith("changed:") and "-> localhost" not in line and host.backend.host in line]
    assert changed == [], "node_facts must not change the node, in any case"


def test_relative_model_root_is_refused_before_probing(host: Any, tmp_path: Path) -> None:
    proc = ansible_playbook(host, str(DUMP), "-e", f"facts_dir={tmp_path}", "-e", "node_facts_model_root=models")
    assert proc.rc != 0 and not list(tmp_path.iterdir())
    assert "node_facts_model_root must be an absolute path" in proc.output


def test_probes_changed_nothing(host: Any) -> None:
    assert not host.file("/srv/vllm/models").exists
