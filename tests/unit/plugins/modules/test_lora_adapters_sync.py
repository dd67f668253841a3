"""The lora_adapters_sync module run as Ansible runs it (JSON arguments on stdin) against a stand-in vLLM
(harness.backends.FakeVllm): check mode reports the diff and sends nothing, a run syncs, a second run changes
nothing, a refusal fails the task with vLLM's reason, and the API key never comes back in the result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ansible_collections.vllm_node.vllm_node.plugins.modules import lora_adapters_sync
from harness.backends import FakeVllm
from repo_root import ROOT

MODULE = Path(lora_adapters_sync.__file__)
KEY = "module-test-key"


def run_module(args: dict[str, Any], check: bool = False) -> dict[str, Any]:
    """The module's JSON answer for these arguments (collections/ on the path, as Ansible ships module_utils)."""
    payload = {"ANSIBLE_MODULE_ARGS": dict(args, _ansible_check_mode=check, _ansible_diff=True)}
    env = dict(os.environ, PYTHONPATH=str(ROOT / "collections"))
    proc = subprocess.run([sys.executable, str(MODULE)], input=json.dumps(payload), capture_output=True, text=True,
                          check=False, timeout=60, env=env)
    return json.loads(proc.stdout)


@pytest.fixture
def vllm() -> Iterator[FakeVllm]:
    server = FakeVllm(api_key=KEY, adapters={"gone": "/a/gone"}).start()
    yield server
    server.stop()


def test_check_then_sync_then_nothing(vllm: FakeVllm) -> None:
    args = {"url": vllm.url, "api_key": KEY, "adapters": [{"name": "new", "path": "/a/new"}]}
    checked = run_module(args, check=True)
    assert checked["changed"] is True and checked["loaded"] == ["new"] and checked["unloaded"] == ["gone"]
    assert checked["diff"] == {"before": "gone /a/gone\n", "after": "new /a/new\n"}
    assert vllm.posts() == [] and vllm.adapters == {"gone": "/a/gone"}
    synced = run_module(args)
    assert synced["changed"] is True and vllm.adapters == {"new": "/a/new"}
    assert KEY not in json.dumps(synced)
    assert run_module(args)["changed"] is False


def test_a_refused_load_fails_the_task_with_the_reason(vllm: FakeVllm) -> None:
    vllm.refuse["bad"] = (400, "Loading lora bad failed: rank 64 is greater than max_lora_rank 16")
    result = run_module({"url": vllm.url, "api_key": KEY, "adapters": [{"name": "bad", "path": "/a/bad"}]})
    assert result["failed"] is True
    assert "vLLM refused to load adapter bad from /a/bad (400): Loading lora bad failed: rank 64" in result["msg"]
