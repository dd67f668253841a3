"""The controller's wait for a background `hf download`: one progress line per interval, a hard time bound.

Pure: the node, the clock, the sleep and the display are passed in (the action plugin gives the real ones, the
unit tests fakes), so the loop's bound and its lines are tested without Ansible or a node.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ansible_collections.vllm_node.vllm_node.plugins.module_utils.model_download.files import progress_line

# The runner kills hf at its limit and records "Timeout exceeded"; waiting a little longer than that lets the role
# report the runner's verdict instead of guessing.
GRACE_SECONDS = 60
# What the caller gets back from the finished job (a command's result); the rest is the runner's bookkeeping.
RESULT_KEYS = ("rc", "stdout", "stderr", "cmd", "msg")


def status_line(label: str, done: int | None, total: int, elapsed: float, finished: bool) -> str:
    """One progress line; without a size probe it still says that the job is alive."""
    body = progress_line(done, total, elapsed) if done is not None else f"size unknown, elapsed {int(elapsed)} s"
    return f"{label}: {body}{' (finished)' if finished else ''}"


def job_result(status: Mapping[str, Any]) -> dict[str, Any]:
    """The finished job's own result, with `failed` when hf failed or was killed."""
    out = {k: status[k] for k in RESULT_KEYS if k in status}
    out["failed"] = bool(status.get("failed")) or status.get("rc") != 0
    return out


def wait(
    poll: Callable[[], Mapping[str, Any]],
    *,
    label: str,
    total_bytes: int,
    start_bytes: int,
    interval: int,
    timeout: int,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
    show: Callable[[str], None],
) -> dict[str, Any]:
    """Poll until the job finishes, is lost, or timeout + GRACE_SECONDS have passed; returns the job's result.

    poll() returns {finished, rc, stdout, stderr, msg, lost, bytes (None when the directory could not be
    measured)}. The number of polls is bounded by (timeout + GRACE_SECONDS) / interval + 1 whatever it answers.
    """
    if interval < 1 or timeout < 1:
        raise ValueError(
            f"model_download: progress interval ({interval}) and timeout ({timeout}) must be >= 1 s; set "
            "model_download_progress_interval / model_download_timeout_seconds to positive values"
        )
    start = clock()
    deadline = start + timeout + GRACE_SECONDS
    while True:
        sleep(max(0.0, min(interval, deadline - clock())))
        status = poll()
        finished = bool(status.get("finished"))
        size = status.get("bytes")
        done = None if size is None else max(int(size) - start_bytes, 0)
        elapsed = clock() - start
        line = status_line(label, done, total_bytes, elapsed, finished)
        show(line)
        if finished:
            return {**job_result(status), "progress": line, "elapsed": round(elapsed, 1)}
        if status.get("lost"):
            # The runner is gone without a status: nothing more will be learnt by waiting.
            return {"failed": True, "rc": None, "msg": f"lost track of the background job: {status.get('msg')}",
                    "progress": line, "elapsed": round(elapsed, 1)}
        if clock() >= deadline:
            return {"failed": True, "rc": None, "progress": line, "elapsed": round(elapsed, 1),
                    "msg": f"the background job did not finish within {timeout} s + {GRACE_SECONDS} s and was "
                           "not stopped by its runner; it is stopped now"}
