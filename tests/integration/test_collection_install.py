"""The collection builds, installs and runs outside the checkout: `ansible-galaxy collection build` into tmp,
`ansible-galaxy collection install` into a tmp collections path, then the installed playbook
`vllm_node.vllm_node.plan` by FQCN from a tmp directory without the repository's ansible.cfg."""
from __future__ import annotations

import json
import os
import re
import subprocess
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from harness import playbook

ROOT = Path(__file__).resolve().parents[2]
BIN = ROOT / ".venv" / "bin"
STORY = ("-e", "vllm_node_model=kimi-k2.5-nvfp4", "-e", "vllm_node_gpu=rtx-pro-6000-blackwell",
         "-e", "vllm_node_gpu_count=8", "-e", "vllm_node_kv_cache_dtype=bfloat16",
         "-e", "vllm_node_gpu_memory_utilization=0.95")
REFUSAL = ("bf16 KV needs 17.16 GiB per GPU for 262,144 tokens; 10.81 GiB is available. Use fp8 KV (supported on "
           "SM120 from vLLM 0.18.0), or --decode-context-parallel-size 2, or lower max-model-len to 131,072")


@dataclass
class Installed:
    tarball: Path
    collections: Path
    workdir: Path


def clean_env(tmp: Path, collections: Path) -> dict[str, str]:
    """No ANSIBLE_* from the caller (the repository's ansible.cfg, roles or collections path), only the tmp tree."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(PATH=f"{BIN}:{os.environ['PATH']}", HOME=str(tmp / "home"), ANSIBLE_COLLECTIONS_PATH=str(collections),
               ANSIBLE_NOCOLOR="1", ANSIBLE_FORCE_COLOR="0")
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    tmp = tmp_path_factory.mktemp("collection")
    (tmp / "home").mkdir()
    collections, workdir, dist = tmp / "collections", tmp / "work", tmp / "dist"
    workdir.mkdir()
    env = clean_env(tmp, collections)
    build = subprocess.run([str(BIN / "ansible-galaxy"), "collection", "build", "--output-path", str(dist), str(ROOT)],
                           cwd=workdir, env=env, capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    (tarball,) = dist.glob("vllm_node-vllm_node-*.tar.gz")
    install = subprocess.run([str(BIN / "ansible-galaxy"), "collection", "install", str(tarball),
                              "-p", str(collections)],
                             cwd=workdir, env=env, capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stdout + install.stderr
    yield Installed(tarball, collections, workdir)


def installed_plan(installed: Installed, tmp_path: Path, *args: str) -> tuple[int, str, dict | None]:
    """The installed collection's plan playbook by FQCN, from its work directory with the clean environment."""
    plan_file = tmp_path / "plan.json"
    rc, out, _ = playbook.run("vllm_node.vllm_node.plan", "-e", f"vllm_node_plan_file={plan_file}", *args,
                              cwd=installed.workdir, env=clean_env(installed.collections.parent, installed.collections),
                              timeout=300)
    data = json.loads(plan_file.read_text()) if plan_file.exists() else None
    return rc, re.sub(r"\s+", " ", out), data


def test_the_artifact_ships_the_product_only(installed: Installed) -> None:
    with tarfile.open(installed.tarball) as tar:
        names = set(tar.getnames())
        models = yaml.safe_load(tar.extractfile("roles/vllm_node/vars/main/models.yml").read())
    for needed in ("playbooks/plan.yml", "playbooks/site.yml", "playbooks/rollout.yml",
                   "playbooks/tasks/node_deploy.yml", "plugins/module_utils/sizing/plan.py",
                   "plugins/filter/catalog.py",
                   "roles/vllm_node/vars/main/catalogs.yml", "meta/runtime.yml"):
        assert needed in names, needed
    for left_out in ("tests", "molecule", "inventories", "scripts", "collections", "artifacts", ".venv", "ansible.cfg"):
        assert not [n for n in names if n == left_out or n.startswith(left_out + "/")], left_out
    assert not [k for k, e in models["vllm_node_catalog_models"].items() if e["repo"].startswith("vllm-node-test/")]
    installed_root = installed.collections / "ansible_collections/vllm_node/vllm_node"
    assert not [p for p in installed_root.rglob("*") if p.is_symlink()], "the installed tree has no links to a checkout"


def test_installed_plan_refuses_the_story_with_the_known_message(installed: Installed, tmp_path: Path) -> None:
    rc, out, data = installed_plan(installed, tmp_path, *STORY, "-e", "vllm_node_max_model_len=262144")
    assert rc != 0, out[-3000:]
    assert REFUSAL in out
    assert data is not None and data["fits"] is False and data["max_model_len"] == 262144
    assert "vllm_node.vllm_node.preflight : " in out, "the roles ran from the installed collection"
    assert f"Origin: {installed.collections}/ansible_collections/vllm_node/vllm_node/roles/preflight/" in out
    assert f"{ROOT}/roles" not in out and f"{ROOT}/playbooks" not in out, "nothing was read from the checkout"


def test_installed_plan_passes_a_fitting_request(installed: Installed, tmp_path: Path) -> None:
    rc, out, data = installed_plan(installed, tmp_path, *STORY, "-e", "vllm_node_max_model_len=131072")
    assert rc == 0, out[-3000:]
    assert data["fits"] is True and data["max_model_len"] == 131072 and data["kv_cache_dtype"] == "bfloat16"
    assert "vllm_node.vllm_node.preflight : " in out and f"{ROOT}/roles" not in out
