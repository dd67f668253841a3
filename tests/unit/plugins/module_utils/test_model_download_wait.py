"""The wait for a background download (module_utils/model_download/wait.py): a fake node on a fake clock."""

from __future__ import annotations

from typing import Any

import pytest

from ansible_collections.vllm_node.vllm_node.plugins.module_utils.model_download import wait as mdw

GIB = 1024**3
RUNNING: dict[str, Any] = {"finished": False}
DONE = {"finished": True, "rc": 0, "cmd": ["hf", "download"], "stdout": "/m\n", "stderr": "Fetching 3 files\n"}


class Fake:
    """Scripted job states and directory sizes; the last ones repeat (a job that never finishes)."""

    def __init__(self, statuses: list[dict[str, Any]], sizes: list[int | None]) -> None:
        self.statuses, self.sizes = list(statuses), list(sizes)
        self.now, self.sleeps, self.lines, self.polls = 1000.0, [], [], 0

    def poll(self) -> dict[str, Any]:
        self.polls += 1
        status = self.statuses.pop(0) if len(self.statuses) > 1 else dict(self.statuses[0])
        size = self.sizes.pop(0) if len(self.sizes) > 1 else self.sizes[0]
        return {**status, "bytes": size}

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def run(self, **kw: Any) -> dict[str, Any]:
        args = {"label": "node1 | org/model", "total_bytes": GIB, "start_bytes": 100, "interval": 15,
                "timeout": 3600, **kw}
        return mdw.wait(self.poll, clock=lambda: self.now, sleep=self.sleep, show=self.lines.append, **args)


def test_progress_lines_then_the_jobs_result() -> None:
    fake = Fake([RUNNING, RUNNING, DONE], [GIB // 4 + 100, GIB // 2 + 100, GIB + 200])
    res = fake.run()
    lines = fake.lines
    assert len(lines) == 3 and all(line.startswith("node1 | org/model: ") for line in lines)
    assert "256.00 MiB / 1.00 GiB (25.0 %)" in lines[0] and "ETA 45 s" in lines[0] and "elapsed 15 s" in lines[0]
    assert "512.00 MiB / 1.00 GiB (50.0 %)" in lines[1] and "ETA 30 s" in lines[1]
    assert lines[2].endswith("(100.0 %), 22.76 MiB/s, elapsed 45 s, ETA 0 s (finished)")
    assert fake.sleeps == [15, 15, 15]
    assert res == {"rc": 0, "cmd": ["hf", "download"], "stdout": "/m\n", "stderr": "Fetching 3 files\n",
                   "failed": False, "progress": lines[2], "elapsed": 45.0}


def test_a_failed_download_returns_hfs_output() -> None:
    res = Fake([{**DONE, "rc": 1, "stderr": "Connection refused"}], [5]).run()
    assert res["failed"] and res["rc"] == 1 and res["stderr"] == "Connection refused"


def test_the_runners_timeout_verdict_is_a_failure_without_rc() -> None:
    res = Fake([{"finished": True, "rc": None, "msg": "Timeout exceeded"}], [5]).run()
    assert res["failed"] and res["rc"] is None and res["msg"] == "Timeout exceeded"


def test_gives_up_after_the_timeout_plus_grace() -> None:
    fake = Fake([RUNNING], [0])
    res = fake.run(timeout=30, interval=20)
    assert res["failed"] and res["rc"] is None and "did not finish within 30 s + 60 s" in res["msg"]
    assert sum(fake.sleeps) == 30 + mdw.GRACE_SECONDS and fake.polls == 5, "bounded: (timeout + grace) / interval"


def test_a_lost_job_stops_the_wait_at_once() -> None:
    fake = Fake([{"finished": False, "lost": True, "msg": "the runner ended"}], [0])
    res = fake.run()
    assert res["failed"] and "lost track of the background job: the runner ended" in res["msg"] and fake.polls == 1


def test_an_unmeasured_directory_still_reports_the_job() -> None:
    fake = Fake([RUNNING, DONE], [None, GIB])
    fake.run()
    assert fake.lines[0] == "node1 | org/model: size unknown, elapsed 15 s"


@pytest.mark.parametrize(("interval", "timeout"), [(0, 10), (5, 0)])
def test_bad_bounds_are_refused_before_polling(interval: int, timeout: int) -> None:
    fake = Fake([DONE], [0])
    with pytest.raises(ValueError, match="model_download_progress_interval / model_download_timeout_seconds"):
        fake.run(interval=interval, timeout=timeout)
    assert fake.polls == 0


def test_job_result_and_status_line_helpers() -> None:
    assert mdw.job_result({"rc": 0, "stdout": "x", "invocation": {}}) == {"rc": 0, "stdout": "x", "failed": False}
    assert mdw.job_result({"rc": 0, "failed": True})["failed"]
    assert mdw.status_line("l", 0, 0, 0, True) == "l: 0 B / 0 B (100.0 %), 0 B/s, elapsed 0 s, ETA 0 s (finished)"
