"""Several models on one node through playbooks/plan.yml (and site.yml's preflight on the simulated GPU node): the
story's over-committed split (Kimi-K2.5 NVFP4 on 6 of 8 RTX PRO 6000 beside a 70B on 2) is refused in seconds with
each instance's numbers and the fix, before anything changes; a split that fits is accepted and written as the plan
JSON and page. No containers: the controller plans, the simulated node is this machine with the fake nvidia-smi."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from test_plan_refusals import REFUSAL_LINES, assert_one_message, refusal_budget

from harness import playbook
from repo_root import ROOT

NODE = ("-e", "vllm_node_gpu=rtx-pro-6000-blackwell", "-e", "vllm_node_gpu_count=8")
OVERCOMMITTED = [{"name": "kimi", "model": "kimi-k2.5-nvfp4", "gpus": 6},
                 {"name": "llama", "model": "llama-3.1-70b-instruct", "gpus": 2}]
FITS = [{"name": "llama", "model": "llama-3.1-70b-instruct", "gpus": 2},
        {"name": "gptoss", "model": "gpt-oss-120b", "gpus": 4},
        {"name": "qwen-next", "model": "qwen3-next-80b-a3b-instruct", "gpus": 2}]
NEEDLES = ["The instances do not fit 8 x rtx-pro-6000-blackwell",
           "kimi (kimi-k2.5-nvfp4) on GPUs 0,1,2,3,4,5: DOES NOT FIT: GPU too small for the weights",
           "of weights per GPU", "it needs 8 GPU(s)",
           "llama (llama-3.1-70b-instruct) on GPUs 6,7: fits:", "GiB weights", "GiB KV cache per GPU",
           "The smallest split needs 10 GPUs (kimi 8, llama 2) and the node has 8",
           "keep kimi here and serve llama on another node"]
# The split's one message names every instance with its numbers: a few wrapped lines more than one model's.
SPLIT_REFUSAL_LINES = REFUSAL_LINES + 5
GPU_NODE = ROOT / "tests" / "fixtures" / "gpu_node"


def instances(items: list[dict[str, object]]) -> tuple[str, str]:
    return "-e", json.dumps({"vllm_node_instances": items})


def test_plan_refuses_the_storys_split_in_seconds_with_each_instances_numbers(tmp_path: Path) -> None:
    plan_file = tmp_path / "plan.json"
    rc, out, seconds = playbook.run("playbooks/plan.yml", "-e", f"vllm_node_plan_file={plan_file}", *NODE,
                                    *instances(OVERCOMMITTED), timeout=300)
    lines = assert_one_message(rc, out, seconds, NEEDLES, SPLIT_REFUSAL_LINES)
    plan = json.loads(plan_file.read_text())
    assert plan["fits"] is False and [r["name"] for r in plan["instances"]] == ["kimi", "llama"]
    assert plan["instances"][1]["plan"]["fits"] is True and plan["instances"][0]["plan"] is None
    assert 'data-instance="kimi"' in plan_file.with_suffix(".html").read_text()
    print(f"\nsplit refused: rc={rc} in {seconds:.1f} s (budget {refusal_budget():.0f} s), refusal {len(lines)} lines")


def test_plan_accepts_a_split_that_fits(tmp_path: Path) -> None:
    plan_file = tmp_path / "plan.json"
    rc, out, seconds = playbook.run("playbooks/plan.yml", "-e", f"vllm_node_plan_file={plan_file}", *NODE,
                                    *instances(FITS), timeout=300)
    assert rc == 0, out[-3000:]
    plan = json.loads(plan_file.read_text())
    assert plan["fits"] is True and plan["message"] == ""
    groups = [r["gpus"] for r in plan["instances"]]
    assert sorted(g for group in groups for g in group) == list(range(8))
    assert "The split fits 8 x rtx-pro-6000-blackwell" in re.sub(r"\s+", " ", out)
    print(f"\nsplit accepted: rc={rc} in {seconds:.1f} s; groups {groups}")


@pytest.fixture(scope="module")
def simulated_node(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """site.yml's nodes group with this machine as the node (local connection, check mode only), its nvidia-smi
    and lspci the simulated GPU node's."""
    inventory = tmp_path_factory.mktemp("inventory") / "hosts.yml"
    inventory.write_text(json.dumps({"vllm_nodes": {"hosts": {"gpu-node": {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable,
        "node_facts_nvidia_smi": str(GPU_NODE / "nvidia-smi"), "node_facts_lspci": str(GPU_NODE / "lspci"),
        # the GPU health gate reads `nvidia-smi -q -x` on the node; it has its own test (test_preflight_gpu_health.py)
        "vllm_node_gpu_health": False}}}}))
    return inventory


def test_site_refuses_the_split_on_the_simulated_node_before_anything_changes(tmp_path: Path,
                                                                               simulated_node: Path) -> None:
    """The node's GPUs and `nvidia-smi topo -m` come from the simulated node: the 70B's pair shares a PCIe switch
    on NUMA node 1, and the refusal is the same one message, with nothing changed on the node."""
    plan_file = tmp_path / "plan.json"
    rc, out, seconds = playbook.run("playbooks/site.yml", "--check", "-e", f"vllm_node_plan_file={plan_file}",
                                    "-e", "vllm_node_gpu_count=8", *instances(OVERCOMMITTED),
                                    inventory=str(simulated_node), timeout=300,
                                    env=playbook.environment(VLLM_NODE_FAKE_GPUS=str(GPU_NODE / "gpus.json")))
    assert_one_message(rc, out, seconds, NEEDLES[:5], SPLIT_REFUSAL_LINES)
    # the one change is the plan written on the controller (the estimate a refusal leaves behind), none on the node
    assert playbook.changed_tasks(out) == ["preflight : Write the plan JSON"], out[-2000:]
    plan = json.loads((tmp_path / "plan-catalog.json").read_text())   # site's first plan: from the catalog
    assert plan["topology"] == "nvidia-smi topo -m"
    assert plan["instances"][1]["placement"] == "one PCIe switch, NUMA node 1"
