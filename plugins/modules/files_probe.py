#!/usr/bin/python
"""Ansible module: stat, hash and read several files on the node in one round trip."""

from __future__ import annotations

DOCUMENTATION = r"""
module: files_probe
short_description: Look at several paths at once (read-only)
description:
  - For each named path, returns what M(ansible.builtin.stat) would (existence, type, link target, size, mode,
    sha256) and, for the names listed in O(read), the file's text.
  - One module call instead of a loop of M(ansible.builtin.stat) and M(ansible.builtin.slurp) tasks. Every
    Ansible task costs about a third of a second of controller and interpreter start-up, so an idempotent re-run
    of the site playbook is dominated by the number of remote calls, not by what they do.
  - A path that does not exist is reported with RV(files.exists=false), never as an error.
  - Changes nothing.
options:
  paths:
    description: Name -> absolute path. The names key the result.
    type: dict
    required: true
  checksum:
    description: Hash every regular file (links are not followed, as with M(ansible.builtin.stat)).
    type: bool
    default: true
  checksum_algorithms:
    description:
      - Digests to compute in the one read of each file; RV(files.checksum) is the first, RV(files.checksums) all.
      - V(sha1) is what M(ansible.builtin.copy) reports as its checksum, V(sha256) what the manifests record.
    type: list
    elements: str
    choices: [sha1, sha256]
    default: [sha256]
  read:
    description: Names (keys of O(paths)) whose content is returned as text in RV(files.content).
    type: list
    elements: str
    default: []
  read_max_bytes:
    description: A file to read that is larger than this fails the task (these are small records, not data).
    type: int
    default: 4194304
extends_documentation_fragment:
  - vllm_node.vllm_node.read_only
author: vllm-node
"""

EXAMPLES = r"""
- name: Hash the unit and the env file, resolve the venv link and read the last record
  vllm_node.vllm_node.files_probe:
    paths:
      unit: /etc/systemd/system/vllm.service
      env: /etc/vllm/vllm.env
      venv: /opt/vllm/current
      record: /etc/vllm/vllm.fingerprint
    read: [record]
  register: probe
"""

RETURN = r"""
files:
  description: Name -> what was found at its path.
  returned: success
  type: dict
  contains:
    path: {description: The path looked at., type: str}
    exists: {description: Whether anything (a dangling link included) is there., type: bool}
    isreg: {description: A regular file., type: bool}
    isdir: {description: A directory., type: bool}
    islnk: {description: A symbolic link., type: bool}
    lnk_source: {description: Absolute, fully resolved target of a link., type: str}
    lnk_target: {description: The link's text as stored., type: str}
    size: {description: Bytes., type: int}
    mode: {description: Permission bits as four octal digits., type: str}
    uid: {description: Owner's uid., type: int}
    gid: {description: Group's gid., type: int}
    executable: {description: Executable by the user the module runs as., type: bool}
    checksum: {description: Hex digest of a regular file by the first of O(checksum_algorithms)., type: str}
    checksums: {description: Algorithm -> hex digest, for every one of O(checksum_algorithms)., type: dict}
    content: {description: The file's text (names in O(read) that are regular files)., type: str}
  sample:
    unit:
      path: /etc/systemd/system/vllm.service
      exists: true
      isreg: true
      isdir: false
      islnk: false
      size: 1800
      mode: "0644"
      checksum: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
"""

import hashlib
import os
import stat
from typing import Any

from ansible.module_utils.basic import AnsibleModule

CHUNK = 1 << 20


def hash_file(path: str, algorithms: list[str]) -> dict[str, str]:
    """Return algorithm -> hex digest of the file at `path`, every digest from one read in 1 MiB chunks."""
    digests = {name: hashlib.new(name) for name in algorithms}
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            for digest in digests.values():
                digest.update(block)
    return {name: digest.hexdigest() for name, digest in digests.items()}


def describe(path: str, algorithms: list[str]) -> dict[str, Any]:
    """What `ansible.builtin.stat` (follow=false) reports for `path`, with the same key names."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return {"path": path, "exists": False}
    found: dict[str, Any] = {
        "path": path,
        "exists": True,
        "isreg": stat.S_ISREG(info.st_mode),
        "isdir": stat.S_ISDIR(info.st_mode),
        "islnk": stat.S_ISLNK(info.st_mode),
        "size": info.st_size,
        "mode": f"{stat.S_IMODE(info.st_mode):04o}",
        "uid": info.st_uid,
        "gid": info.st_gid,
        "executable": os.access(path, os.X_OK) and not stat.S_ISDIR(info.st_mode),
    }
    if found["islnk"]:
        found["lnk_target"] = os.readlink(path)
        found["lnk_source"] = os.path.realpath(path)
    if algorithms and found["isreg"]:
        found["checksums"] = hash_file(path, algorithms)
        found["checksum"] = found["checksums"][algorithms[0]]
    return found


def read_text(path: str, limit: int) -> str:
    """The text of a small file; a larger one is an error (a record, not data, is expected here)."""
    size = os.path.getsize(path)
    if size > limit:
        raise ValueError(f"{path} is {size} bytes, more than read_max_bytes={limit}")
    with open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read()


def probe(paths: dict[str, Any], algorithms: list[str], read: list[str], limit: int) -> dict[str, dict[str, Any]]:
    """Name -> what is at its path (see RETURN); raises ValueError on bad input, naming the fix."""
    unknown = sorted(set(read) - set(paths))
    if unknown:
        raise ValueError(f"read names {unknown} are not keys of paths ({sorted(paths)}): add them to paths")
    relative = sorted(name for name, path in paths.items() if not os.path.isabs(str(path)))
    if relative:
        raise ValueError(f"paths must be absolute; not so for {relative}")
    files: dict[str, dict[str, Any]] = {}
    for name, path in paths.items():
        try:
            files[name] = describe(str(path), algorithms)
            if name in read and files[name].get("isreg"):
                files[name]["content"] = read_text(str(path), limit)
        except OSError as err:
            raise ValueError(f"cannot look at {name} ({path}): {err}") from err
    return files


def main() -> None:
    """Run the module."""
    module = AnsibleModule(
        argument_spec={
            "paths": {"type": "dict", "required": True},
            "checksum": {"type": "bool", "default": True},
            "checksum_algorithms": {"type": "list", "elements": "str", "choices": ["sha1", "sha256"],
                                    "default": ["sha256"]},
            "read": {"type": "list", "elements": "str", "default": []},
            "read_max_bytes": {"type": "int", "default": 4194304},
        },
        supports_check_mode=True,
    )
    algorithms = module.params["checksum_algorithms"] if module.params["checksum"] else []
    try:
        files = probe(module.params["paths"], algorithms, module.params["read"], module.params["read_max_bytes"])
    except ValueError as err:
        module.fail_json(msg=str(err))
    module.exit_json(changed=False, files=files)


if __name__ == "__main__":
    main()
