"""The preflight's platform check (filter vllm_platform_check): the node's Python must have a lock of the release,
and the driver branch must run the lock's CUDA major. The catalog and the branch table are the shipped ones
(roles/vllm_node/vars/main/), plus hand-made entries for the edges."""
from __future__ import annotations

import pytest
import yaml

from ansible_collections.vllm_node.vllm_node.plugins.filter.vllm_platform import (
    branch_cuda,
    first_branch_for,
    vllm_platform_check,
)
from ansible_collections.vllm_node.vllm_node.plugins.module_utils.filter_errors import AnsibleFilterError
from repo_root import ROOT

VARS = ROOT / "roles" / "vllm_node" / "vars" / "main"
CATALOG = yaml.safe_load((VARS / "vllm_locks.yml").read_text())["vllm_node_vllm_locks"]
TABLE = yaml.safe_load((VARS / "platforms.yml").read_text())["vllm_node_driver_cuda"]


@pytest.mark.parametrize(("branch", "cuda"), [(570, "12.8"), (575, "12.9"), (579, "12.9"), (580, "13.0"),
                                              (595, "13.1"), (615, "13.3"), (500, None)])
def test_a_branch_runs_the_cuda_of_the_highest_listed_branch_below_it(branch, cuda):
    assert branch_cuda(branch, TABLE) == cuda


def test_the_first_branch_for_a_cuda_major():
    assert (first_branch_for(12, TABLE), first_branch_for(13, TABLE), first_branch_for(14, TABLE)) == (535, 580, None)


def test_the_default_branch_and_each_lock_pass():
    for python in ("3.11", "3.12", "3.13"):
        result = vllm_platform_check(CATALOG, "0.33.0", "cuda", python, "x", 580, TABLE)
        assert result["problems"] == []
        assert result["lock"]["file"] == f"vllm-0.33.0-cuda-py{python}.txt" and result["driver_cuda"] == "13.0"


def test_branch_570_is_refused_naming_both_versions_and_the_fix():
    result = vllm_platform_check(CATALOG, "0.33.0", "cuda", "3.12", "Ubuntu 24.04", 570, TABLE)
    assert result["problems"] == [
        "driver branch 570 supports CUDA up to 12.8; the vLLM 0.33.0 CUDA lock for Python 3.12 needs CUDA 13 "
        "(nvidia-cuda-runtime 13.0.96, torch 2.14.0): set nvidia_driver_branch to 580 or newer."]


def test_a_cuda_12_lock_runs_on_branch_570():
    catalog = {"0.20.0-cuda": {"requires_python": ">=3.9", "pythons": {
        "3.12": {"file": "f.txt", "cuda_major": 12, "cuda_runtime": "12.8.90", "torch": "2.8.0"}}}}
    assert vllm_platform_check(catalog, "0.20.0", "cuda", "3.12", "", 570, TABLE)["problems"] == []
    assert "driver branch 550 supports CUDA up to 12.4" not in " ".join(
        vllm_platform_check(catalog, "0.20.0", "cuda", "3.12", "", 550, TABLE)["problems"])


def test_a_branch_older_than_the_table_and_a_cuda_no_branch_runs():
    old = vllm_platform_check(CATALOG, "0.33.0", "cuda", "3.12", "", 470, TABLE)["problems"][0]
    assert old.startswith("driver branch 470 is older than every branch the table knows (oldest 535);")
    catalog = {"9.0.0-cuda": {"pythons": {"3.12": {"file": "f", "cuda_major": 14, "cuda_runtime": "14.0.1"}}}}
    new = vllm_platform_check(catalog, "9.0.0", "cuda", "3.12", "", 610, TABLE)["problems"][0]
    assert "supports CUDA up to 13.3" in new and "no known driver branch runs CUDA 14" in new


def test_a_python_without_a_lock_names_the_release_requirement():
    result = vllm_platform_check(CATALOG, "0.33.0", "cuda", "3.10", "Ubuntu 22.04", 580, TABLE)
    assert result["lock"] is None and len(result["problems"]) == 1
    assert result["problems"][0].startswith(
        "the vLLM 0.33.0 CUDA build has no lock for Python 3.10 (Ubuntu 22.04): vLLM 0.33.0 requires Python "
        "<3.15,>=3.11, locks exist for Python 3.11, 3.12, 3.13.")


def test_what_is_not_checked():
    # an unknown Python (planning on the controller) checks every lock of the release against the driver
    assert vllm_platform_check(CATALOG, "0.33.0", "cuda", "", "", 580, TABLE)["problems"] == []
    assert len(vllm_platform_check(CATALOG, "0.33.0", "cuda", "", "", 570, TABLE)["problems"]) == 1
    # the cpu build needs no driver; a release the catalog does not know is vllm_env's to check; no branch given
    assert vllm_platform_check(CATALOG, "0.32.0", "cpu", "3.11", "", 470, TABLE)["problems"] == []
    assert vllm_platform_check(CATALOG, "0.32.0", "cpu", "3.12", "", 580, TABLE)["problems"] != []
    assert vllm_platform_check(CATALOG, "9.9.9", "cuda", "3.10", "", 470, TABLE) == {
        "lock": None, "driver_cuda": None, "problems": []}
    assert vllm_platform_check(CATALOG, "0.33.0", "cuda", "3.12", "", None, TABLE)["problems"] == []


def test_bad_input_is_a_clear_error():
    with pytest.raises(AnsibleFilterError, match="vllm_platform_check: the lock catalog's entry 1.0.0-cuda has no "
                       "'pythons' mapping: regenerate"):
        vllm_platform_check({"1.0.0-cuda": {}}, "1.0.0", "cuda", "3.12", "", 580, TABLE)
