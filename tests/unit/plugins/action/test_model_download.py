"""The model_download action plugin's flow, the node being a fake that answers model_download_node's steps."""

from __future__ import annotations

import json
from typing import Any
from unittest.mock import MagicMock

import pytest
from ansible.errors import AnsibleActionFail

from ansible_collections.vllm_node.vllm_node.plugins.action import model_download as act
from ansible_collections.vllm_node.vllm_node.plugins.module_utils.model_download import files as mdf

A = "a" * 40
B = "b" * 40
SHA = "1" * 64
FILES = [{"path": "config.json", "size": 20}, {"path": "m.safetensors", "size": 1000, "sha256": SHA}]
REQ = {"repo": "org/m", "revision": "main", "refresh": "False", "root": "/srv", "base_dir": "/srv/org/m",
       "keep_revisions": "1", "hf_cli": "/opt/hf", "endpoint": "http://hub", "hf_home": "/var/hf", "include": [],
       "exclude": [], "metadata_patterns": ["*.json"], "disk_margin_bytes": 0, "disk_margin_percent": "0",
       "progress_interval": 15, "timeout_seconds": 3600, "max_workers": 8, "verify": True, "reverify": False,
       "repair": False, "owner": "vllm", "group": "vllm", "ca_bundle": "", "environment": {}}
RECORD = {"repo": "org/m", "requested_revision": "main", "commit": A, "endpoint": "http://hub", "include": [],
          "exclude": [], "files": FILES}
CONFIG = json.dumps({"architectures": ["LlamaForCausalLM"]})


class FakeNode:
    """The node's state: the record, the revision's files, markers, free space; records every step."""

    def __init__(self, record: dict | None = RECORD, local: dict | None = None, free: int = 10**9,
                 verify: list[dict] | None = None) -> None:
        self.record, self.local, self.free = record, dict(local or {}), free
        self.markers: dict[str, str] = {}
        self.verify = list(verify or [{"rc": 0, "stdout": "Verified 2 file(s)."}])
        self.ops: list[str] = []

    def execute(self, module_name: str, module_args: dict[str, Any], task_vars: dict[str, Any]) -> dict[str, Any]:
        op = module_args.get("op", "link")
        self.ops.append(op)
        if op == "prepare":
            return {"changed": False, "record": self.record, "messages": []}
        if op == "resolve":
            self.record = {**RECORD, "commit": B}
            return {"changed": True, "record": self.record}
        if op == "look":
            return {"changed": False, "files": dict(self.local), "tree_bytes": sum(self.local.values()),
                    "markers": dict(self.markers), "free_bytes": self.free}
        if op == "hf" and module_args["argv"][0] == "download":
            self.local["config.json"] = 20
            return {"changed": False, "hf": {"rc": 0, "stdout": "", "stderr": ""}}
        if op == "hf":
            return {"changed": False, "hf": self.verify.pop(0)}
        if op == "finish":
            return {"changed": False, "docs": {"config.json": CONFIG} if "config.json" in self.local else {}}
        if op == "start":
            return {"changed": True, "job": {"dir": "/var/hf/jobs/1", "pid": 7}}
        if op == "poll":
            self.local["m.safetensors"] = 1000
            return {"changed": False, "job": {"finished": True, "rc": 0, "stdout": "", "stderr": ""}, "bytes": 1020}
        if op == "forget":
            for name in module_args["names"]:
                self.local.pop(name, None)
            return {"changed": True}
        if op == "seal":
            return {"changed": True, "sha256": {"config.json": "2" * 64, "m.safetensors": SHA},
                    "manifest_sha256": "f" * 64}
        return {"changed": False}


def make(node: FakeNode, monkeypatch: pytest.MonkeyPatch, check_mode: bool = False, **args: Any):
    task = MagicMock()
    task.args = {"step": "all", "request": REQ, **args}
    task.async_val = 0
    task.check_mode = check_mode
    task.diff = False
    connection = MagicMock()
    connection._shell.tmpdir = None
    action = act.ActionModule(task, connection, MagicMock(), loader=None, templar=None, shared_loader_obj=None)
    monkeypatch.setattr(action, "_execute_module", node.execute)
    monkeypatch.setattr(action, "sleep", lambda seconds: None)
    lines: list[str] = []
    monkeypatch.setattr(act.display, "display", lambda msg, *a, **k: lines.append(msg))
    return action, lines


def test_a_fresh_download_resolves_fetches_verifies_and_asks_for_the_seal(monkeypatch: pytest.MonkeyPatch) -> None:
    node = FakeNode(record=None)
    action, lines = make(node, monkeypatch)
    res = action.run(task_vars={"inventory_hostname": "n1"})
    assert res["changed"] and res["seal"] and res["facts"]["model_download_commit"] == B
    assert res["facts"]["model_download_dir"] == f"/srv/org/m/revisions/{B}"
    assert res["facts"]["model_download_config"] == {"architectures": ["LlamaForCausalLM"]}
    assert res["facts"]["model_download_checkpoint_bytes"] == 1000 == res["facts"]["model_download_shard_bytes"]
    assert node.ops == ["prepare", "resolve", "look", "hf", "look", "finish", "start", "poll", "stop", "look", "hf",
                        "finish"]
    assert f"org/m@{B}: 1 of 2 files missing, 1000 B to download" in lines
    assert any(line.startswith("n1 | org/m: ") and "(finished)" in line for line in lines)


def test_a_complete_revision_reads_the_marker_and_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    node = FakeNode(local={"config.json": 20, "m.safetensors": 1000})
    hashes = {"config.json": "2" * 64, "m.safetensors": SHA}
    node.markers[A] = json.dumps(mdf.new_marker("org/m", A, FILES, True, hashes, "t"))
    action, lines = make(node, monkeypatch)
    res = action.run(task_vars={})
    assert not res["changed"] and not res["seal"] and "resolve" not in node.ops and "hf" not in node.ops
    assert res["facts"]["model_download_file_sha256"] == hashes and res["facts"]["model_download_complete"]
    assert res["facts"]["model_download_manifest_sha256"] == mdf.manifest_sha256(hashes)
    assert f"org/m@{A}: complete and verified, nothing to download" in lines


def test_check_mode_without_a_record_says_what_a_real_run_would_do(monkeypatch: pytest.MonkeyPatch) -> None:
    node = FakeNode(record=None)
    action, lines = make(node, monkeypatch, check_mode=True)
    res = action.run(task_vars={})
    assert res["facts"] == {} and not res["seal"] and node.ops == ["prepare"]
    assert lines[0].startswith("model_download (check mode): org/m@main is not recorded in /srv/org/m yet")


def test_not_enough_disk_space_is_refused_before_any_download(monkeypatch: pytest.MonkeyPatch) -> None:
    node = FakeNode(local={"config.json": 20}, free=999)
    action, _ = make(node, monkeypatch)
    with pytest.raises(AnsibleActionFail, match="not enough disk space .* Nothing was downloaded"):
        action.run(task_vars={})
    assert "start" not in node.ops


def test_a_corrupted_file_fails_verification_unless_repair(monkeypatch: pytest.MonkeyPatch) -> None:
    bad = {"rc": 1, "stdout": "  - m.safetensors: expected 111 (sha256), got 222\n", "stderr": ""}
    node = FakeNode(local={"config.json": 20, "m.safetensors": 1000}, verify=[bad])
    action, _ = make(node, monkeypatch)
    with pytest.raises(AnsibleActionFail, match=r"(?s)failed verification \(rc 1\).*Corrupted: \[.m.safetensors.\]"):
        action.run(task_vars={})
    node = FakeNode(local={"config.json": 20, "m.safetensors": 1000}, verify=[bad, {"rc": 0, "stdout": "ok"}])
    action, _ = make(node, monkeypatch, request={**REQ, "repair": True})
    res = action.run(task_vars={})
    assert res["seal"] and node.ops.count("hf") == 2 and "forget" in node.ops and "start" in node.ops


def test_the_seal_step_publishes_every_files_sha256(monkeypatch: pytest.MonkeyPatch) -> None:
    action, _ = make(FakeNode(), monkeypatch, step="seal", commit=A, files=FILES)
    res = action.run(task_vars={})
    assert res["changed"] and res["facts"]["model_download_complete"] is True
    assert res["facts"]["model_download_bytes"] == 1020 and res["facts"]["model_download_manifest_sha256"]


@pytest.mark.parametrize(("change", "match"), [({"repo": "bad"}, "bad input"),
                                               ({"timeout_seconds": "soon"}, "model_download_timeout_seconds")])
def test_bad_requests_are_refused_with_the_variable_to_set(monkeypatch, change, match) -> None:
    node = FakeNode()
    action, _ = make(node, monkeypatch, request={**REQ, **change})
    with pytest.raises(AnsibleActionFail, match=match):
        action.run(task_vars={})
    assert node.ops == []
