"""proc_tree: a service's processes from /proc (state, CPU time, wait channel, allowed CPUs), so a start that takes
too long says whether it is stuck or starved."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from ansible_collections.vllm_node.vllm_node.plugins.module_utils import proc_tree


def test_parse_stat_reads_after_the_last_parenthesis() -> None:
    # a name with a space and a parenthesis, as vLLM's renamed processes may have
    fields = ["S", "41", "41", "41", "0", "-1", "4194560", "10", "0", "0", "0", "250", "50"] + ["0"] * 30
    line = "812 (VLLM::Worker (0)) " + " ".join(fields)
    parsed = proc_tree.parse_stat(line, ticks=100)
    assert parsed == {"pid": 812, "name": "VLLM::Worker (0)", "state": "S", "ppid": 41, "cpu_seconds": 3.0}


def test_descendants_are_the_root_and_everything_below_it_parents_first() -> None:
    parents = {1: 0, 10: 1, 11: 10, 12: 10, 13: 12, 20: 1, 30: 99}
    assert proc_tree.descendants(parents, 10) == [10, 11, 12, 13]
    assert proc_tree.descendants(parents, 13) == [13]
    assert proc_tree.descendants(parents, 404) == []


def test_status_field() -> None:
    text = "Name:\tpython3\nState:\tR (running)\nCpus_allowed_list:\t0\n"
    assert proc_tree.status_field(text, "Cpus_allowed_list") == "0"
    assert proc_tree.status_field(text, "Missing") == ""


def test_describe_names_state_cpu_time_wait_and_cpus() -> None:
    running = {"pid": 812, "name": "VLLM::Worker", "state": "R", "cpu_seconds": 301.2, "wchan": "", "cpus": "0"}
    assert proc_tree.describe(running) == "VLLM::Worker 812 running, 301.2 CPU-s, CPUs 0"
    stuck = {"pid": 9, "name": "EngineCore", "state": "S", "cpu_seconds": 4.0, "wchan": "futex_wait_queue",
             "cpus": ""}
    assert proc_tree.describe(stuck) == "EngineCore 9 sleeping in futex_wait_queue, 4.0 CPU-s"


def test_service_processes_of_a_real_process_tree(tmp_path: Path) -> None:
    """This test's own process with a child that burns CPU and a grandchild that sleeps."""
    script = ("import subprocess, sys, time\n"
              "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"
              # burns 0.5 s of its own CPU time, however loaded the machine is (wall time would not)
              "while time.process_time() < 0.5: pass\n"
              "print(child.pid, flush=True)\n"
              "time.sleep(30)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    grandchild = 0
    try:
        grandchild = int(parent.stdout.readline())
        found = proc_tree.service_processes(os.getpid())
        pids = [p["pid"] for p in found]
        assert pids[0] == os.getpid() and parent.pid in pids and grandchild in pids
        assert pids.index(parent.pid) < pids.index(grandchild)
        burnt = next(p for p in found if p["pid"] == parent.pid)
        assert burnt["cpu_seconds"] >= 0.3 and burnt["state"] in proc_tree.STATES
        assert burnt["cpus"]   # every Linux process has an allowed CPU list
    finally:
        if grandchild:
            os.kill(grandchild, signal.SIGKILL)
        parent.kill()
        parent.wait()
    assert proc_tree.service_processes(0) == []
