"""The node's GPU watch: the verdict file the timer writes and the agent-check line HAProxy reads from it; the two
files run as the node runs them (copied side by side, plain python3) against the simulated GPU tools."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ansible_collections.vllm_node.vllm_node.plugins.module_utils import gpu_health as gh
from ansible_collections.vllm_node.vllm_node.plugins.module_utils import gpu_watch as gw
from repo_root import ROOT

HEALTH = ROOT / "tests" / "fixtures" / "gpu_health"
GPU_NODE = ROOT / "tests" / "fixtures" / "gpu_node"
MODULE_UTILS = ROOT / "plugins" / "module_utils"


def document(xml: str, log: str = "kern-clean.log", accepted: tuple[str, ...] = ()) -> dict:
    report = gh.evaluate((HEALTH / xml).read_text(), (HEALTH / log).read_text(), accepted=accepted)
    return gw.verdict_document(report, 1765000000.0)


def test_no_verdict_a_pass_and_a_warn_answer_up() -> None:
    assert gw.agent_reply(None) == "up"
    assert gw.agent_reply({}) == "up"
    assert gw.agent_reply(document("h100-healthy.xml")) == "up"
    warned = document("rtx-pro-6000-gen-loaded.xml")
    assert warned["verdict"] == "WARN" and gw.agent_reply(warned) == "up"


@pytest.mark.parametrize(("xml", "log", "code"), [
    ("h100-healthy.xml", "kern-xid79.log", "xid_79"),
    ("h100-remap-pending.xml", "kern-clean.log", "remap_pending"),
    ("h200-ecc-uncorrectable.xml", "kern-clean.log", "ecc_uncorrectable"),
    ("b200-pcie-x8.xml", "kern-clean.log", "pcie_width_degraded"),
    ("rtx-pro-6000-thermal.xml", "kern-clean.log", "hw_thermal_slowdown"),
])
def test_a_fail_answers_down_naming_the_gpu_and_the_code(xml: str, log: str, code: str) -> None:
    reply = gw.agent_reply(document(xml, log))
    assert reply.startswith("down #GPU health FAIL: GPU 1 (serial ")
    assert "bus 0000:28:00.0): " in reply and code in reply
    assert "," not in reply and "\n" not in reply and len(reply) <= len("down #") + gw.DESCRIPTION_MAX
    assert "GPU 0 " not in reply


def test_a_node_failure_without_a_gpu_is_named() -> None:
    report = gh.evaluate(None)
    doc = gw.verdict_document(report, 0.0)
    assert doc["reason"] == "node: nvidia_smi_failed"
    assert gw.agent_reply(doc) == "down #GPU health FAIL: node: nvidia_smi_failed"


def test_an_unsafe_reason_is_cleaned() -> None:
    reply = gw.agent_reply({"verdict": "FAIL", "reason": "a,b\nc#d" + "x" * 500})
    assert reply.startswith("down #GPU health FAIL: a;b c d") and len(reply) == len("down #") + gw.DESCRIPTION_MAX


def test_unreadable_verdict_files_read_as_none(tmp_path: Path) -> None:
    assert gw.read_document(str(tmp_path / "absent.json")) is None
    (tmp_path / "bad.json").write_text("{not json")
    assert gw.read_document(str(tmp_path / "bad.json")) is None
    (tmp_path / "list.json").write_text("[]")
    assert gw.read_document(str(tmp_path / "list.json")) is None


def node(tmp_path: Path, xml: str, log: str) -> dict[str, str]:
    """The watch as installed on a node (two files side by side) and the simulated tools on PATH."""
    lib = tmp_path / "lib"
    lib.mkdir(exist_ok=True)
    for name in ("gpu_watch.py", "gpu_health.py"):
        shutil.copy(MODULE_UTILS / name, lib / name)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in ("nvidia-smi", "dmesg"):
        if not (bin_dir / tool).exists():
            (bin_dir / tool).symlink_to(GPU_NODE / tool)
    for name in (xml, log):
        shutil.copy(HEALTH / name, tmp_path / name)
    data = json.loads((GPU_NODE / "gpus.json").read_text())
    (tmp_path / "gpus.json").write_text(json.dumps(dict(data, smi_xml=xml, kernel_log=log)))
    return dict(os.environ, PATH=f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin",
                VLLM_NODE_FAKE_GPUS=str(tmp_path / "gpus.json"))


def watch(tmp_path: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """python3 gpu_watch.py ARGS with the copied files only (the collection is not importable there)."""
    return subprocess.run([sys.executable, "-E", "-s", str(tmp_path / "lib" / "gpu_watch.py"), *args], env=env,
                          capture_output=True, text=True, timeout=60, check=False)


def test_the_installed_watch_goes_down_on_an_xid_and_comes_back_when_cleared(tmp_path: Path) -> None:
    verdict = str(tmp_path / "verdict.json")
    env = node(tmp_path, "rtx-pro-6000-healthy.xml", "kern-clean.log")
    checked = watch(tmp_path, env, "check", "--out", verdict, "--kernel-log", "dmesg")
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout == "GPU health PASS\n"
    assert watch(tmp_path, env, "answer", "--verdict", verdict).stdout == "up\n"
    env = node(tmp_path, "rtx-pro-6000-healthy.xml", "kern-xid79.log")
    checked = watch(tmp_path, env, "check", "--out", verdict, "--kernel-log", "dmesg")
    assert "GPU health FAIL: GPU 1 (serial 1792525000001, bus 0000:28:00.0): xid_79" in checked.stdout
    answer = watch(tmp_path, env, "answer", "--verdict", verdict).stdout
    assert answer == "down #GPU health FAIL: GPU 1 (serial 1792525000001; bus 0000:28:00.0): xid_79\n"
    again = watch(tmp_path, env, "check", "--out", verdict, "--kernel-log", "dmesg")
    assert again.stdout == "", "an unchanged verdict is not logged again"
    env = node(tmp_path, "rtx-pro-6000-healthy.xml", "kern-clean.log")
    watch(tmp_path, env, "check", "--out", verdict, "--kernel-log", "dmesg")
    assert watch(tmp_path, env, "answer", "--verdict", verdict).stdout == "up\n"
    assert json.loads(Path(verdict).read_text())["verdict"] == "PASS"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".verdict-")) == []


def test_accepted_codes_and_a_missing_nvidia_smi(tmp_path: Path) -> None:
    verdict = str(tmp_path / "verdict.json")
    env = node(tmp_path, "rtx-pro-6000-gen-loaded.xml", "kern-clean.log")
    watch(tmp_path, env, "check", "--out", verdict, "--kernel-log", "dmesg", "--accept", "pcie_gen_degraded")
    assert json.loads(Path(verdict).read_text())["verdict"] == "PASS"
    checked = watch(tmp_path, env, "check", "--out", verdict, "--kernel-log", "dmesg",
                    "--nvidia-smi", str(tmp_path / "no-such-tool"))
    assert checked.returncode == 0
    assert watch(tmp_path, env, "answer", "--verdict", verdict).stdout.startswith(
        "down #GPU health FAIL: node: nvidia_smi_failed")
