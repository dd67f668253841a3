#!/usr/bin/python
"""Ansible module: delete the downloaded models (and LoRA adapters) that no unit on the node serves any more."""

from __future__ import annotations

DOCUMENTATION = r"""
module: model_download_unserved
short_description: Delete the downloaded models and adapters no unit on the node serves any more
description:
  - Lists the model directories under O(root) (C(<root>/<org>/<name>)) and, with O(lora_root), the adapters' under
    it, and deletes those the project downloaded that no unit serves. A directory is the project's when its record
    C(.vllm-node-download.json) (written by model_download and offline_bundle) names its own repo.
  - Never touches a repo in O(served_repos) or O(adapters) (in any revision, compared case-insensitively), nor a
    directory that is, contains or lies inside one of O(served_dirs); never a directory without that record, nor a
    symbolic link. Of a directory it deletes, only what the project writes goes (its 40-hex C(revisions/)
    directories, the record, the bundle's copy markers); anything else found there is kept and reported, with the
    directories holding it. A C(<org>) directory left empty is removed too.
  - The decisions are C(unserved_plan) in C(plugins/module_utils/model_download/files.py), the listing and the
    deletion C(scan_models) and C(delete_unserved) in C(plugins/module_utils/model_download/node.py).
  - Refuses an empty O(served_repos) (a play that did not plan this run, such as C(--tags prune) alone, would
    otherwise delete every model).
options:
  root:
    description: The models' root (model_download_root), absolute.
    type: path
    required: true
  lora_root:
    description: The LoRA adapters' root (model_download_lora_root); empty = adapters are left alone.
    type: str
    default: ""
  served_repos:
    description: The Hub repo ids of the models the node's units serve (the single model, or every instance's).
    type: list
    elements: str
    required: true
  served_dirs:
    description: The revision directories the units read (none of them nor what contains them is deleted).
    type: list
    elements: str
    default: []
  adapters:
    description: The repositories of the LoRA adapters the inventory lists (kept, under either root).
    type: list
    elements: str
    default: []
  check:
    description: Report what would be deleted and delete nothing (as in check mode).
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    description: Lists and measures; deletes nothing.
  diff_mode:
    support: full
    description: The paths deleted (before) and nothing (after).
author: vllm-node
"""

EXAMPLES = r"""
- name: Delete the downloaded models no unit serves any more
  vllm_node.vllm_node.model_download_unserved:
    root: /srv/vllm/models
    lora_root: /srv/vllm/models/lora
    served_repos: [org/served-model]
    served_dirs: ["/srv/vllm/models/org/served-model/revisions/{{ commit }}"]
    adapters: [org/served-adapter]
"""

RETURN = r"""
changed:
  description: Whether something was (or in check mode would be) deleted.
  type: bool
  returned: always
removed:
  description: Each model or adapter deleted, {repo, dir, bytes (freed), paths (deleted), rmdirs, left (kept)}.
  type: list
  elements: dict
  returned: success
bytes_freed:
  description: Bytes freed in all (files hard-linked from what stays not counted).
  type: int
  returned: success
left:
  description: Entries the project did not write, found in a deleted model's directory and kept.
  type: list
  elements: str
  returned: success
msg:
  description: One line naming what was (or would be) deleted and the bytes freed.
  type: str
  returned: success
"""

import os
from typing import Any

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.vllm_node.vllm_node.plugins.module_utils.model_download import files as mdf
from ansible_collections.vllm_node.vllm_node.plugins.module_utils.model_download import node


def check_inputs(root: str, served: list[str]) -> None:
    """Refuse a root that is not an absolute directory below / and a served list that is empty or not repo ids."""
    if not root.startswith("/") or os.path.normpath(root) == "/" or not served or not all(
            mdf.REPO_RE.match(repo) for repo in served):
        raise mdf.ModelDownloadError(
            f"model_download (unserved): root '{root}', served models {served}. The prune step needs this run's "
            "plan: run the whole play (not --tags prune alone), or set model_download_served_repos to the 'org/name' "
            "ids of every model the node serves and model_download_root to an absolute directory."
        )


def plans(params: dict[str, Any]) -> list[dict[str, Any]]:
    """mdf.unserved_plan over the models' root and, when it is another directory, the adapters' root."""
    root, lora_root = os.path.normpath(params["root"]), params["lora_root"]
    keep = [*params["served_repos"], *[a for a in params["adapters"] if a]]
    # nothing inside the adapters' root is the models' to delete, and the models' root is never the adapters'
    out = mdf.unserved_plan(node.scan_models(root), keep, [*params["served_dirs"], lora_root])
    if lora_root and os.path.normpath(lora_root) != root:
        out += mdf.unserved_plan(node.scan_models(os.path.normpath(lora_root)), keep, params["served_dirs"], [root])
    return out


def report(removed: list[dict[str, Any]], freed: int, check: bool) -> str:
    """The task's line: what went (or would go) and the bytes freed."""
    if not removed:
        return "model_download (unserved): every downloaded model is served; nothing to delete"
    names = ", ".join(f"{item['repo']} ({mdf.human(item['bytes'])})" for item in removed)
    return f"model_download (unserved): {'would delete' if check else 'deleted'} {names}; {mdf.human(freed)} freed"


def run(params: dict[str, Any], check: bool) -> dict[str, Any]:
    """List, decide, measure, delete."""
    check_inputs(params["root"], params["served_repos"])
    plan = plans(params)
    freed = mdf.freed_bytes(node.inodes([p for item in plan for p in item["paths"]]))
    removed = node.delete_unserved(plan, check)
    left = [path for item in removed for path in item["left"]]
    gone = [p for item in removed for p in item["paths"] + item["rmdirs"]]
    return {"changed": bool(removed), "removed": removed, "bytes_freed": freed, "left": left,
            "msg": report(removed, freed, check) + (f"; kept what the project did not write: {left}" if left else ""),
            "diff": {"before": "".join(f"{p}\n" for p in gone), "after": "",
                     "before_header": f"{params['root']} (models no unit serves)", "after_header": "deleted"}}


def main() -> None:
    """Run the module."""
    module = AnsibleModule(
        argument_spec={
            "root": {"type": "path", "required": True},
            "lora_root": {"type": "str", "default": ""},
            "served_repos": {"type": "list", "elements": "str", "required": True},
            "served_dirs": {"type": "list", "elements": "str", "default": []},
            "adapters": {"type": "list", "elements": "str", "default": []},
            "check": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    try:
        result = run(module.params, module.check_mode or module.params["check"])
    except (mdf.ModelDownloadError, OSError) as exc:
        module.fail_json(msg=str(exc) if isinstance(exc, mdf.ModelDownloadError) else f"model_download: {exc!r}")
    if not module._diff or not result["changed"]:
        result.pop("diff", None)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
