"""The rollout carries the canary's compile caches to the nodes after it (issue 29): the real role tasks
(roles/rollout/tasks/cache_receive.yml, cache_publish.yml) through ansible-playbook, three nodes that are this machine
(connection local), each with its own cache directory. canary and follower share a key (the plan's compile_cache.dir),
other has another (another vLLM version): the follower starts with the canary's files, other with nothing of them."""
from __future__ import annotations

import getpass
import grp
import json
import os
import sys
import tarfile
from pathlib import Path

import yaml

from harness import playbook

PLAYBOOK = Path(__file__).resolve().parent / "playbooks" / "compile_cache_carry.yml"
KEY = "vllm-0.32.0-cuda-0123456789abcdef"
OTHER = "vllm-0.31.0-cuda-fedcba9876543210"


def test_the_canary_s_caches_reach_a_node_of_its_key_and_no_other(tmp_path: Path) -> None:
    nodes = {"canary": KEY, "follower": KEY, "other": OTHER}
    user, group = getpass.getuser(), grp.getgrgid(os.getgid()).gr_name
    hosts = {name: {"rollout_cache_dir": str(tmp_path / name / "cache"),
                    "vllm_node_plan": {"compile_cache": {"dir": key}},
                    "ansible_python_interpreter": sys.executable} for name, key in nodes.items()}
    (tmp_path / "hosts.yml").write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    store = tmp_path / "controller"
    extra = {"rollout_cache_store": str(store), "rollout_cache_owner": user, "rollout_cache_group": group}
    (tmp_path / "extra.json").write_text(json.dumps(extra))
    env = playbook.environment(ANSIBLE_LOCALHOST_WARNING="false")
    rc, out, _ = playbook.run(PLAYBOOK, "-e", f"@{tmp_path / 'extra.json'}", inventory=str(tmp_path / "hosts.yml"),
                              env=env, timeout=300)
    assert rc == 0, out[-4000:]

    def compiled(name: str) -> str:
        return (tmp_path / name / "cache" / nodes[name] / "torchinductor" / "graph.bin").read_text()

    def carried(name: str) -> dict:
        return json.loads((tmp_path / name / "carry.json").read_text())

    assert compiled("canary") == "compiled on canary\n"
    assert compiled("follower") == "compiled on canary\n", "the follower compiled instead of using the canary's cache"
    assert compiled("other") == "compiled on other\n", "a cache of another key was used"
    assert carried("canary")["published_bytes"] > 0 and carried("canary")["received_bytes"] == 0
    assert carried("follower")["received_bytes"] > 0 and carried("follower").get("published_bytes") == 0
    assert carried("other")["received_bytes"] == 0 and carried("other")["published_bytes"] > 0
    assert sorted(p.name for p in store.iterdir()) == sorted({f"{KEY}.tar.gz", f"{OTHER}.tar.gz"})
    with tarfile.open(store / f"{KEY}.tar.gz") as archive:
        assert f"{KEY}/torchinductor/graph.bin" in archive.getnames(), archive.getnames()
    assert not list(Path("/var/tmp").glob(f"vllm-node-compile-cache-{KEY}*")), "the node's copy was left behind"
