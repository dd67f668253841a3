"""Wait for a background `hf download` and print its progress: one task, one log block, a hard time bound.

The download is started by the role with `async`/`poll: 0` (it may last hours); this action starts nothing
itself. Every `interval` seconds it asks the node for the job's status (async_status) and the bytes in the
model directory (find), and prints one line: bytes done / total, percent, rate, ETA. When the job has finished
it removes the job's status file and returns the job's own result (rc, stdout, stderr, cmd, msg), so that the
role judges hf's exit status and output as if the command had run in the foreground.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.vllm_node.vllm_node.plugins.filter.model_download import progress_line

display = Display()

# Ansible's async wrapper kills the job at its `async` limit and records "Timeout exceeded"; waiting a little
# longer than that lets the role report the wrapper's verdict instead of guessing.
GRACE_SECONDS = 60

ARGUMENT_SPEC: dict[str, dict[str, Any]] = {
    "jid": {"type": "str", "required": True},
    "path": {"type": "str", "required": True},
    "timeout": {"type": "int", "required": True},
    "total_bytes": {"type": "int", "default": 0},
    "start_bytes": {"type": "int"},
    "interval": {"type": "int", "default": 15},
    "label": {"type": "str", "default": ""},
}

# What the caller gets back from the finished job (the command module's result); the rest is async bookkeeping.
RESULT_KEYS = ("rc", "stdout", "stderr", "stdout_lines", "stderr_lines", "cmd", "start", "end", "delta", "msg")


def tree_bytes(found: Mapping[str, Any]) -> int | None:
    """Total size of the regular files in an `ansible.builtin.find` result; None when the probe failed."""
    if found.get("failed") or not isinstance(found.get("files"), list):
        return None
    return sum(int(f.get("size", 0)) for f in found["files"])


def job_result(status: Mapping[str, Any]) -> dict[str, Any]:
    """The finished job's own result, with `failed` when hf failed, was killed or its status could not be read."""
    out = {k: status[k] for k in RESULT_KEYS if k in status}
    out["failed"] = bool(status.get("failed")) or status.get("rc", 0) != 0
    return out


def status_line(label: str, done: int | None, total: int, elapsed: float, finished: bool) -> str:
    """One progress line; without a size probe it still says that the job is alive."""
    body = progress_line(done, total, elapsed) if done is not None else f"size unknown, elapsed {int(elapsed)} s"
    return f"{label}: {body}{' (finished)' if finished else ''}"


class ActionModule(ActionBase):
    """Poll an async job with progress lines, then clean the job up and return its result."""

    TRANSFERS_FILES = False
    _supports_check_mode = True
    _supports_async = False

    # Seams for the unit tests (a fake clock instead of real sleeps).
    clock: Callable[[], float] = staticmethod(time.monotonic)
    sleep: Callable[[float], None] = staticmethod(time.sleep)

    def run(self, tmp: str | None = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        """Wait for the job, printing a progress line every interval; return the job's result."""
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        if self._task.check_mode:
            result.update(skipped=True, msg="check mode: no download was started, nothing to wait for")
            return result
        _, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        if not args["jid"]:
            raise AnsibleActionFail(
                "model_download_wait: jid is empty; give the ansible_job_id of a task started with async and poll: 0"
            )
        if args["interval"] < 1 or args["timeout"] < 1:
            raise AnsibleActionFail(
                f"model_download_wait: interval ({args['interval']}) and timeout ({args['timeout']}) must be >= 1 s; "
                "set model_download_progress_interval / model_download_timeout_seconds to positive values"
            )
        host = task_vars.get("inventory_hostname", "")
        label = f"{host} | {args['label'] or args['path']}" if host else args["label"] or args["path"]
        try:
            result.update(self._wait(args, label, task_vars))
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)
        return result

    def _wait(self, args: dict[str, Any], label: str, task_vars: dict[str, Any]) -> dict[str, Any]:
        """The polling loop: bounded by the job's own limit plus a grace period."""
        start = self.clock()
        deadline = start + args["timeout"] + GRACE_SECONDS
        base = args["start_bytes"]
        if base is None:
            base = self._tree_bytes(args["path"], task_vars) or 0
        while True:
            self.sleep(max(0.0, min(args["interval"], deadline - self.clock())))
            status = self._status(args["jid"], "status", task_vars)
            finished = bool(status.get("finished"))
            size = self._tree_bytes(args["path"], task_vars)
            done = None if size is None else max(size - base, 0)
            elapsed = self.clock() - start
            line = status_line(label, done, args["total_bytes"], elapsed, finished)
            display.display(line)
            if status.get("failed") and not finished:
                # The job's status file is unreadable or gone: nothing more will be learnt by waiting.
                return {"failed": True, "rc": None, "msg": f"lost track of the background job: {status.get('msg', status)}",
                        "progress": line, "elapsed": round(elapsed, 1)}
            if finished:
                self._status(args["jid"], "cleanup", task_vars)
                return {**job_result(status), "changed": False, "progress": line, "elapsed": round(elapsed, 1)}
            if self.clock() >= deadline:
                return {"failed": True, "rc": None, "progress": line, "elapsed": round(elapsed, 1),
                        "msg": f"the background job did not finish within {args['timeout']} s + {GRACE_SECONDS} s "
                               "and was not stopped by Ansible's async wrapper; it may still be running on the node"}

    def _status(self, jid: str, mode: str, task_vars: dict[str, Any]) -> dict[str, Any]:
        """async_status on the node (the module needs the async directory that ansible.builtin.async_status adds)."""
        async_dir = self._remote_expand_user(self.get_shell_option("async_dir", default="~/.ansible_async"))
        return self._execute_module(
            module_name="ansible.legacy.async_status",
            module_args={"jid": jid, "mode": mode, "_async_dir": async_dir},
            task_vars=task_vars,
        )

    def _tree_bytes(self, path: str, task_vars: dict[str, Any]) -> int | None:
        """Bytes below path, including hf's partial files (.cache/huggingface/download/*.incomplete)."""
        found = self._execute_module(
            module_name="ansible.legacy.find",
            module_args={"paths": [path], "recurse": True, "hidden": True, "file_type": "file"},
            task_vars=task_vars,
        )
        return tree_bytes(found)
