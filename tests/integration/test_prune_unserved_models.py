"""The prune step of playbooks/tasks/node_finish.yml (`--tags prune`) on the controller itself (connection local, a
temporary models root, no container): with the facts the deploy tasks publish, the downloaded models and adapters no
unit serves go, the served ones and a directory the project did not create stay; --check --diff reports and
deletes nothing; a second run changes nothing; a run that did not plan is refused with everything kept."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from harness import playbook
from harness.models import downloaded_model, tree
from harness.project import PROJECT

A, B = "a" * 40, "b" * 40
FILES = {"config.json": b'{"hidden_size": 64}', "model.safetensors": b"w" * 65536}
PLAY = """
- hosts: localhost
  connection: local
  gather_facts: false
  roles:
    - role: vllm_node
  tasks:
    - name: Publish what the deploy tasks would (the plan, what each instance serves)
      ansible.builtin.set_fact:
        vllm_node_plan: "{{{{ plan }}}}"
        vllm_node_served_instances: "{{{{ served }}}}"
        model_download_dir: "{{{{ serving_dir }}}}"
      when: plan is defined
      tags: [always]

    - name: The site's last steps
      ansible.builtin.import_tasks: {finish}
"""


@pytest.fixture
def node(tmp_path: Path) -> dict[str, Path]:
    """A models root: org/served (serving A), org/left (A and B, B's files hard links of A's), a directory nobody
    recorded, and under lora/ the listed adapter ad/kept and ad/gone, no longer listed."""
    root = tmp_path / "models"
    downloaded_model(root, "org/served", FILES, [A])
    downloaded_model(root, "org/left", FILES, [A, B])
    (root / "hand" / "made" / "revisions" / A).mkdir(parents=True)
    (root / "hand" / "made" / "revisions" / A / "model.safetensors").write_bytes(b"h" * 4096)
    downloaded_model(root / "lora", "ad/kept", {"adapter_model.safetensors": b"a" * 1024}, [A])
    downloaded_model(root / "lora", "ad/gone", {"adapter_model.safetensors": b"a" * 1024}, [A])
    (tmp_path / "play.yml").write_text(PLAY.format(finish=PROJECT / "playbooks" / "tasks" / "node_finish.yml"))
    return {"dir": tmp_path, "root": root}


def instance_vars(root: Path) -> dict[str, Any]:
    """Extra vars of a node serving one instance, org/served at A (org/left's instance left the inventory)."""
    serving = str(root / "org" / "served" / "revisions" / A)
    plan = {"device": "cpu", "repo": "org/served", "instances": [{"name": "one", "plan": {"repo": "org/served"}}]}
    return {"plan": plan,
            "served": [{"name": "one", "repo": "org/served", "commit": A, "dir": serving}], "serving_dir": serving}


def prune(node: dict[str, Path], variables: dict[str, Any], *args: str) -> tuple[int, str, dict[str, int]]:
    """ansible-playbook --tags prune on the play; (rc, output, the localhost recap counters)."""
    extra = {"vllm_node_model_root": str(node["root"]), "model_download_owner": "root", "model_download_group": "root",
             "vllm_node_lora_adapters": [{"name": "kept", "repository": "ad/kept", "revision": A, "base": "x"}],
             **variables}
    rc, out, _ = playbook.run(node["dir"] / "play.yml", "--tags", "prune", "-e", json.dumps(extra), *args,
                              inventory="localhost,", timeout=300)
    return rc, out, playbook.recap(out, "localhost") if "PLAY RECAP" in out else {}


def test_the_models_no_unit_serves_go_once_the_rest_stays(node: dict[str, Path]) -> None:
    root = node["root"]
    before = tree(root)
    kept = {path: size for path, size in before.items()
            if path.startswith(("org/served/", "hand/", "lora/ad/kept/"))}

    rc, out, recap = prune(node, instance_vars(root), "--check", "--diff")
    assert rc == 0 and recap["changed"] >= 1, out
    flat = " ".join(out.split())  # the callback wraps long messages
    assert re.search(r"would delete org/left \([\d.]+ KiB\), ad/gone \([\d.]+ KiB\); [\d.]+ KiB freed", flat), out
    assert f"{root}/org/left/revisions/{B}" in out, "the diff lists the paths"
    assert tree(root) == before, "check mode deletes nothing"

    rc, out, recap = prune(node, instance_vars(root))
    assert rc == 0 and recap["changed"] >= 1, out
    flat = " ".join(out.split())
    # org/left: its two revisions share one copy of the files (hard links), 65,555 bytes of data and its markers
    assert re.search(r"deleted org/left \(6[45]\.\d\d KiB\), ad/gone \([\d.]+ KiB\); [\d.]+ KiB freed", flat), out
    assert tree(root) == kept
    assert not (root / "org" / "left").exists() and not (root / "lora" / "ad" / "gone").exists()
    assert (root / "org").is_dir() and not (root / "lora" / "ad" / "gone").exists()

    rc, out, recap = prune(node, instance_vars(root))
    assert rc == 0 and recap["changed"] == 0, out
    assert "nothing to delete" in out


def test_the_single_model_replacing_the_instances_keeps_only_its_repo(node: dict[str, Path]) -> None:
    root = node["root"]
    serving = str(root / "org" / "left" / "revisions" / B)
    rc, out, recap = prune(node, {"plan": {"device": "cpu", "repo": "org/left"}, "served": [],
                                  "serving_dir": serving, "model_download_repo": "org/left"})
    assert rc == 0 and recap["changed"] >= 1, out
    assert not (root / "org" / "served").exists()
    # the revision prune of the served model ran before: its other revision went, the served one stays whole
    assert sorted(p.name for p in (root / "org" / "left" / "revisions").iterdir()) == [B]
    assert (root / "org" / "left" / "revisions" / B / "model.safetensors").stat().st_size == 65536
    assert (root / "hand" / "made").is_dir() and (root / "lora" / "ad" / "kept").is_dir()
    assert not (root / "lora" / "ad" / "gone").exists()


def test_a_run_that_did_not_plan_deletes_nothing(node: dict[str, Path]) -> None:
    """As `--tags model,prune` on a node of instances: no plan, the single model's download ran (its directory is
    known, so the revision prune passes); the step does not guess what is served, it stops."""
    before = tree(node["root"])
    serving = str(node["root"] / "org" / "served" / "revisions" / A)
    rc, out, _ = prune(node, {"model_download_dir": serving, "model_download_repo": "org/served"})
    assert rc != 0 and "Delete the downloaded models and adapters no unit serves any more" in out, out
    assert "'vllm_node_plan' is undefined" in out, out
    assert tree(node["root"]) == before
