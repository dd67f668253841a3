"""scripts/molecule-lanes.sh: the scenarios named in one lane run one after another, different lanes (and the
scenarios no lane names, as one more lane) run at once, JOBS=1 runs everything in order, and a failing scenario
fails the whole run and stops its own lane. molecule is replaced by a recorder."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

from repo_root import ROOT

SCRIPT = ROOT / "scripts" / "molecule-lanes.sh"


def run(tmp_path: Path, jobs: str, lanes: str, *scenarios: str, failing: str = "") -> tuple[int, list[str]]:
    """Run the script with a fake molecule that logs `start S` / `end S` around a short sleep; (rc, events)."""
    events = tmp_path / "events"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "molecule"
    fake.write_text(f'#!/bin/sh\ns=$3\necho "start $s" >> {events}\nsleep 0.4\necho "end $s" >> {events}\n'
                    f'[ "$s" != "{failing}" ]\n')
    fake.chmod(0o755)
    result = subprocess.run(["bash", str(SCRIPT), jobs, lanes, *scenarios], cwd=tmp_path, capture_output=True,
                            text=True, timeout=60, env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"})
    return result.returncode, events.read_text().splitlines()


def test_lanes_run_side_by_side_and_in_order_within(tmp_path: Path) -> None:
    rc, events = run(tmp_path, "2", "a b;c", "a", "b", "c", "d")
    assert rc == 0
    # a then b in one lane; c alone; d (named in no lane) in the last: all three lanes start before a ends.
    assert events.index("end a") < events.index("start b")
    assert {"start a", "start c", "start d"} <= set(events[:events.index("end a")])
    assert sorted(e for e in events if e.startswith("end")) == ["end a", "end b", "end c", "end d"]
    assert (tmp_path / "artifacts" / "molecule" / "c.log").read_text() == ""


def test_one_job_runs_everything_in_the_given_order(tmp_path: Path) -> None:
    rc, events = run(tmp_path, "1", "a b;c", "c", "a", "d")
    assert rc == 0
    assert events == ["start c", "end c", "start a", "end a", "start d", "end d"]


def test_a_failure_fails_the_run_and_stops_its_lane(tmp_path: Path) -> None:
    rc, events = run(tmp_path, "2", "a b;c", "a", "b", "c", failing="a")
    assert rc != 0
    assert "start b" not in events and "end c" in events
