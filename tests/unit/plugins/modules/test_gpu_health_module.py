"""The gpu_health module against the simulated node's fake nvidia-smi and fake journalctl/dmesg/dcgmi."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from ansible.module_utils.testing import patch_module_args

from ansible_collections.vllm_node.vllm_node.plugins.modules import gpu_health as mod
from repo_root import ROOT

TESTS = ROOT / "tests"
HEALTH = TESTS / "fixtures" / "gpu_health"
NODE = TESTS / "fixtures" / "gpu_node"


def fake_node(tmp_path: Path, smi_xml: str | None, kernel_log: str | None, dmesg: str | None = None,
              dcgm: str | None = None, driver_loaded: bool = True) -> dict[str, str]:
    """A bin directory with the fixture nvidia-smi and shell stand-ins; returns the environment to run in."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    shutil.copy(NODE / "nvidia-smi", bin_dir / "nvidia-smi")
    data = json.loads((NODE / "gpus.json").read_text())
    data["driver_loaded"] = driver_loaded
    if smi_xml:
        shutil.copy(HEALTH / smi_xml, tmp_path / smi_xml)
        data["smi_xml"] = smi_xml
    (tmp_path / "gpus.json").write_text(json.dumps(data))
    for name, fixture in (("journalctl", kernel_log), ("dmesg", dmesg), ("dcgmi", dcgm)):
        script = bin_dir / name
        if fixture is None:
            script.write_text("#!/bin/sh\necho 'No journal files were found.' >&2\nexit 1\n")
        else:
            script.write_text(f"#!/bin/sh\ncat '{HEALTH / fixture}'\n")
        script.chmod(0o755)
    (bin_dir / "nvidia-smi").chmod(0o755)
    return dict(os.environ, PATH=f"{bin_dir}:/usr/bin:/bin", VLLM_NODE_FAKE_GPUS=str(tmp_path / "gpus.json"))


def runner(env: dict[str, str]) -> mod.Runner:
    def run(argv: list[str]) -> tuple[int, str, str]:
        try:
            proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=False)
        except OSError as err:
            return 127, "", str(err)
        return proc.returncode, proc.stdout, proc.stderr
    return run


def test_fake_nvidia_smi_answers_q_x_from_the_data_file(tmp_path: Path) -> None:
    env = fake_node(tmp_path, "b200-healthy.xml", "kern-clean.log")
    proc = subprocess.run(["nvidia-smi", "-q", "-x"], env=env, capture_output=True, text=True, check=False)
    assert proc.returncode == 0 and proc.stdout == (HEALTH / "b200-healthy.xml").read_text()
    bare = fake_node(tmp_path / "bare", None, None)
    proc = subprocess.run(["nvidia-smi", "-q", "-x"], env=bare, capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and "not simulated" in proc.stdout


def test_xid_79_from_journalctl_fails_the_gpu_with_the_refusal(tmp_path: Path) -> None:
    result = mod.check(runner(fake_node(tmp_path, "h100-healthy.xml", "kern-xid79.log")))
    assert result["kernel_log_source"] == "journalctl"
    assert result["verdict"] == "FAIL" and [g["verdict"] for g in result["gpus"]] == ["PASS", "FAIL"]
    assert "GPU 1 (serial 1654723000001, bus 0000:28:00.0): Xid 79" in result["refusal"]


def test_dmesg_is_the_fallback_and_a_healthy_node_passes(tmp_path: Path) -> None:
    result = mod.check(runner(fake_node(tmp_path, "rtx-pro-6000-healthy.xml", None, dmesg="kern-clean.log")))
    assert result["kernel_log_source"] == "dmesg"
    assert result["verdict"] == "PASS" and result["refusal"] is None and result["node_findings"] == []


def test_no_kernel_log_is_an_acceptable_warning(tmp_path: Path) -> None:
    env = fake_node(tmp_path, "h200-healthy.xml", None)
    result = mod.check(runner(env))
    assert result["verdict"] == "WARN" and result["node_findings"][0]["code"] == "unknown_xid_events"
    assert mod.check(runner(env), accepted=["unknown_xid_events"])["verdict"] == "PASS"


def test_driver_down_and_dcgm_diag(tmp_path: Path) -> None:
    down = mod.check(runner(fake_node(tmp_path, "h100-healthy.xml", "kern-clean.log", driver_loaded=False)))
    assert down["verdict"] == "FAIL" and "couldn't communicate with the NVIDIA driver" in down["refusal"]
    assert [f["code"] for f in down["node_findings"]] == ["nvidia_smi_failed"]
    env = fake_node(tmp_path / "dcgm", "h100-healthy.xml", "kern-clean.log", dcgm="dcgm-diag-r1-fail.txt")
    assert mod.check(runner(env))["verdict"] == "PASS", "dcgmi runs only when asked"
    asked = mod.check(runner(env), dcgm_diag=True)
    assert asked["verdict"] == "FAIL" and "dcgm_page_retirement_row_remap" in asked["refusal"]


@pytest.mark.parametrize("check_mode", [False, True])
def test_the_module_is_read_only_and_reports_per_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str], check_mode: bool) -> None:
    env = fake_node(tmp_path, "b200-pcie-x8.xml", "kern-clean.log")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    args = {"accepted_warnings": ["persistence_mode_off"], "_ansible_check_mode": check_mode}
    with patch_module_args(args), pytest.raises(SystemExit) as exit_info:
        mod.main()
    assert exit_info.value.code == 0
    result = json.loads(capsys.readouterr().out)
    assert result["changed"] is False and result["verdict"] == "FAIL"
    assert result["gpus"][1]["findings"][0]["code"] == "pcie_width_degraded"
    assert "x8" in result["refusal"] and "reseat the GPU" in result["refusal"]


def test_a_missing_nvidia_smi_is_a_failure_not_a_crash(tmp_path: Path) -> None:
    env = fake_node(tmp_path, "h100-healthy.xml", "kern-clean.log")
    result = mod.check(runner(env), nvidia_smi=str(tmp_path / "nowhere" / "nvidia-smi"))
    assert result["verdict"] == "FAIL" and result["node_findings"][0]["code"] == "nvidia_smi_failed"
