"""Unit tests of the model_download_wait action plugin: the node is a fake answering async_status and find."""

from __future__ import annotations

from typing import Any
from unittest.mock import MagicMock

import pytest
from ansible.errors import AnsibleActionFail

from ansible_collections.vllm_node.vllm_node.plugins.action import model_download_wait as mdw

JID = "j123.456"


class FakeNode:
    """Answers the plugin's module calls from scripted job states and directory sizes, on a fake clock."""

    def __init__(self, statuses: list[dict[str, Any]], sizes: list[int | None]) -> None:
        self.statuses, self.sizes = list(statuses), list(sizes)
        self.now = 1000.0
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.sleeps: list[float] = []

    def execute(self, module_name: str, module_args: dict[str, Any], task_vars: dict[str, Any]) -> dict[str, Any]:
        self.calls.append((module_name, module_args))
        if module_name == "ansible.legacy.async_status":
            if module_args["mode"] == "cleanup":
                return {"ansible_job_id": JID, "erased": "/root/.ansible_async/" + JID}
            # the last scripted state repeats (a job that never finishes)
            return self.statuses.pop(0) if len(self.statuses) > 1 else dict(self.statuses[0])
        if module_name == "ansible.legacy.find":
            size = self.sizes.pop(0) if len(self.sizes) > 1 else self.sizes[0]
            if size is None:
                return {"failed": True, "msg": "boom"}
            return {"files": [{"path": "/m/a", "size": size - 1}, {"path": "/m/b", "size": 1}], "matched": 2}
        raise AssertionError(f"unexpected module {module_name}")

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def modes(self) -> list[str]:
        return [a.get("mode", "find") for _, a in self.calls]


def make(node: FakeNode, monkeypatch: pytest.MonkeyPatch, check_mode: bool = False, **args: Any):
    """An ActionModule whose node is `node`; returns it with the list of displayed lines."""
    task = MagicMock()
    task.args = {"jid": JID, "path": "/m", "timeout": 3600, "interval": 15, **args}
    task.async_val = 0
    task.check_mode = check_mode
    connection = MagicMock()
    connection._shell.tmpdir = None
    action = mdw.ActionModule(task, connection, MagicMock(), loader=None, templar=None, shared_loader_obj=None)
    monkeypatch.setattr(action, "_execute_module", node.execute)
    monkeypatch.setattr(action, "_remote_expand_user", lambda path, sudoable=True: path)
    monkeypatch.setattr(action, "get_shell_option", lambda option, default=None: default)
    monkeypatch.setattr(action, "clock", lambda: node.now)
    monkeypatch.setattr(action, "sleep", node.sleep)
    lines: list[str] = []
    monkeypatch.setattr(mdw.display, "display", lambda msg, *a, **k: lines.append(msg))
    return action, lines


RUNNING = {"started": 1, "finished": 0, "ansible_job_id": JID}
DONE = {"started": 1, "finished": 1, "ansible_job_id": JID, "rc": 0, "changed": True, "cmd": ["hf", "download"],
        "stdout": "/m\n", "stderr": "Fetching 3 files\n", "invocation": {"module_args": {}}, "results_file": "x"}


def test_progress_lines_then_the_jobs_result_and_cleanup(monkeypatch: pytest.MonkeyPatch) -> None:
    gib = 1024**3
    node = FakeNode([RUNNING, RUNNING, DONE], [gib // 4, gib // 2, gib + 100])
    action, lines = make(node, monkeypatch, start_bytes=100, total_bytes=gib, label="org/model")
    res = action.run(task_vars={"inventory_hostname": "node1"})
    assert len(lines) == 3 and all(line.startswith("node1 | org/model: ") for line in lines)
    assert "256.00 MiB / 1.00 GiB (25.0 %)" in lines[0] and "ETA 45 s" in lines[0] and "elapsed 15 s" in lines[0]
    assert "512.00 MiB / 1.00 GiB (50.0 %)" in lines[1] and "ETA 30 s" in lines[1]
    assert lines[2].endswith("(100.0 %), 22.76 MiB/s, elapsed 45 s, ETA 0 s (finished)")
    assert node.sleeps == [15, 15, 15]
    assert res["rc"] == 0 and res["failed"] is False and res["changed"] is False
    assert res["stdout"] == "/m\n" and res["cmd"] == ["hf", "download"] and res["elapsed"] == 45
    assert "invocation" not in res and "results_file" not in res
    assert node.modes() == ["status", "find"] * 3 + ["cleanup"]
    assert node.calls[0][1]["_async_dir"] == "~/.ansible_async" and node.calls[0][1]["jid"] == JID


def test_a_failed_download_returns_hfs_output_and_is_cleaned_up(monkeypatch: pytest.MonkeyPatch) -> None:
    failed = {**DONE, "rc": 1, "failed": True, "msg": "non-zero return code",
              "stderr": "Traceback ...\nhttpx.ReadError: peer closed connection\n"}
    node = FakeNode([RUNNING, failed], [10])
    action, lines = make(node, monkeypatch, start_bytes=0, total_bytes=100, interval=2)
    res = action.run(task_vars={})
    assert res["failed"] is True and res["rc"] == 1 and "peer closed connection" in res["stderr"]
    assert node.modes()[-1] == "cleanup" and lines[-1].startswith("/m: ") and lines[-1].endswith("(finished)")


def test_the_wrapper_timeout_verdict_is_a_failure_without_rc(monkeypatch: pytest.MonkeyPatch) -> None:
    killed = {"started": 1, "finished": 1, "ansible_job_id": JID, "failed": True, "msg": "Timeout exceeded",
              "child_pid": 4242}
    node = FakeNode([RUNNING, killed], [0])
    action, _ = make(node, monkeypatch, start_bytes=0)
    res = action.run(task_vars={})
    assert res["failed"] is True and "rc" not in res and res["msg"] == "Timeout exceeded"


def test_gives_up_after_the_timeout_plus_grace_without_removing_a_running_job(monkeypatch: pytest.MonkeyPatch) -> None:
    node = FakeNode([RUNNING], [5])
    action, lines = make(node, monkeypatch, start_bytes=0, timeout=100, interval=15)
    res = action.run(task_vars={})
    assert res["failed"] is True and res["rc"] is None and "did not finish within 100 s" in res["msg"]
    assert sum(node.sleeps) == 100 + mdw.GRACE_SECONDS, "bounded by the job's limit plus the grace period"
    assert node.sleeps[-1] == (100 + mdw.GRACE_SECONDS) % 15
    assert "cleanup" not in node.modes() and len(lines) == len(node.sleeps)


def test_a_lost_job_stops_the_wait_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    gone = {"failed": True, "finished": 0, "msg": "could not find job", "ansible_job_id": JID}
    node = FakeNode([gone], [0])
    action, _ = make(node, monkeypatch, start_bytes=0)
    res = action.run(task_vars={})
    assert res["failed"] is True and "lost track" in res["msg"] and "could not find job" in res["msg"]
    assert node.modes() == ["status", "find"]


def test_an_unreadable_directory_still_reports_the_job(monkeypatch: pytest.MonkeyPatch) -> None:
    node = FakeNode([RUNNING, DONE], [None])
    action, lines = make(node, monkeypatch, start_bytes=0, total_bytes=10, interval=1)
    assert action.run(task_vars={})["rc"] == 0
    assert lines == ["/m: size unknown, elapsed 1 s", "/m: size unknown, elapsed 2 s (finished)"]


def test_start_bytes_are_measured_first_when_not_given(monkeypatch: pytest.MonkeyPatch) -> None:
    node = FakeNode([DONE], [300, 800])
    action, lines = make(node, monkeypatch, total_bytes=1000, interval=5)
    action.run(task_vars={})
    assert node.modes() == ["find", "status", "find", "cleanup"]
    assert "500 B / 1000 B (50.0 %)" in lines[0]


def test_check_mode_waits_for_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    node = FakeNode([RUNNING], [0])
    action, lines = make(node, monkeypatch, check_mode=True)
    res = action.run(task_vars={})
    assert res["skipped"] is True and node.calls == [] and lines == []


@pytest.mark.parametrize(("args", "match"), [
    ({"interval": 0}, "must be >= 1 s"),
    ({"timeout": -5}, "must be >= 1 s"),
    ({"jid": None}, "jid is empty"),
    ({"jid": ""}, "jid is empty"),
    ({"jid": "_drop_"}, "missing required arguments: jid"),
    ({"timeout": "soon"}, "timeout"),
])
def test_bad_arguments_are_refused_before_polling(monkeypatch: pytest.MonkeyPatch, args, match) -> None:
    node = FakeNode([RUNNING], [0])
    action, _ = make(node, monkeypatch, **args)
    if args.get("jid") == "_drop_":
        del action._task.args["jid"]
    with pytest.raises(AnsibleActionFail, match=match):
        action.run(task_vars={})
    assert node.calls == []


def test_tree_bytes_and_job_result_helpers() -> None:
    assert mdw.tree_bytes({"files": [{"size": 3}, {"size": 4}]}) == 7
    assert mdw.tree_bytes({"files": []}) == 0
    assert mdw.tree_bytes({"failed": True, "files": []}) is None
    assert mdw.job_result({"rc": 2, "stdout": "x", "ansible_job_id": JID}) == {"rc": 2, "stdout": "x", "failed": True}
