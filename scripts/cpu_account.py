#!/usr/bin/env python3
"""Where a run's CPU goes: each docker container's CPU time (its cgroup's cpuacct) and the whole machine's.

`make test` on 2 cores is bound by CPU, not by any one scenario's wait: every lane stretches with the others' load.
To cut a cold run, one must know which containers (nodes: Ansible modules, vLLM, apt, uv) and how much of the
controller (ansible-playbook, pytest, lint) take the CPU. This samples both while the lanes run and prints a table.

    cpu_account.py sample OUT [--every S]   append samples to OUT until killed (SIGTERM/SIGINT)
    cpu_account.py report OUT               CPU-seconds per container (largest first), docker total, machine total
    cpu_account.py run OUT LABEL -- CMD...  run CMD; append the CPU its process tree used on this machine (every
                                            descendant it waited for: ansible-playbook, its workers, the docker
                                            CLI; not dockerd nor the containers) to OUT as "LABEL SECONDS"
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

CGROUP_ROOTS = (Path("/sys/fs/cgroup/cpuacct/docker"),          # cgroup v1, cgroupfs driver
                Path("/sys/fs/cgroup/cpu,cpuacct/docker"),
                Path("/sys/fs/cgroup/system.slice"))            # cgroup v2, systemd driver (docker-<id>.scope)
TICKS = os.sysconf("SC_CLK_TCK")


def machine_cpu_seconds(stat: str) -> float:
    """Busy CPU-seconds since boot from /proc/stat's first line (user+nice+system+irq+softirq+steal)."""
    fields = stat.splitlines()[0].split()
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / TICKS


def container_usage_ns() -> dict[str, int]:
    """{full container id: CPU nanoseconds used} for every running container whose cgroup is found."""
    found: dict[str, int] = {}
    for root in CGROUP_ROOTS:
        if not root.is_dir():
            continue
        for entry in root.iterdir():
            cid = entry.name.removeprefix("docker-").removesuffix(".scope")
            if len(cid) != 64:
                continue
            v1, v2 = entry / "cpuacct.usage", entry / "cpu.stat"
            if v1.is_file():
                found[cid] = int(v1.read_text())
            elif v2.is_file():
                usage = next(line for line in v2.read_text().splitlines() if line.startswith("usage_usec"))
                found[cid] = int(usage.split()[1]) * 1000
    return found


def container_names(ids: set[str]) -> dict[str, str]:
    """{full id: name} from `docker ps -a` (only asked when an unknown id appears)."""
    if not ids:
        return {}
    out = subprocess.run(["docker", "ps", "-a", "--no-trunc", "--format", "{{.ID}} {{.Names}}"],
                         capture_output=True, text=True, check=False).stdout
    return {cid: name for cid, name in (line.split(" ", 1) for line in out.splitlines() if " " in line)}


def sample(out: Path, every: float) -> None:
    """Append one JSON line per sample to `out` until SIGTERM/SIGINT."""
    stop = False

    def _stop(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    names: dict[str, str] = {}
    with out.open("a") as handle:
        while not stop:
            usage = container_usage_ns()
            unknown = set(usage) - set(names)
            if unknown:
                names.update(container_names(unknown))
            record = {"t": time.time(), "load1": os.getloadavg()[0],
                      "machine_s": machine_cpu_seconds(Path("/proc/stat").read_text()),
                      "containers": {names.get(cid, cid[:12]) + "@" + cid[:12]: ns / 1e9 for cid, ns in usage.items()}}
            handle.write(json.dumps(record) + "\n")
            handle.flush()
            for _ in range(int(every * 10)):
                if stop:
                    break
                time.sleep(0.1)


def summarize(lines: list[dict]) -> dict:
    """Per container the CPU-seconds it used while sampled: its last counter (which only grows), less its first
    when it already ran at the first sample; the machine's busy seconds between the first and the last sample; the
    mean 1-minute load."""
    per: dict[str, float] = {}
    for line in lines:
        for key, seconds in line["containers"].items():
            per[key] = max(per.get(key, 0.0), seconds)
    for key, seconds in (lines[0]["containers"].items() if lines else ()):
        per[key] -= seconds
    by_name: dict[str, float] = {}
    for key, seconds in per.items():
        name = key.rsplit("@", 1)[0]
        by_name[name] = by_name.get(name, 0.0) + seconds
    machine = lines[-1]["machine_s"] - lines[0]["machine_s"] if len(lines) > 1 else 0.0
    wall = lines[-1]["t"] - lines[0]["t"] if len(lines) > 1 else 0.0
    return {"wall_s": wall, "machine_busy_s": machine, "containers_s": sum(by_name.values()),
            "mean_load1": sum(line["load1"] for line in lines) / len(lines) if lines else 0.0,
            "per_container_s": dict(sorted(by_name.items(), key=lambda kv: -kv[1]))}


def run_measured(out: Path, label: str, command: list[str]) -> int:
    """Run `command`, append "label CPU-seconds" (user + system of its reaped process tree) to `out`; its exit code."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    code = subprocess.call(command)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    seconds = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    with out.open("a") as handle:
        handle.write(f"{label} {seconds:.0f}\n")
    return code


def controller_table(path: Path) -> list[str]:
    """The lines "run" appended, as report rows, largest first."""
    if not path.is_file():
        return []
    rows = [line.split() for line in path.read_text().splitlines() if len(line.split()) == 2]
    rows.sort(key=lambda row: -float(row[1]))
    return ["== controller CPU per scenario (the process tree molecule/make started; not dockerd, not containers)"] + \
        [f"   {float(seconds):8.0f} CPU-s  {label}" for label, seconds in rows]


def report(path: Path) -> str:
    """The summary as text."""
    lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if not lines:
        return f"cpu_account: no samples in {path}"
    s = summarize(lines)
    rows = [f"== CPU accounting ({path}): {s['wall_s']:.0f} s wall, machine busy {s['machine_busy_s']:.0f} CPU-s, "
            f"containers {s['containers_s']:.0f} CPU-s, controller and the rest "
            f"{s['machine_busy_s'] - s['containers_s']:.0f} CPU-s, mean load {s['mean_load1']:.1f}"]
    rows += [f"   {seconds:8.0f} CPU-s  {name}" for name, seconds in s["per_container_s"].items()]
    rows += controller_table(path.with_name("controller-cpu.txt"))
    return "\n".join(rows)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("sample")
    one.add_argument("out", type=Path)
    one.add_argument("--every", type=float, default=15.0)
    two = sub.add_parser("report")
    two.add_argument("out", type=Path)
    three = sub.add_parser("run")
    three.add_argument("out", type=Path)
    three.add_argument("label")
    three.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    if args.command == "sample":
        sample(args.out, args.every)
    elif args.command == "run":
        return run_measured(args.out, args.label, args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd)
    else:
        print(report(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
