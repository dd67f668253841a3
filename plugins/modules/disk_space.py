#!/usr/bin/python
"""Ansible module: free space on the filesystem that holds (or will hold) a path, read-only."""

from __future__ import annotations

DOCUMENTATION = r"""
module: disk_space
short_description: Free space on the filesystem that holds a path (read-only)
description:
  - Measures the filesystem a path lives on, or will live on once created; the nearest existing parent of the path
    is measured (symbolic links followed, like C(df)), and its mount point is reported.
  - Used instead of C(ansible_facts.mounts), which leaves out filesystems whose source is not a device path
    (a container's overlay root, ZFS datasets, tmpfs) and does not follow symbolic links.
  - Changes nothing; safe in check mode.
options:
  path:
    description: Absolute path; it need not exist.
    type: path
    required: true
extends_documentation_fragment:
  - vllm_node.vllm_node.read_only
author: vllm-node
"""

EXAMPLES = r"""
- name: Measure free space where models will live
  vllm_node.vllm_node.disk_space:
    path: /srv/vllm/models
  register: models_disk
"""

RETURN = r"""
path:
  description: The nearest existing parent of O(path) (O(path) itself when it exists), as given (links not resolved).
  type: str
  returned: success
  sample: /srv/vllm
mount:
  description: Mount point of the filesystem holding that path (links resolved).
  type: str
  returned: success
  sample: /
free_bytes:
  description: Bytes available to unprivileged users (C(df)'s "avail"), statvfs f_bavail x f_frsize.
  type: int
  returned: success
  sample: 1863017480192
total_bytes:
  description: Size of the filesystem in bytes.
  type: int
  returned: success
  sample: 3840755982336
"""

import os
from collections.abc import Callable

from ansible.module_utils.basic import AnsibleModule


def nearest_existing(path: str, exists: Callable[[str], bool] = os.path.exists) -> str:
    """The path itself if it exists, else its closest existing parent ('/' always exists)."""
    current = os.path.normpath(path)
    while not exists(current) and current != os.path.dirname(current):
        current = os.path.dirname(current)
    return current


def mount_point(path: str, ismount: Callable[[str], bool] = os.path.ismount) -> str:
    """The mount point of the filesystem holding an existing, link-resolved path."""
    current = path
    while not ismount(current) and current != os.path.dirname(current):
        current = os.path.dirname(current)
    return current


def main() -> None:
    module = AnsibleModule(argument_spec={"path": {"type": "path", "required": True}}, supports_check_mode=True)
    path = module.params["path"]
    if not os.path.isabs(path):
        module.fail_json(msg=f"path must be absolute, got '{path}'")
    existing = nearest_existing(path)
    real = os.path.realpath(existing)
    try:
        stats = os.statvfs(real)
    except OSError as err:
        module.fail_json(msg=f"cannot measure the filesystem of {existing}: {err}")
    module.exit_json(changed=False, path=existing, mount=mount_point(real),
                     free_bytes=stats.f_bavail * stats.f_frsize, total_bytes=stats.f_blocks * stats.f_frsize)


if __name__ == "__main__":
    main()
