#!/usr/bin/python
"""Ansible module: the node-side steps of the model_download action plugin (module_utils/model_download/node.py)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: model_download_node
short_description: The node-side steps of a model download (used by the model_download action plugin)
description:
  - One step per call, chosen by O(op); the action plugin M(vllm_node.vllm_node.model_download) strings them
    together. The code is C(plugins/module_utils/model_download/node.py) and its decisions
    C(plugins/module_utils/model_download/files.py).
  - V(prepare) checks the hf CLI and the owner, creates the model directories, reads the record and moves the
    layout before C(revisions/) into the directory of its commit. V(resolve) asks the Hub (C(hf models info),
    C(hf models ls)) and writes the record. V(look) creates the revision's directory and lists its files, the
    completion markers of every revision and the free space. V(hf) runs hf in the foreground, V(start) in the
    background (V(poll), V(stop)). V(forget) deletes files that failed verification. V(finish) gives the service
    user the files and reads the planner's documents. V(seal) hashes the small files and writes the completion
    marker. V(prune) deletes the revisions no longer kept.
  - The Hub token (O(token)) is written to a 0600 file read through C(HF_TOKEN_PATH) only while hf runs.
options:
  op:
    description: The step.
    type: str
    required: true
    choices: [prepare, resolve, look, hf, start, poll, stop, forget, finish, seal, prune]
  request:
    description: The role's inputs (repo, revision, base_dir, endpoint, hf_cli, hf_home, owner, group, ...).
    type: dict
    required: true
  token:
    description: Hub token for private or gated repos (V(hf), V(resolve), V(start)).
    type: str
    default: ""
  commit:
    description: The revision's commit (its directory is C(<base_dir>/revisions/<commit>)).
    type: str
    default: ""
  argv:
    description: The hf arguments (V(hf), V(start)).
    type: list
    elements: str
    default: []
  names:
    description: Paths inside the revision (V(hf) originals to put back, V(forget) files, V(finish) documents to read).
    type: list
    elements: str
    default: []
  files:
    description: The revision's files [{path, size, sha256}] (V(seal)).
    type: list
    elements: dict
    default: []
  job:
    description: A background job as V(start) returned it (V(poll), V(stop)).
    type: dict
    default: {}
  check:
    description: Report what would change and change nothing (as in check mode).
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    description: Read-only steps run; the others report what they would change.
  diff_mode:
    support: partial
    description: V(resolve) and V(seal) return the diff of the record or marker they write.
author: vllm-node
"""

EXAMPLES = r"""
- name: Delete the revisions no longer served
  vllm_node.vllm_node.model_download_node:
    op: prune
    request: {repo: org/name, base_dir: /srv/vllm/models/org/name, keep_revisions: 1,
              serving_dir: "/srv/vllm/models/org/name/revisions/{{ commit }}"}
"""

RETURN = r"""
changed:
  description: Whether the step changed (or in check mode would change) anything.
  type: bool
  returned: always
record:
  description: The record of the request (V(prepare), V(resolve)); null when there is none.
  type: dict
  returned: op is prepare or resolve
files:
  description: "{path: size} of the revision's directory (V(look))."
  type: dict
  returned: op is look
hf:
  description: hf's result (rc, stdout, stderr, cmd, msg) of a V(hf) step.
  type: dict
  returned: op is hf
job:
  description: A background job (V(start)), or its status (V(poll)) with rc, stdout and stderr once finished.
  type: dict
  returned: op is start or poll
pruned:
  description: The commits whose directories were deleted (V(prune)).
  type: list
  elements: str
  returned: op is prune
"""

import json
import os
import time
from datetime import UTC, datetime
from typing import Any

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.vllm_node.vllm_node.plugins.module_utils.model_download import files as mdf
from ansible_collections.vllm_node.vllm_node.plugins.module_utils.model_download import node


def now() -> str:
    """UTC time stamp of the records."""
    return datetime.now(UTC).isoformat()


def revision_dir(req: dict[str, Any], commit: str) -> str:
    """<base_dir>/revisions/<commit>."""
    return os.path.join(req["base_dir"], "revisions", commit)


def token_file(req: dict[str, Any]) -> str:
    """The transient token file in the root-only HF_HOME."""
    return os.path.join(req["hf_home"], "token")


def prepare(req: dict[str, Any], check: bool) -> dict[str, Any]:
    """hf CLI and owner checks, the directories, the record, the old layout moved into revisions/<commit>."""
    hf = req["hf_cli"]
    exists = os.path.exists(hf)
    if (exists or not check) and not (exists and os.access(hf, os.X_OK)):
        raise mdf.ModelDownloadError(
            f"model_download: {hf} is missing or not executable. Run the vllm_env role first (its venv ships "
            "huggingface_hub's `hf`), or point model_download_hf_cli at an hf CLI (huggingface_hub >= 1.1)."
        )
    try:
        uid, gid = node.ids(req["owner"], req["group"])
    except KeyError as exc:
        if not check:
            raise mdf.ModelDownloadError(
                f"model_download: user '{req['owner']}' or group '{req['group']}' does not exist. Run the vllm_env "
                "role first (it creates the service user) or set model_download_owner / model_download_group to an "
                "existing user and group."
            ) from exc
        uid, gid = -1, -1
    base, revisions = req["base_dir"], os.path.join(req["base_dir"], "revisions")
    changed = False
    for path, owner, mode in ((req["root"], (0, 0), 0o755), (os.path.dirname(base), (0, 0), 0o755),
                              (base, (uid, gid), 0o750), (revisions, (uid, gid), 0o750),
                              (req["hf_home"], (0, 0), 0o700)):
        changed = node.ensure_dir(path, owner[0], owner[1], mode, check) or changed
    record = node.read_json(os.path.join(base, mdf.RECORD_NAME))
    record = record if isinstance(record, dict) else None
    messages = []
    flat = node.flat_entries(base)
    if flat:
        commit = mdf.layout_commit(flat, node.read_text(os.path.join(base, mdf.MARKER_NAME)), record)
        if not mdf.is_commit(commit):
            raise mdf.ModelDownloadError(
                f"model_download: {base} holds files directly ({', '.join(flat)}) but no recorded commit "
                f"({mdf.MARKER_NAME} or {mdf.RECORD_NAME} there), so the role cannot tell which revision they are. "
                f"Move them into {revisions}/<their 40-hex commit>/ (or delete them) and run again."
            )
        target = os.path.join(revisions, commit)
        changed = True
        if not check:
            node.ensure_dir(target, uid, gid, 0o750, check)
            left = node.move_flat(base, flat, target)
            if left:
                raise mdf.ModelDownloadError(
                    f"model_download: could not move {left} into {target} (a file of the same name is already "
                    "there). Compare and delete one of the two copies, then run again."
                )
        messages.append(f"model_download: {'would move' if check else 'moved'} {len(flat)} entries of {base} (the "
                        f"layout before revisions/) into {target}; this revision is verified once more.")
    return {"changed": changed, "record": record, "messages": messages, "hf_exists": exists}


def resolve(req: dict[str, Any], token: str, check: bool) -> dict[str, Any]:
    """Ask the Hub for the commit of the revision and its files; record them."""
    env = mdf.hf_env(req, token_file(req))
    commit, res = req["revision"], {}
    if not mdf.is_commit(commit):
        argv = [req["hf_cli"], "models", "info", req["repo"], "--revision", commit, "--expand", "sha", "--format",
                "json"]
        res = node.run_hf(argv, env, token_file(req), token, req["timeout_seconds"])
        commit = str(json.loads(res["stdout"]).get("sha") or "") if res["rc"] == 0 else ""
    if commit:
        argv = [req["hf_cli"], "models", "ls", req["repo"], "--recursive", "--revision", commit, "--format", "json"]
        res = node.run_hf(argv, env, token_file(req), token, req["timeout_seconds"])
    if not commit or res.get("rc") != 0:
        raise mdf.ModelDownloadError(
            f"model_download: could not resolve {req['repo']}@{req['revision']} or list its files on "
            f"{req['endpoint']}: {(res.get('stderr') or res.get('msg') or '')[-1500:]} Check the repo id and "
            "revision, the endpoint (model_download_endpoint / HF_ENDPOINT), and for private or gated repos the "
            "token (vllm_node_hf_token / model_download_token)."
        )
    record = mdf.new_record(req, commit, json.loads(res["stdout"]), now())
    uid, gid = node.ids(req["owner"], req["group"])
    written = node.write_json(os.path.join(req["base_dir"], mdf.RECORD_NAME), record, uid, gid, check)
    return {**written, "record": record}


def look(req: dict[str, Any], commit: str, check: bool) -> dict[str, Any]:
    """The revision's directory (created), its files, every revision's marker, the free space."""
    directory = revision_dir(req, commit)
    uid, gid = node.ids(req["owner"], req["group"]) if not check else (-1, -1)
    changed = node.ensure_dir(directory, uid, gid, 0o750, check) if not check else not os.path.isdir(directory)
    found = node.list_files(directory) if os.path.isdir(directory) else {}
    measured = directory
    while not os.path.exists(measured):
        measured = os.path.dirname(measured)
    stats = os.statvfs(measured)
    return {"changed": changed, "files": mdf.local_sizes(found), "tree_bytes": sum(found.values()),
            "markers": node.markers(os.path.dirname(directory)), "free_bytes": stats.f_bavail * stats.f_frsize}


def finish(req: dict[str, Any], commit: str, names: list[str], check: bool) -> dict[str, Any]:
    """The files for the service user; the planner's documents (from model_config's originals)."""
    directory = revision_dir(req, commit)
    changed = False
    if os.path.isdir(directory):
        try:
            uid, gid = node.ids(req["owner"], req["group"])
            changed = node.own_tree(directory, uid, gid, check)
        except KeyError:
            if not check:
                raise
            changed = True  # check mode before vllm_env created the owner
    docs = {}
    for name in names:
        path = os.path.join(directory, name)
        text = node.read_text(path + ".orig" if os.path.exists(path + ".orig") else path)
        if text is not None:
            docs[name] = text
    return {"changed": changed, "docs": docs}


def seal(req: dict[str, Any], commit: str, files: list[dict[str, Any]], check: bool) -> dict[str, Any]:
    """Every file's sha256 (the small ones measured, the original bytes) and the completion marker."""
    directory = revision_dir(req, commit)
    hashed = node.hash_small_files(directory, [f["path"] for f in files if not f.get("sha256")])
    hashes = mdf.file_sha256(files, hashed)
    marker = mdf.new_marker(req["repo"], commit, files, bool(req["verify"]), hashes, now())
    uid, gid = node.ids(req["owner"], req["group"])
    written = node.write_json(os.path.join(directory, mdf.MARKER_NAME), marker, uid, gid, check)
    return {**written, "sha256": hashes, "manifest_sha256": marker["manifest_sha256"]}


def run(params: dict[str, Any], check: bool) -> dict[str, Any]:
    """Dispatch one step; ModelDownloadError carries the refusal."""
    op, req, commit, token = params["op"], params["request"], params["commit"], params["token"]
    if op == "prepare":
        return prepare(req, check)
    if op == "resolve":
        return resolve(req, token, check)
    if op == "look":
        return look(req, commit, check)
    if op == "finish":
        return finish(req, commit, params["names"], check)
    if op == "seal":
        return seal(req, commit, params["files"], check)
    if op == "prune":
        revisions = os.path.join(req["base_dir"], "revisions")
        try:
            keep = int(req["keep_revisions"])
        except (TypeError, ValueError):
            keep = 0
        serving = mdf.check_prune(revisions, str(req["serving_dir"] or ""), keep, req["repo"])
        pruned = node.prune(revisions, serving, keep, check)
        return {"changed": bool(pruned), "pruned": pruned}
    env = mdf.hf_env(req, token_file(req))
    argv = [req["hf_cli"], *params["argv"]]
    if op == "hf":
        changed = False
        if params["names"]:
            uid, gid = node.ids(req["owner"], req["group"])
            changed = node.restore_originals(revision_dir(req, commit), params["names"], uid, gid)
        # hf's own result goes under `hf`: a top-level non-zero rc would mark this step failed
        return {"hf": node.run_hf(argv, env, token_file(req), token, req["timeout_seconds"]), "changed": changed}
    if op == "start":
        job_dir = os.path.join(req["hf_home"], "jobs", f"{int(time.time())}.{os.getpid()}")
        pid = node.spawn(argv, env, job_dir, token_file(req), token, req["timeout_seconds"])
        return {"changed": True, "job": {"dir": job_dir, "pid": pid}}
    if op == "poll":
        status = node.job_status(params["job"]["dir"], int(params["job"]["pid"]))
        return {"job": status, "changed": False, "bytes": node.tree_bytes(revision_dir(req, commit))}
    if op == "stop":
        return {"changed": False, "killed": node.stop(params["job"]["dir"], token_file(req))}
    node.forget(revision_dir(req, commit), params["names"])  # op == "forget"
    return {"changed": True}


def main() -> None:
    """Run the module."""
    module = AnsibleModule(
        argument_spec={
            "op": {"type": "str", "required": True, "choices": ["prepare", "resolve", "look", "hf", "start", "poll",
                                                                "stop", "forget", "finish", "seal", "prune"]},
            "request": {"type": "dict", "required": True},
            "token": {"type": "str", "default": "", "no_log": True},
            "commit": {"type": "str", "default": ""},
            "argv": {"type": "list", "elements": "str", "default": []},
            "names": {"type": "list", "elements": "str", "default": []},
            "files": {"type": "list", "elements": "dict", "default": []},
            "job": {"type": "dict", "default": {}},
            "check": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    try:
        result = run(module.params, module.check_mode or module.params["check"])
    except (mdf.ModelDownloadError, OSError, KeyError) as exc:
        module.fail_json(msg=str(exc) if isinstance(exc, mdf.ModelDownloadError) else f"model_download: {exc!r}")
    if not module._diff:
        result.pop("diff", None)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
