"""The four sizing filters: exposed to Ansible, errors as AnsibleFilterError, documented for ansible-doc."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ansible_collections.vllm_node.vllm_node.plugins.filter import sizing as vllm_sizing
from repo_root import ROOT
from sizing_cases import KIMI, STORY_HARDWARE, TINY_LLAMA

FILTERS = ("vllm_kv_cache_bytes", "vllm_max_model_len", "vllm_kv_cache_tokens", "vllm_max_concurrency",
           "vllm_memory_plan")
DOCUMENTED = (*FILTERS, "vllm_service_command")


def test_filters_are_exposed_to_ansible(releases: dict[str, Any]) -> None:
    filters = vllm_sizing.FilterModule().filters()
    assert set(filters) == set(DOCUMENTED)
    assert filters["vllm_kv_cache_bytes"](TINY_LLAMA, 4096, releases=releases) == 4096 * 512
    with pytest.raises(Exception, match="^tensor_parallel_size 3 does not divide"):
        filters["vllm_kv_cache_bytes"](TINY_LLAMA, 4096, tensor_parallel_size=3, releases=releases)
    # 1 GiB of CPU KV space / 512 B per token = 2,097,152 tokens = 512 requests of 4,096 (printed "512.00x").
    assert filters["vllm_max_concurrency"](TINY_LLAMA, 1 << 30, 4096, device="cpu", releases=releases) == 512.0
    with pytest.raises(Exception, match="^max_model_len must be >= 1"):
        filters["vllm_max_concurrency"](TINY_LLAMA, 1 << 30, 0, releases=releases)


def test_plan_from_the_filter_wrapper(releases: dict[str, Any]) -> None:
    STORY = dict(STORY_HARDWARE, releases=releases)
    memory_plan = vllm_sizing.FilterModule().filters()["vllm_memory_plan"]
    assert memory_plan(KIMI, **STORY)["max_model_len"] == 262144
    with pytest.raises(Exception, match="^GPU too small for the weights"):
        memory_plan(KIMI, **dict(STORY, gpu_count=2))


@pytest.mark.parametrize("name", FILTERS)
def test_every_filter_needs_the_releases_data(name: str) -> None:
    """The maths reads no files: without releases= the filter says what to pass instead of guessing."""
    func = vllm_sizing.FilterModule().filters()[name]
    args: tuple[Any, ...] = {"vllm_kv_cache_bytes": (4096,), "vllm_max_model_len": (1 << 30,),
                             "vllm_kv_cache_tokens": (1 << 30, 4096), "vllm_max_concurrency": (1 << 30, 4096),
                             "vllm_memory_plan": ()}[name]
    kwargs = {"gpu": {"kind": "cpu", "kv_cache_space_gib": 1}} if name == "vllm_memory_plan" else {}
    with pytest.raises(Exception, match=r"^releases is required: pass releases=vllm_node_vllm_releases"):
        func(TINY_LLAMA, *args, **kwargs)


def test_unknown_keywords_are_refused_not_ignored(releases: dict[str, Any]) -> None:
    memory_plan = vllm_sizing.FilterModule().filters()["vllm_memory_plan"]
    with pytest.raises(Exception, match=r"unknown keyword argument\(s\) max_model_length"):
        memory_plan(TINY_LLAMA, gpu={"kind": "cpu", "kv_cache_space_gib": 1}, releases=releases,
                    max_model_length=2048)


def test_service_command_refusal_is_a_filter_error(releases: dict[str, Any]) -> None:
    filters = vllm_sizing.FilterModule().filters()
    plan = filters["vllm_memory_plan"](TINY_LLAMA, gpu={"kind": "cpu", "kv_cache_space_gib": 1}, releases=releases)
    refused = r"^--port in the extra arguments is set by the plan or a knob; use vllm_node_port instead"
    with pytest.raises(Exception, match=refused):
        filters["vllm_service_command"](plan, model_dir="/m", extra_args=["--port", "9000"])


@pytest.mark.parametrize("name", DOCUMENTED)
def test_ansible_doc_prints_the_filter_documentation(name: str) -> None:
    """ansible-doc reads plugins/filter/<name>.yml (the sidecar of a multi-filter file)."""
    ansible_doc = Path(sys.executable).with_name("ansible-doc")
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(ROOT / "collections"), ANSIBLE_NOCOLOR="1")
    result = subprocess.run([str(ansible_doc), "-t", "filter", f"vllm_node.vllm_node.{name}"], cwd=ROOT, env=env,
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert f"vllm_node.vllm_node.{name}" in result.stdout
    for section in ("OPTIONS", "EXAMPLES", "RETURN"):
        assert section in result.stdout, f"{name}: no {section} in ansible-doc output"
    assert ("model_dir" if name == "vllm_service_command" else "releases") in result.stdout
