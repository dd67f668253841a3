#!/usr/bin/python
"""Ansible module: hard-link unchanged files of another model revision into a new revision's directory."""

from __future__ import annotations

DOCUMENTATION = r"""
module: model_download_link
short_description: Hard-link the unchanged files of a verified model revision into a new revision's directory
description:
  - Used by the action plugin M(vllm_node.vllm_node.model_download) before C(hf download) of a new revision. Each
    file listed in O(links) is hard-linked from its O(links[].source) (a file of another, verified revision with the
    same sha256) to O(dir)/O(links[].path), so the new revision costs neither download nor disk space for it.
  - hf's bookkeeping of the source (O(links[].metadata), C(.cache/huggingface/download/<path>.metadata)) is copied,
    not linked, beside the new file; C(hf download) then only compares the ETag with one HEAD request (without it, hf
    hashes the file) and rewrites its own copy.
  - A link is made under a temporary name and renamed over the destination, so the destination is never half
    there. A source whose size is not O(links[].size), or on another filesystem, is left out (then downloaded).
  - Safe because nothing writes a model file in place - hf replaces a file it downloads (unlink, then rename) and
    model_config writes by rename - so a change in one revision never reaches the other.
options:
  dir:
    description: The new revision's directory (it must exist).
    type: path
    required: true
  links:
    description: What to link, as C(link_plan) of C(plugins/module_utils/model_download/files.py) returns it.
    type: list
    elements: dict
    required: true
    suboptions:
      path:
        description: Path of the file inside O(dir) (the repo path).
        type: str
        required: true
      size:
        description: Expected size in bytes.
        type: int
        required: true
      source:
        description: Absolute path of the file to link.
        type: path
        required: true
      metadata:
        description: Absolute path of hf's metadata file of the source (may be absent).
        type: path
attributes:
  check_mode:
    support: full
    description: Reports what would be linked and changes nothing.
  diff_mode:
    support: none
    description: No diff.
author: vllm-node
"""

EXAMPLES = r"""
- name: Link the shards that did not change since the serving revision
  vllm_node.vllm_node.model_download_link:
    dir: /srv/vllm/models/org/name/revisions/0123456789abcdef0123456789abcdef01234567
    links:
      - path: model-00002.safetensors
        size: 4294967296
        source: /srv/vllm/models/org/name/revisions/89abcdef0123456789abcdef0123456789abcdef/model-00002.safetensors
"""

RETURN = r"""
linked:
  description: Paths linked (or that would be linked in check mode).
  type: list
  elements: str
  returned: success
  sample: [model-00002-of-00003.safetensors]
linked_bytes:
  description: Sum of the sizes of the linked files (bytes not downloaded).
  type: int
  returned: success
  sample: 4294967296
not_linked:
  description: Files not linked, with the reason; they are downloaded instead.
  type: list
  elements: dict
  returned: success
  sample: [{path: model-00001-of-00003.safetensors, reason: "source size 10 != 12"}]
"""

import errno
import os
from collections.abc import Mapping
from typing import Any

from ansible.module_utils.basic import AnsibleModule

HF_METADATA_DIR = os.path.join(".cache", "huggingface", "download")


def destination(root: str, path: str) -> str:
    """root/path, refusing a path that leaves root (absolute, or with '..')."""
    norm = os.path.normpath(path)
    if os.path.isabs(path) or norm == ".." or norm.startswith(".." + os.sep) or norm in ("", "."):
        raise ValueError(f"link path {path!r} is not a relative path inside the revision directory")
    return os.path.join(root, norm)


def link_reason(link: Mapping[str, Any], dest: str) -> str | None:
    """Why a link cannot or need not be made (None: make it). Reads the filesystem only."""
    try:
        source = os.stat(link["source"])
    except OSError as exc:
        return f"source unreadable: {exc.strerror}"
    if source.st_size != int(link["size"]):
        return f"source size {source.st_size} != {link['size']}"
    try:
        if os.path.samefile(link["source"], dest):
            return "already linked"
    except OSError:
        pass
    return None


def replace_with_link(source: str, dest: str) -> None:
    """Hard-link source at dest atomically (temporary name in dest's directory, then rename over dest)."""
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    tmp = f"{dest}.vllm-node-link.{os.getpid()}"
    if os.path.lexists(tmp):
        os.unlink(tmp)
    os.link(source, tmp)
    try:
        os.replace(tmp, dest)
    except OSError:
        os.unlink(tmp)
        raise


def copy_metadata(source: str, dest: str) -> None:
    """Copy hf's small metadata file (content only; the timestamp inside is what hf reads) by rename."""
    with open(source, "rb") as handle:
        data = handle.read()
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    tmp = f"{dest}.vllm-node-link.{os.getpid()}"
    with open(tmp, "wb") as handle:
        handle.write(data)
    os.replace(tmp, dest)


def run(root: str, links: list[Mapping[str, Any]], check_mode: bool) -> dict[str, Any]:
    """Link every file that can be linked; returns the module's result (changed, linked, linked_bytes, not_linked)."""
    linked: list[str] = []
    not_linked: list[dict[str, str]] = []
    total = 0
    for link in links:
        dest = destination(root, link["path"])
        reason = link_reason(link, dest)
        if reason == "already linked":
            continue
        if reason is not None:
            not_linked.append({"path": link["path"], "reason": reason})
            continue
        if not check_mode:
            try:
                replace_with_link(link["source"], dest)
            except OSError as exc:
                if exc.errno in (errno.EXDEV, errno.EPERM, errno.EMLINK):
                    not_linked.append({"path": link["path"], "reason": f"cannot hard-link: {exc.strerror}"})
                    continue
                raise
            metadata = link.get("metadata")
            if metadata and os.path.isfile(metadata):
                copy_metadata(metadata, destination(os.path.join(root, HF_METADATA_DIR), link["path"] + ".metadata"))
        linked.append(link["path"])
        total += int(link["size"])
    return {"changed": bool(linked), "linked": linked, "linked_bytes": total, "not_linked": not_linked}


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "dir": {"type": "path", "required": True},
            "links": {"type": "list", "elements": "dict", "required": True, "options": {
                "path": {"type": "str", "required": True},
                "size": {"type": "int", "required": True},
                "source": {"type": "path", "required": True},
                "metadata": {"type": "path"},
            }},
        },
        supports_check_mode=True,
    )
    root = module.params["dir"]
    if not os.path.isdir(root):
        module.fail_json(msg=f"model_download_link: {root} is not a directory; create the revision directory first")
    try:
        result = run(root, module.params["links"], module.check_mode)
    except (OSError, ValueError) as exc:
        module.fail_json(msg=f"model_download_link: {exc}")
    module.exit_json(**result)


if __name__ == "__main__":
    main()
