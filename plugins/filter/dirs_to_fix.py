"""Filters dirs_to_fix and paths_present: which paths a file task must still touch, from one files_probe call.

An idempotent re-run spends its time in remote calls (one per loop item of ansible.builtin.file). A role probes
its paths once (vllm_node.vllm_node.files_probe) and loops the file task only over the paths whose state differs:
on a converged node the loop is empty; where it is not, the file task does (and reports, --check --diff included)
exactly what it did before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

DOCUMENTATION = r"""
name: dirs_to_fix
short_description: The directories whose type, mode or owner differ from what a file task would make them
description:
  - Takes paths and the RV(files) answer of M(vllm_node.vllm_node.files_probe) (keyed by the paths themselves) and
    returns, in the given order, the paths that are not a directory (a link to one counts as not: the file task
    decides), or whose mode, uid or gid differ from the given ones. An omitted mode, uid or gid is not compared.
  - A path the probe did not look at is returned (the file task decides).
positional: _input, found, mode, uid, gid
options:
  _input:
    description: The directories, absolute paths.
    type: list
    elements: str
    required: true
  found:
    description: files_probe's RV(files), keyed by path.
    type: dict
    required: true
  mode:
    description: The wanted permission bits, as four octal digits (e.g. V(0750)); omitted, not compared.
    type: str
  uid:
    description: The wanted owner's uid; omitted, not compared.
    type: int
  gid:
    description: The wanted group's gid; omitted, not compared.
    type: int
author: vllm-node
"""

EXAMPLES = r"""
loop: "{{ ['/var/lib/vllm', '/var/lib/vllm/cache'] | vllm_node.vllm_node.dirs_to_fix(probe.files, '0750', 998, 998) }}"
"""

RETURN = r"""
_value:
  description: The paths the file task must still make directories with that mode and owner, in input order.
  type: list
  elements: str
"""


def octal_mode(mode: str | int) -> int:
    """Permission bits from '0750', '750' or an int (as Ansible's mode: an int is taken as its octal digits)."""
    text = str(mode).strip()
    if not text or any(c not in "01234567" for c in text):
        raise ValueError(f"dirs_to_fix: mode must be octal digits, got {mode!r}")
    return int(text, 8)


def dir_matches(found: Mapping[str, Any] | None, mode: str | int | None, uid: int | None, gid: int | None) -> bool:
    """Whether the probed entry is a real directory (not a link) with the given mode, uid and gid."""
    if not found or not found.get("exists") or not found.get("isdir") or found.get("islnk"):
        return False
    if mode is not None and octal_mode(found.get("mode") or "x") != octal_mode(mode):
        return False
    if uid is not None and found.get("uid") != int(uid):
        return False
    return gid is None or found.get("gid") == int(gid)


def dirs_to_fix(paths: Sequence[str], found: Mapping[str, Mapping[str, Any]], mode: str | int | None = None,
                uid: int | str | None = None, gid: int | str | None = None) -> list[str]:
    """The paths, in order, that are not yet directories with that mode, uid and gid (per files_probe)."""
    want_uid = None if uid is None else int(uid)
    want_gid = None if gid is None else int(gid)
    return [path for path in paths if not dir_matches(found.get(path), mode, want_uid, want_gid)]


def paths_present(paths: Sequence[str], found: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The paths, in order, that exist (a dangling link included) or that the probe did not look at."""
    return [path for path in paths if (found.get(path) or {"exists": True}).get("exists")]


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict:
        """The filters of this file."""
        return {"dirs_to_fix": dirs_to_fix, "paths_present": paths_present}
