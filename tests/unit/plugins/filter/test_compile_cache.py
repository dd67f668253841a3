"""compile_cache_prune: the keyed compile-cache directories beyond the current one and a bound are removed."""

from __future__ import annotations

import pytest

from ansible_collections.vllm_node.vllm_node.plugins.filter.compile_cache import compile_cache_prune, is_keyed

CURRENT = "vllm-0.32.0-cpu-00000000000000aa"


def entry(name: str, mtime: float) -> dict:
    return {"path": f"/var/lib/vllm/cache/{name}", "mtime": mtime}


def test_keeps_the_current_and_the_newest_others_and_removes_the_rest_oldest_first() -> None:
    found = [entry(CURRENT, 1), entry("vllm-0.31.0-cpu-00000000000000bb", 50),
             entry("vllm-0.30.0-cpu-00000000000000cc", 10), entry("vllm-0.29.0-cpu-00000000000000dd", 30),
             entry("vllm-0.28.0-cpu-00000000000000ee", 20)]
    assert compile_cache_prune(found, CURRENT, 2) == ["/var/lib/vllm/cache/vllm-0.30.0-cpu-00000000000000cc",
                                                      "/var/lib/vllm/cache/vllm-0.28.0-cpu-00000000000000ee"]
    assert compile_cache_prune(found, CURRENT, 4) == []
    # the current one is kept even when it is the oldest and the bound is 0
    assert len(compile_cache_prune(found, CURRENT, 0)) == 4


def test_leaves_what_the_plan_did_not_name_alone() -> None:
    found = [entry("vllm", 1), entry("triton", 1), entry("torchinductor", 1), entry("vllm-notakey", 1),
             entry("vllm-0.32.0-cpu-XYZ0000000000000", 1)]
    assert compile_cache_prune(found, CURRENT, 0) == []
    assert is_keyed(CURRENT) and not is_keyed("vllm-0.32.0-cpu-0000000000000aa")


def test_refuses_a_negative_bound_and_an_entry_without_a_path() -> None:
    with pytest.raises(ValueError, match="keep must be >= 0"):
        compile_cache_prune([], CURRENT, -1)
    with pytest.raises(ValueError, match="without a path"):
        compile_cache_prune([{"mtime": 1}], CURRENT, 1)
