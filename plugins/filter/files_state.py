"""Filters dirs_to_fix and paths_present: which paths a file task must still touch, from one files_probe call.

Documented per filter in plugins/filter/<name>.yml.

An idempotent re-run spends its time in remote calls (one per loop item of ansible.builtin.file). A role probes
its paths once (vllm_node.vllm_node.files_probe) and loops the file task only over the paths whose state differs:
on a converged node the loop is empty; where it is not, the file task does (and reports, --check --diff included)
exactly what it did before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


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
