"""scripts/cpu_account.py: the CPU a run's containers used while sampled (a container already running at the first
sample counts only from there; one recreated under the same name adds up), and the machine's busy seconds."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from cpu_account import machine_cpu_seconds, report, run_measured, summarize

A, B = "a" * 12, "b" * 12


def test_counts_from_the_first_sample_and_adds_up_recreated_containers() -> None:
    lines = [
        {"t": 0.0, "load1": 2.0, "machine_s": 100.0, "containers": {f"node@{A}": 40.0}},
        {"t": 15.0, "load1": 4.0, "machine_s": 125.0, "containers": {f"node@{A}": 52.0, f"fresh@{B}": 3.0}},
        # node destroyed and created again (new id), fresh still running
        {"t": 30.0, "load1": 6.0, "machine_s": 150.0, "containers": {"node@cccccccccccc": 5.0, f"fresh@{B}": 9.0}},
    ]
    s = summarize(lines)
    assert s["per_container_s"] == {"node": 12.0 + 5.0, "fresh": 9.0}
    assert list(s["per_container_s"]) == ["node", "fresh"]      # largest first
    assert s["machine_busy_s"] == 50.0 and s["wall_s"] == 30.0 and s["containers_s"] == 26.0
    assert s["mean_load1"] == 4.0


def test_machine_seconds_leave_out_idle_and_iowait() -> None:
    ticks = os.sysconf("SC_CLK_TCK")
    stat = f"cpu  {ticks} 0 {ticks} {50 * ticks} {7 * ticks} 0 0 0 0 0\ncpu0 1 2 3\n"
    assert machine_cpu_seconds(stat) == 2.0


def test_report_names_the_controller_share(tmp_path: Path) -> None:
    out = tmp_path / "samples.jsonl"
    out.write_text("\n".join(json.dumps(line) for line in [
        {"t": 0.0, "load1": 1.0, "machine_s": 0.0, "containers": {}},
        {"t": 60.0, "load1": 1.0, "machine_s": 100.0, "containers": {f"node@{A}": 30.0}},
    ]) + "\n")
    text = report(out)
    assert "machine busy 100 CPU-s, containers 30 CPU-s, controller and the rest 70 CPU-s" in text
    assert "30 CPU-s  node" in text


def test_report_of_no_samples_says_so(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert report(empty) == f"cpu_account: no samples in {empty}"


def test_run_appends_the_cpu_of_the_process_tree_and_keeps_the_exit_code(tmp_path: Path) -> None:
    out = tmp_path / "controller-cpu.txt"
    burn = "import time\nend = time.process_time() + 1.2\nwhile time.process_time() < end: pass\nraise SystemExit(3)"
    # the CPU is burnt by a grandchild: counted once the child has waited for it
    parent = f"import subprocess, sys; sys.exit(subprocess.call([sys.executable, '-c', {burn!r}]))"
    code = run_measured(out, "burner", [sys.executable, "-c", parent])
    assert code == 3
    label, seconds = out.read_text().split()
    assert label == "burner" and float(seconds) >= 1          # rounded; the interpreters' start adds a little
    samples = tmp_path / "samples.jsonl"
    samples.write_text(json.dumps({"t": 0.0, "load1": 1.0, "machine_s": 0.0, "containers": {}}) + "\n")
    assert "controller CPU per scenario" in report(samples) and "burner" in report(samples)
