"""Filter compile_cache_prune: which keyed compile-cache directories to remove (vllm_service keeps a bounded few)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

DOCUMENTATION = r"""
name: compile_cache_prune
short_description: The compile-cache directories to remove, keeping the current one and the newest others
description:
  - The plan names one compile-cache directory per key (C(plan.compile_cache.dir), e.g.
    V(vllm-0.33.0-cuda-8f4c5c31db628d07)); a new vLLM, torch, driver, GPU or plan makes a new one and the old ones
    stay for a rollback. This keeps the current directory and the O(keep) most recently modified others, and
    returns the paths of the rest (oldest first).
  - Only directories named like the plan's (C(vllm-<version>-<build>-<16 hex digits>)) are considered; anything
    else in the cache directory is left alone.
positional: _input, current, keep
options:
  _input:
    description: The entries of the cache directory as ansible.builtin.find returns them (C(path), C(mtime)).
    type: list
    elements: dict
    required: true
  current:
    description: The directory name the plan uses now (never returned).
    type: str
    required: true
  keep:
    description: How many other keyed directories to keep (the most recently modified).
    type: int
    required: true
author: vllm-node
"""

EXAMPLES = r"""
stale: "{{ found.files | vllm_node.vllm_node.compile_cache_prune(vllm_node_plan.compile_cache.dir, 2) }}"
"""

RETURN = r"""
_value:
  description: The paths to remove, oldest first.
  type: list
  elements: str
"""

KEY_HEX = 16


def is_keyed(name: str) -> bool:
    """vllm-<version>-<build>-<16 lower-case hex digits>: a directory the plan's key made."""
    head, _, key = name.rpartition("-")
    return (name.startswith("vllm-") and head.count("-") >= 2 and len(key) == KEY_HEX
            and all(c in "0123456789abcdef" for c in key))


def compile_cache_prune(entries: Sequence[Mapping[str, Any]], current: str, keep: int) -> list[str]:
    """The keyed directories beyond the current one and the `keep` newest others, oldest first.

    Raises ValueError for a negative `keep` or an entry without a path.
    """
    bound = int(keep)
    if bound < 0:
        raise ValueError(f"compile_cache_prune: keep must be >= 0, got {keep!r}")
    others = []
    for entry in entries:
        path = str(entry.get("path") or "")
        if not path:
            raise ValueError(f"compile_cache_prune: an entry without a path: {entry!r}")
        name = path.rstrip("/").rsplit("/", 1)[-1]
        if is_keyed(name) and name != current:
            others.append((float(entry.get("mtime") or 0), path))
    others.sort(reverse=True)
    return [path for _mtime, path in sorted(others[bound:])]


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict:
        """The filters of this file."""
        return {"compile_cache_prune": compile_cache_prune}
