"""Action plugin: download a Hugging Face model to the node, metadata first, then the shards; verified, resumable.

The role model_download calls it once per step (its tasks are a table of contents). The decisions are in
plugins/module_utils/model_download/files.py, the node's work in the module model_download_node (over
module_utils/model_download/node.py), the wait with progress lines in module_utils/model_download/wait.py.

Steps: `metadata` (resolve and record the revision, move an old layout, link unchanged files of verified
revisions, fetch the small files, read the planner's documents), `all` (metadata, then the disk check, the
background download with progress, hf cache verify with optional repair) and `seal` (hash the small files and
write the completion marker; the role runs it only when `all` says the revision is not sealed yet).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.vllm_node.vllm_node.plugins.module_utils.model_download import files as mdf
from ansible_collections.vllm_node.vllm_node.plugins.module_utils.model_download import wait as mdw

display = Display()

NODE = "vllm_node.vllm_node.model_download_node"
LINK = "vllm_node.vllm_node.model_download_link"
ARGUMENT_SPEC: dict[str, dict[str, Any]] = {
    "step": {"type": "str", "required": True, "choices": ["metadata", "all", "seal"]},
    "request": {"type": "dict", "required": True},
    "token": {"type": "str", "default": "", "no_log": True},
    "handed_over": {"type": "bool", "default": False},
    "check_mode": {"type": "bool", "default": False},
    "commit": {"type": "str", "default": ""},
    "files": {"type": "list", "elements": "dict", "default": []},
}
# The request's keys and their types (the role passes every model_download_* input in one dict).
REQUEST_TYPES: dict[str, type | tuple[type, ...]] = {
    "repo": str, "revision": str, "refresh": bool, "root": str, "base_dir": str, "keep_revisions": int,
    "hf_cli": str, "endpoint": str, "hf_home": str, "include": list, "exclude": list, "metadata_patterns": list,
    "disk_margin_bytes": int, "disk_margin_percent": (int, float), "progress_interval": int,
    "timeout_seconds": int, "max_workers": int, "verify": bool, "reverify": bool, "repair": bool, "owner": str,
    "group": str, "ca_bundle": str, "environment": dict,
}


def typed_request(raw: dict[str, Any]) -> dict[str, Any]:
    """The request with Ansible's strings made ints, floats and bools; refuses a missing key."""
    missing = sorted(set(REQUEST_TYPES) - set(raw))
    if missing:
        raise mdf.ModelDownloadError(f"model_download: the request lacks {missing}; pass the role's whole request")
    out = dict(raw)
    for key, kind in REQUEST_TYPES.items():
        value = raw[key]
        try:
            if kind is bool and isinstance(value, str):
                out[key] = value.strip().lower() in ("1", "true", "yes", "on")
            elif kind is int:
                out[key] = int(value)
            elif kind == (int, float):
                out[key] = float(value)
            elif kind is str:
                out[key] = "" if value is None else str(value)
        except (TypeError, ValueError) as exc:
            raise mdf.ModelDownloadError(
                f"model_download: model_download_{key} must be {getattr(kind, '__name__', 'a number')}, got "
                f"{value!r}; set it to one"
            ) from exc
    return out


def parse_doc(name: str, text: str | None) -> dict[str, Any] | None:
    """A metadata document as JSON; a damaged one is refused with the fix."""
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise mdf.ModelDownloadError(
            f"model_download: {name} of the model is not JSON ({exc}); delete it and run again to fetch it anew"
        ) from exc


class ActionModule(ActionBase):
    """One step of model_download; returns `facts` (the role publishes them) and `seal`."""

    TRANSFERS_FILES = False
    _supports_check_mode = True
    _supports_async = False

    # Seams for the unit tests (a fake clock instead of real sleeps).
    clock: Callable[[], float] = staticmethod(time.monotonic)
    sleep: Callable[[float], None] = staticmethod(time.sleep)

    def run(self, tmp: str | None = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        """Run the step; a refusal fails the task with its message."""
        result = super().run(tmp, task_vars)
        self._vars = task_vars or {}
        self._changed = False
        self._diffs: list[dict[str, Any]] = []
        self._messages: list[str] = []
        _, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        self._check = bool(self._task.check_mode or args["check_mode"])
        self._token = args["token"]
        try:
            self._req = typed_request(args["request"])
            mdf.check_request(self._req)
            if args["step"] == "seal":
                facts, seal = self._seal(args["commit"], args["files"]), False
            else:
                facts, seal = self._download(args["step"], args["handed_over"])
        except (mdf.ModelDownloadError, ValueError) as exc:
            raise AnsibleActionFail(str(exc)) from exc
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)
        result.update(changed=self._changed, facts=facts, seal=seal, messages=self._messages)
        if self._diffs and self._task.diff:
            result["diff"] = self._diffs
        return result

    # ---- plumbing ----------------------------------------------------------------------------------------------

    def _node(self, op: str, **args: Any) -> dict[str, Any]:
        """One step on the node; its failure is the task's (its message says what, why and the fix)."""
        res = self._execute_module(module_name=NODE, task_vars=self._vars, module_args={
            "op": op, "request": self._req, "check": self._check, **args})
        if res.get("failed"):
            raise mdf.ModelDownloadError(str(res.get("msg") or f"model_download: the node's step {op} failed: {res}"))
        self._changed = self._changed or bool(res.get("changed"))
        if res.get("diff") and res.get("changed"):
            self._diffs.append(res["diff"])
        return res

    def _say(self, line: str) -> None:
        """A line in the play's output (and in the result's messages)."""
        self._messages.append(line)
        display.display(line)

    @property
    def _dir(self) -> str:
        return f"{self._req['base_dir']}/revisions/{self._commit}"

    # ---- the steps -----------------------------------------------------------------------------------------------

    def _download(self, step: str, handed_over: bool) -> tuple[dict[str, Any], bool]:
        """metadata, then (step all) the shards; returns the facts and whether the revision still needs its seal."""
        req = self._req
        prepared = self._node("prepare")
        for line in prepared["messages"]:
            self._say(line)
        record = prepared["record"]
        if not mdf.record_reusable(record, req, handed_over) and not self._check:
            record = self._node("resolve", token=self._token)["record"]
        if not record or not record.get("commit"):
            self._say(f"model_download (check mode): {req['repo']}@{req['revision']} is not recorded in "
                      f"{req['base_dir']} yet; a real run would resolve it, fetch the metadata and then the shards.")
            return {}, False
        self._commit, self._files = str(record["commit"]), list(record["files"])
        probe = self._node("look", commit=self._commit)
        probe = self._link(probe)
        probe = self._metadata_files(probe)
        facts = self._metadata_facts()
        if step == "all":
            return self._shards(probe, facts)
        return facts, False

    def _link(self, probe: dict[str, Any]) -> dict[str, Any]:
        """Hard-link the files a verified revision holds with the same sha256 instead of downloading them."""
        lfs = [f for f in self._files if f.get("sha256")]
        if self._check or not mdf.missing_files(lfs, probe["files"]):
            return probe
        others = {k: v for k, v in probe["markers"].items() if k != self._commit}
        verified = mdf.verified_revisions(others, f"{self._req['base_dir']}/revisions")
        plan = mdf.link_plan(self._files, probe["files"], verified)
        if not plan:
            return probe
        res = self._execute_module(module_name=LINK, task_vars=self._vars,
                                   module_args={"dir": self._dir, "links": plan})
        if res.get("failed"):
            raise mdf.ModelDownloadError(str(res.get("msg")))
        not_linked = f", not linked: {json.dumps(res['not_linked'])}" if res["not_linked"] else ""
        self._say(f"model_download: {len(res['linked'])} files ({mdf.human(res['linked_bytes'])}) linked from "
                  f"verified revisions instead of downloaded{not_linked}")
        if not res["linked"]:
            return probe
        self._changed = True
        return self._node("look", commit=self._commit)

    def _metadata_files(self, probe: dict[str, Any]) -> dict[str, Any]:
        """Fetch the small files that are missing (model_config's originals put back first)."""
        req = self._req
        meta = mdf.split_metadata(self._files, req["metadata_patterns"])
        missing = mdf.missing_files(meta, probe["files"])
        if self._check or not missing:
            return probe
        res = self._node("hf", commit=self._commit, token=self._token,
                         names=mdf.originals_to_restore(self._files, probe["files"]),
                         argv=mdf.download_argv(req, self._commit, self._dir, [f["path"] for f in missing]))["hf"]
        self._changed = True
        if res.get("rc") != 0 or mdf.offline_fallback(res.get("stdout", ""), res.get("stderr", "")):
            raise mdf.ModelDownloadError(
                f"model_download: hf download of the metadata files of {req['repo']}@{self._commit} failed or could "
                f"not reach {req['endpoint']} (rc {res.get('rc')}; it exits 0 when it falls back to the local "
                f"directory): {(res.get('stderr') or res.get('msg') or '')[-1500:]}"
            )
        probe = self._node("look", commit=self._commit)
        still = mdf.missing_files(meta, probe["files"])
        if still:
            raise mdf.ModelDownloadError(
                f"model_download: metadata files missing or with a wrong size after hf download: "
                f"{[f['path'] for f in still]}"
            )
        return probe

    def _metadata_facts(self) -> dict[str, Any]:
        """The files for the service user, then the planner's documents as facts."""
        meta = {f["path"] for f in mdf.split_metadata(self._files, self._req["metadata_patterns"])}
        docs = self._node("finish", commit=self._commit, names=[n for n in mdf.PLANNER_DOCS if n in meta])["docs"]
        config, index, quant = (parse_doc(n, docs.get(n)) for n in mdf.PLANNER_DOCS)
        inputs = mdf.planner_inputs(config, index, quant, self._files)
        facts = {
            "model_download_commit": self._commit,
            "model_download_files": self._files,
            "model_download_dir": self._dir,
            "model_download_config": inputs["config"],
            "model_download_index": index or {},
            "model_download_quant_config": inputs["quant_config"],
            "model_download_checkpoint_bytes": inputs["checkpoint_bytes"],
            "model_download_shard_bytes": mdf.shard_bytes(self._files),
        }
        self._say(f"{self._req['repo']}@{self._commit} (requested {self._req['revision']}): {len(self._files)} files, "
                  f"checkpoint {inputs['checkpoint_bytes']} bytes ({mdf.human(inputs['checkpoint_bytes'])}), "
                  f"architectures {inputs['config'].get('architectures', '?')}, in {self._dir}")
        return facts

    def _shards(self, probe: dict[str, Any], facts: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """Disk check, download with progress, verification; the facts of a complete revision."""
        req, files = self._req, self._files
        marker = parse_doc(mdf.MARKER_NAME, probe["markers"].get(self._commit))
        complete = mdf.marker_complete(marker, self._commit, files, probe["files"], req["verify"])
        missing = mdf.missing_files(files, probe["files"])
        self._say(f"{req['repo']}@{self._commit}: " + (
            "complete and verified, nothing to download" if complete else
            f"{len(missing)} of {len(files)} files missing, {mdf.human(mdf.total_size(missing))} to download"))
        if not complete and missing and not self._check:
            probe = self._fetch(missing, probe, facts["model_download_checkpoint_bytes"])
        if req["verify"] and (not complete or req["reverify"]) and not self._check:
            self._verify(probe, facts["model_download_checkpoint_bytes"])
        seal = not complete and not self._check
        if seal:
            self._node("finish", commit=self._commit)
            return facts, True
        hashes = dict((marker or {}).get("sha256") or {})
        return {**facts, "model_download_complete": complete or not self._check,
                "model_download_bytes": mdf.total_size(files), "model_download_file_sha256": hashes,
                "model_download_manifest_sha256": mdf.manifest_sha256(hashes) if hashes else ""}, False

    def _fetch(self, missing: list[dict[str, Any]], probe: dict[str, Any], checkpoint: int) -> dict[str, Any]:
        """One df, then hf download in the background, waited for with progress lines; checked afterwards."""
        req = self._req
        missing_bytes = mdf.total_size(missing)
        self._say(mdf.check_disk(probe["free_bytes"], missing_bytes, req, self._dir, checkpoint))
        job = self._node("start", commit=self._commit, token=self._token,
                         argv=mdf.download_argv(req, self._commit, self._dir))["job"]
        host = self._vars.get("inventory_hostname", "")
        try:
            res = mdw.wait(lambda: self._poll(job),
                           label=f"{host} | {req['repo']}" if host else req["repo"], total_bytes=missing_bytes,
                           start_bytes=probe["tree_bytes"], interval=req["progress_interval"],
                           timeout=req["timeout_seconds"], clock=self.clock, sleep=self.sleep, show=display.display)
        finally:
            self._node("stop", job=job)
        if res.get("failed"):
            raise mdf.ModelDownloadError(mdf.download_failure(req["repo"], self._commit, res, req["timeout_seconds"]))
        if mdf.offline_fallback(res.get("stdout", ""), res.get("stderr", "")):
            raise mdf.ModelDownloadError(
                f"model_download: hf could not reach {req['endpoint']} and returned the incomplete local directory "
                f"(with exit code 0): {(res.get('stderr') or '')[-1500:]}"
            )
        probe = self._node("look", commit=self._commit)
        still = mdf.missing_files(self._files, probe["files"])
        if still:
            raise mdf.ModelDownloadError(
                f"model_download: files missing or with a wrong size after hf download: {[f['path'] for f in still]}. "
                "Run the play again to resume."
            )
        return probe

    def _poll(self, job: dict[str, Any]) -> dict[str, Any]:
        """The background job's status and the bytes in the revision's directory (what wait() reads)."""
        res = self._node("poll", commit=self._commit, job=job)
        return {**res["job"], "bytes": res["bytes"]}

    def _verify(self, probe: dict[str, Any], checkpoint: int) -> None:
        """hf cache verify against the Hub's checksums; with repair, the corrupted files are fetched again once."""
        req = self._req

        def verify(probe: dict[str, Any]) -> dict[str, Any]:
            return self._node("hf", commit=self._commit, token=self._token,
                              names=mdf.originals_to_restore(self._files, probe["files"]),
                              argv=mdf.verify_argv(req, self._commit, self._dir))["hf"]

        res = verify(probe)
        bad = mdf.verify_mismatches(res.get("stdout", ""))
        if res.get("rc") != 0 and req["repair"] and bad:
            self._node("forget", commit=self._commit, names=bad)
            probe = self._node("look", commit=self._commit)
            probe = self._fetch(mdf.missing_files(self._files, probe["files"]), probe, checkpoint)
            res = verify(probe)
            bad = mdf.verify_mismatches(res.get("stdout", ""))
        if res.get("rc") != 0:
            output = f"{res.get('stdout', '')} {res.get('stderr') or res.get('msg') or ''}"[-2500:]
            raise mdf.ModelDownloadError(
                f"model_download: {req['repo']}@{self._commit} in {self._dir} failed verification (rc {res.get('rc')}):"
                f" {output} Corrupted: {bad}. Delete them and run again, or set model_download_repair=true to have "
                "them deleted and fetched again."
            )
        self._say(str(res.get("stdout", "")).strip())

    def _seal(self, commit: str, files: list[dict[str, Any]]) -> dict[str, Any]:
        """The sha256 of every file (the small ones measured) and the completion marker: the revision is complete."""
        if not mdf.is_commit(commit) or not files:
            raise mdf.ModelDownloadError(
                "model_download (seal): give the commit and files of the `all` step (its facts); run that step first"
            )
        self._commit = commit
        res = self._node("seal", commit=commit, files=files)
        return {"model_download_complete": True, "model_download_bytes": mdf.total_size(files),
                "model_download_file_sha256": res["sha256"], "model_download_manifest_sha256": res["manifest_sha256"]}
