"""The lora_adapters_read module run as Ansible runs it (JSON arguments on stdin) on tiny adapters laid out as
model_download leaves them: each downloaded adapter's config and tensor shapes come back in its plan entry (what
the plan checks against the base), its files' hashes for the manifest; one not downloaded yet (check mode) keeps a
bare entry; results of another length are refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import tiny_models
from ansible_collections.vllm_node.vllm_node.plugins.module_utils.lora_adapters import adapter_metadata
from ansible_collections.vllm_node.vllm_node.plugins.modules import lora_adapters_read
from repo_root import ROOT

MODULE = Path(lora_adapters_read.__file__)
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def run_read(args: dict[str, Any], check: bool = False) -> dict[str, Any]:
    """The module's JSON answer for these arguments (collections/ on the path, as Ansible ships module_utils)."""
    payload = {"ANSIBLE_MODULE_ARGS": dict(args, _ansible_check_mode=check)}
    env = dict(os.environ, PYTHONPATH=str(ROOT / "collections"))
    proc = subprocess.run([sys.executable, str(MODULE)], input=json.dumps(payload), capture_output=True, text=True,
                          check=False, timeout=60, env=env)
    return json.loads(proc.stdout)


def inventory(name: str) -> dict[str, str]:
    return {"name": name, "repository": f"vllm-node-test/{name}", "revision": COMMIT, "base": "tiny-llama"}


@pytest.fixture
def downloaded(tmp_path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Two adapters: a1 downloaded into its revision directory and sealed by this run; a2 not downloaded yet."""
    repo = tiny_models.write_adapter(tmp_path / "hub", "a1", "tiny-llama")
    revision = tmp_path / "lora/vllm-node-test/a1/revisions" / COMMIT
    revision.parent.mkdir(parents=True)
    repo.rename(revision)
    download = {"model_download_commit": COMMIT, "model_download_dir": str(revision), "model_download_files": []}
    seal = {"model_download_complete": True, "model_download_file_sha256": {"adapter_config.json": "c" * 64,
                                                                            "README.md": "r" * 64},
            "model_download_manifest_sha256": "m" * 64}
    return [inventory("a1"), inventory("a2")], [download, {}], [seal, {}]


def test_a_downloaded_adapter_gets_its_config_shapes_and_hashes_and_the_plan_checks_it(downloaded) -> None:
    adapters, downloads, seals = downloaded
    res = run_read({"adapters": adapters, "downloads": downloads, "seals": seals})
    assert res["changed"] is False, res
    a1, a2 = res["entries"]
    assert a1["config"]["r"] == 8 and a1["config"]["peft_type"] == "LORA"
    assert a1["shapes"]["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"] == [8, 64]
    assert a2 == inventory("a2"), "an adapter not downloaded yet keeps its bare entry"
    files = res["adapters"][0]
    assert (files["dir"], files["commit"], files["complete"]) == (downloads[0]["model_download_dir"], COMMIT, True)
    assert list(files["files"]) == ["README.md", "adapter_config.json"] and files["files_sha256"] == "m" * 64
    assert res["adapters"][1]["dir"] is None and res["adapters"][1]["files"] == {}
    # what the plan checks against the base (tests/unit/plugins/module_utils/sizing/test_lora.py)
    assert {k: a1[k] for k in ("config", "shapes")} == adapter_metadata(Path(downloads[0]["model_download_dir"]))


def test_results_of_another_length_are_refused(downloaded) -> None:
    adapters, downloads, _ = downloaded
    res = run_read({"adapters": adapters, "downloads": downloads, "seals": []})
    assert res["failed"] is True
    assert "2 adapters but 2 downloads and 0 seals" in res["msg"]


def test_a_directory_without_an_adapter_s_weights_fails_with_the_fix(tmp_path: Path) -> None:
    (tmp_path / "adapter_config.json").write_text("{}")
    res = run_read({"adapters": [inventory("x")], "downloads": [{"model_download_dir": str(tmp_path)}],
                    "seals": [{}]})
    assert res["failed"] is True
    assert f"adapter x: cannot read its files in {tmp_path}" in res["msg"]
    assert "adapter_model.safetensors" in res["msg"]

