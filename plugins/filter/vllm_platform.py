"""Filter vllm_platform_check: can this node's OS (its Python) and driver branch run the vLLM release's lock?"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ansible_collections.vllm_node.vllm_node.plugins.module_utils.filter_errors import reports_bad_input

DOCUMENTATION = r"""
name: vllm_platform_check
short_description: Refusals for a node whose Python has no lock or whose driver branch is too old for the lock's CUDA
description:
  - Looks up the vLLM release and build in the lock catalog (vllm_node_vllm_locks, generated from the vllm_env role's
    pinned requirements files by C(make locks)).
  - The node's Python must have a lock; the message names the Python, the OS, the Pythons that have one and the
    release's Requires-Python.
  - For a CUDA build, the driver branch must run the lock's CUDA major (its nvidia-cuda-runtime pin); the branch table
    (vllm_node_driver_cuda) gives the CUDA release of the highest listed branch at or below it.
  - A release the catalog does not know (a lock of the user's own) is not checked here; vllm_env checks its file.
positional: _input, version, variant, python, os_name, driver_branch, driver_cuda
options:
  _input:
    description: >-
      The lock catalog, release key (V(0.33.0-cuda)) -> {requires_python, pythons -> {file, cuda_major, ...}}.
    type: dict
    required: true
  version:
    description: vLLM release (vllm_node_vllm_version).
    type: str
    required: true
  variant:
    description: Build, V(cuda) or V(cpu).
    type: str
    required: true
  python:
    description: X.Y of the node's Python; empty when unknown (planning on the controller), then every lock counts.
    type: str
    required: true
  os_name:
    description: The node's OS for the messages, e.g. V(Ubuntu 22.04); may be empty.
    type: str
    required: true
  driver_branch:
    description: The NVIDIA driver branch the node gets (nvidia_driver_branch); null or 0 = not checked.
    type: int
    required: true
  driver_cuda:
    description: The branch table, a list of {branch, cuda}.
    type: list
    elements: dict
    required: true
author: vllm-node
"""

EXAMPLES = r"""
problems: >-
  {{ (vllm_node_vllm_locks | vllm_node.vllm_node.vllm_platform_check('0.33.0', 'cuda', '3.12', 'Ubuntu 24.04', 570,
      vllm_node_driver_cuda)).problems }}
# ["driver branch 570 supports CUDA up to 12.8; the vLLM 0.33.0 CUDA lock for Python 3.12 needs CUDA 13
#   (nvidia-cuda-runtime 13.0.96): set nvidia_driver_branch to 580 or newer"]
"""

RETURN = r"""
_value:
  description: What was checked and what is refused.
  type: dict
  contains:
    lock:
      description: The catalog entry of the node's lock (file, cuda_major, cuda_runtime, torch, packages), or null.
    driver_cuda:
      description: The CUDA release the driver branch runs at most (V(12.8)), or null when not checked.
    problems:
      description: One message per refusal, each naming what is wrong and how to fix it; empty = fine.
"""


def _major(version: str) -> int:
    """13 for "13.0.96" or "13.0"."""
    return int(str(version).split(".", 1)[0])


def branch_cuda(branch: int, table: Sequence[Mapping[str, Any]]) -> str | None:
    """The CUDA release of the highest table branch at or below `branch`; None when the branch is older than all."""
    rows = sorted(table, key=lambda row: int(row["branch"]))
    known = [row for row in rows if int(row["branch"]) <= int(branch)]
    return str(known[-1]["cuda"]) if known else None


def first_branch_for(cuda_major: int, table: Sequence[Mapping[str, Any]]) -> int | None:
    """The oldest table branch whose CUDA release has at least this major; None when no branch has it."""
    rows = sorted(table, key=lambda row: int(row["branch"]))
    return next((int(row["branch"]) for row in rows if _major(row["cuda"]) >= cuda_major), None)


def _python_key(python: str) -> tuple[int, ...]:
    return tuple(int(part) for part in python.split("."))


@reports_bad_input
def vllm_platform_check(catalog: Mapping[str, Any], version: str, variant: str, python: str, os_name: str,
                        driver_branch: int | None, driver_cuda: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Check the node's Python against the release's locks and the driver branch against the lock's CUDA major.

    Raises ValueError (AnsibleFilterError under Ansible) for a catalog entry without `pythons` or a table row
    without branch/cuda.
    """
    release = catalog.get(f"{version}-{variant}")
    result: dict[str, Any] = {"lock": None, "driver_cuda": None, "problems": []}
    if release is None:
        return result
    if not isinstance(release, Mapping) or not isinstance(release.get("pythons"), Mapping):
        raise ValueError(f"the lock catalog's entry {version}-{variant} has no 'pythons' mapping: regenerate "
                         "roles/vllm_node/vars/main/vllm_locks.yml with `make locks`")
    locks: Mapping[str, Mapping[str, Any]] = release["pythons"]
    have = sorted(locks, key=_python_key)
    label = f"vLLM {version} {variant.upper() if variant == 'cuda' else variant}"
    python = str(python or "")
    where = f" ({os_name})" if os_name else ""
    if python and python not in locks:
        requires = release.get("requires_python") or ""
        reason = f"vLLM {version} requires Python {requires}, " if requires else ""
        result["problems"].append(
            f"the {label} build has no lock for Python {python}{where}: {reason}locks exist for Python "
            f"{', '.join(have)}. Run the node on an OS whose Python has a lock, or install such a Python on the node "
            f"and set vllm_env_python_interpreter to it and preflight_python_version to its X.Y, or compile a lock "
            f"for Python {python} with `make locks` if the release supports it.")
        return result
    candidates = [locks[python]] if python else [locks[p] for p in have]
    if python:
        result["lock"] = dict(locks[python])
    needing = [lock for lock in candidates if lock.get("cuda_major")]
    if variant == "cpu" or not needing or not driver_branch:
        return result
    lock = max(needing, key=lambda entry: int(entry["cuda_major"]))
    need = int(lock["cuda_major"])
    have_cuda = branch_cuda(int(driver_branch), driver_cuda)
    result["driver_cuda"] = have_cuda
    if have_cuda is not None and _major(have_cuda) >= need:
        return result
    first = first_branch_for(need, driver_cuda)
    supports = (f"supports CUDA up to {have_cuda}" if have_cuda is not None else
                f"is older than every branch the table knows (oldest {min(int(r['branch']) for r in driver_cuda)})")
    lock_name = f"the {label} lock" + (f" for Python {python}" if python else "")
    fix = (f"set nvidia_driver_branch to {first} or newer" if first is not None else
           f"no known driver branch runs CUDA {need}: add it to vllm_node_driver_cuda")
    result["problems"].append(
        f"driver branch {driver_branch} {supports}; {lock_name} needs CUDA {need} "
        f"(nvidia-cuda-runtime {lock.get('cuda_runtime')}, torch {lock.get('torch')}): {fix}.")
    return result


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict:
        """The filters of this file."""
        return {"vllm_platform_check": vllm_platform_check}
