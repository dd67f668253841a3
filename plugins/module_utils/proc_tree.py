"""The processes of a service as /proc shows them: what a start that takes too long is doing.

A vLLM start that never reports progress is either stuck (its processes sleep, their CPU time does not grow) or
starved (they are runnable, R, and their CPU time grows slowly because other work holds the cores); the journal
cannot tell the two apart, /proc can. vLLM's API server is the unit's MainPID, its engine core and workers are its
descendants.
"""

from __future__ import annotations

import os
from pathlib import Path

STATES = {"R": "running", "S": "sleeping", "D": "waiting on I/O", "Z": "zombie", "T": "stopped", "t": "traced",
          "I": "idle"}


def parse_stat(text: str, ticks: int) -> dict:
    """pid, name, state, ppid and CPU seconds (user + system) from a /proc/<pid>/stat line.

    The name is in parentheses and may hold spaces or parentheses itself, so the fields are read after the last ')'.
    """
    head, _, rest = text.rpartition(")")
    pid_text, _, name = head.partition(" (")
    fields = rest.split()
    # fields[0] is field 3 (state) of proc(5); utime and stime are fields 14 and 15
    return {"pid": int(pid_text), "name": name, "state": fields[0], "ppid": int(fields[1]),
            "cpu_seconds": round((int(fields[11]) + int(fields[12])) / ticks, 1)}


def descendants(parents: dict[int, int], root: int) -> list[int]:
    """`root` and every process below it, parents first, from a {pid: ppid} map."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    found, queue = [], [root] if root in parents else []
    while queue:
        pid = queue.pop(0)
        found.append(pid)
        queue.extend(sorted(children.get(pid, [])))
    return found


def status_field(text: str, key: str) -> str:
    """One `Key:\\tvalue` field of /proc/<pid>/status, '' when absent."""
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and name == key:
            return value.strip()
    return ""


def describe(process: dict) -> str:
    """One process as a short phrase, e.g. 'VLLM::Worker 812 running, 301.2 CPU-s, CPUs 0'."""
    state = STATES.get(process["state"], process["state"])
    waits = f" in {process['wchan']}" if process.get("wchan") else ""
    cpus = f", CPUs {process['cpus']}" if process.get("cpus") else ""
    return f"{process['name']} {process['pid']} {state}{waits}, {process['cpu_seconds']} CPU-s{cpus}"


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:  # the process ended between the listing and the read
        return None


def service_processes(main_pid: int, proc: Path = Path("/proc")) -> list[dict]:
    """The service's processes (MainPID and its descendants) with state, CPU seconds, wait channel and allowed CPUs;
    [] when MainPID is 0 or gone."""
    if main_pid <= 0:
        return []
    ticks = os.sysconf("SC_CLK_TCK")
    table: dict[int, dict] = {}
    for entry in proc.iterdir():
        if entry.name.isdigit():
            text = _read(entry / "stat")
            if text:
                table[int(entry.name)] = parse_stat(text, ticks)
    found = []
    for pid in descendants({pid: p["ppid"] for pid, p in table.items()}, main_pid):
        process = dict(table[pid])
        wchan = (_read(proc / str(pid) / "wchan") or "").strip()
        process["wchan"] = "" if wchan in ("", "0") else wchan
        process["cpus"] = status_field(_read(proc / str(pid) / "status") or "", "Cpus_allowed_list")
        found.append(process)
    return found
