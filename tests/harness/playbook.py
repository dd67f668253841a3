"""ansible-playbook with the project's environment and a kept log, and its output read back."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from harness.project import ARTIFACTS, PROJECT, molecule_inventory

# ANSIBLE_* settings every run gets: the project's roles, collections and ansible.cfg, and plain output to parse.
PROJECT_SETTINGS = {
    "ANSIBLE_ROLES_PATH": str(PROJECT / "roles"),
    "ANSIBLE_COLLECTIONS_PATH": str(PROJECT / "collections"),
    "ANSIBLE_CONFIG": str(PROJECT / "ansible.cfg"),
    "ANSIBLE_FORCE_COLOR": "0",
    "ANSIBLE_NOCOLOR": "1",
    "PY_COLORS": "0",
}
RESULT = re.compile(r"^(ok|changed|skipping|failed|fatal): \[([^\]]+)\]", re.M)


class Run(NamedTuple):
    """One ansible-playbook run: exit status, output (stdout and stderr), wall seconds."""

    rc: int
    output: str
    seconds: float


def environment(drop: Sequence[str] = (), **extra: str) -> dict[str, str]:
    """This process's environment with the project's settings (and the venv's bin first on PATH), `extra` on top,
    the variables named in `drop` removed."""
    bin_dir = str(Path(sys.executable).parent)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", **PROJECT_SETTINGS, **extra)
    for name in drop:
        env.pop(name, None)
    return env


def command() -> str:
    """The ansible-playbook beside this Python (the project's venv), else the one on PATH."""
    beside = Path(sys.executable).with_name("ansible-playbook")
    return str(beside) if beside.exists() else "ansible-playbook"


def run(playbook: str | Path, *args: str, inventory: str | None = None, limit: str | None = None,
        extra_vars: Mapping[str, Any] | None = None, log: Path | None = None, timeout: float = 2400,
        env: Mapping[str, str] | None = None, cwd: Path = PROJECT) -> Run:
    """ansible-playbook `playbook` from `cwd` (the repository root) with `args`.

    `inventory`: -i (none: the playbook's own hosts, e.g. localhost); `limit`: --limit; `extra_vars`: written
    beside the log (or to a temporary file) and passed as -e @file; `log`: where the output is kept, written as it
    runs (`tail -f` shows where a long step is), else it is only returned; `env`: the environment (default:
    environment())."""
    cmd = [command()]
    if inventory:
        cmd += ["-i", inventory]
    cmd.append(str(playbook))
    if limit:
        cmd += ["--limit", limit]
    vars_file: Path | None = None
    if extra_vars is not None:
        if log is not None:
            vars_file = log.with_suffix(".vars.json")
        else:
            handle, name = tempfile.mkstemp(suffix=".json")
            os.close(handle)
            vars_file = Path(name)
        vars_file.parent.mkdir(parents=True, exist_ok=True)
        vars_file.write_text(json.dumps(dict(extra_vars), indent=2) + "\n")
        cmd += ["-e", f"@{vars_file}"]
    cmd += list(args)
    start = time.monotonic()
    try:
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            with log.open("w") as out:
                proc = subprocess.run(cmd, cwd=cwd, env=dict(env or environment()), stdout=out,
                                      stderr=subprocess.STDOUT, text=True, timeout=timeout, check=False)
            output = log.read_text()
        else:
            proc = subprocess.run(cmd, cwd=cwd, env=dict(env or environment()), capture_output=True, text=True,
                                  timeout=timeout, check=False)
            output = proc.stdout + proc.stderr
    finally:
        if vars_file is not None and log is None:
            vars_file.unlink(missing_ok=True)
    return Run(proc.returncode, output, time.monotonic() - start)


def demo_plan(plan_file: Path, *args: str) -> dict[str, Any]:
    """The demo inventory's plan (its group_vars of vllm_nodes: tiny CPU models) from playbooks/plan.yml, controller
    only, in seconds, with `args` (e.g. "-e", '{"vllm_node_instances": [...]}'); written to `plan_file` and returned."""
    settings = PROJECT / "inventories" / "demo" / "group_vars" / "vllm_nodes"
    rc, out, _ = run("playbooks/plan.yml", "-e", f"vllm_node_plan_file={plan_file}", "-e", f"@{settings / 'main.yml'}",
                     "-e", f"@{settings / 'test_models.yml'}", *args, timeout=300)
    assert rc == 0, out[-3000:]
    return dict(json.loads(plan_file.read_text()))


def scenario_log(scenario: str, name: str) -> Path:
    """Where in_scenario() keeps the output of the run `name`: artifacts/<scenario>/<name>.log."""
    return ARTIFACTS / scenario / f"{name}.log"


def in_scenario(scenario: str, name: str, playbook: str | Path, *args: str, **options: Any) -> Run:
    """run() against the running molecule scenario's inventory, the output kept in scenario_log(scenario, name)
    (extra_vars beside it in <name>.vars.json)."""
    options.setdefault("inventory", molecule_inventory())
    return run(playbook, *args, log=scenario_log(scenario, name), **options)


def recap(output: str, host: str) -> dict[str, int]:
    """The PLAY RECAP counters of `host` (ok, changed, failed, ...), summed over the recaps in the output."""
    lines = re.findall(rf"^{re.escape(host)}\s+:\s+(ok=.*)$", output, re.M)
    assert lines, f"no PLAY RECAP line for {host}"
    counters: dict[str, int] = {}
    for line in lines:
        for name, value in re.findall(r"(\w+)=(\d+)", line):
            counters[name] = counters.get(name, 0) + int(value)
    return counters


def changed_tasks(output: str) -> list[str]:
    """The tasks (TASK or RUNNING HANDLER names) a run reported as changed, for an assertion's message."""
    found, task = [], ""
    for line in output.splitlines():
        header = re.match(r"(?:TASK|RUNNING HANDLER) \[([^\]]+)\]", line)
        if header:
            task = header.group(1)
        elif line.startswith("changed:"):
            found.append(task)
    return found


def task_results(output: str, task: str) -> list[tuple[str, str]]:
    """(status, host) of every result line (ok/changed/skipping/failed/fatal) under the TASK headers named `task`:
    the whole header ("role : name") or the start of the name after the role ("name" without its parenthesis)."""
    found: list[tuple[str, str]] = []
    parts = re.split(r"^(TASK|RUNNING HANDLER|PLAY RECAP|PLAY) ", output, flags=re.M)
    for kind, block in zip(parts[1::2], parts[2::2], strict=True):
        header = block[1:].split("]", 1)[0] if block.startswith("[") else ""
        if kind == "TASK" and (header == task or header.split(" : ", 1)[-1].startswith(task)):
            found += [(status, host.split(" ")[0]) for status, host in RESULT.findall(block)]
    return found


def statuses(output: str, task: str) -> list[str]:
    """The statuses alone of task_results()."""
    return [status for status, _ in task_results(output, task)]


# vllm_service's one restart task (roles/vllm_service/tasks/start.yml), whatever unit it restarts.
RESTART_TASK = "vllm_service : Restart vllm (the configuration changed; once)"


def service_restarts(output: str) -> int:
    """How many times a run restarted a vLLM unit: the "changed" results of vllm_service's restart task (one per
    instance that changed, in a loop over vllm_node_instances)."""
    return statuses(output, RESTART_TASK).count("changed")


class LogFollower:
    """Reads a run's kept log while it is written (run() writes it as the playbook goes) and calls a rule's action
    on each new line its pattern matches (re.search), in order: a test acts on where a long run is (a task begins)
    without hooks in the playbook. Use as a context manager; the log may not exist yet, and a log that shrinks
    (a new run truncated it) is read again from its start."""

    def __init__(self, log: Path, rules: Sequence[tuple[str, Callable[[str], None]]], interval: float = 0.5) -> None:
        self.log, self.interval = log, interval
        self.rules = [(re.compile(pattern), action) for pattern, action in rules]
        self.halt = threading.Event()
        self.matched: list[tuple[float, str]] = []   # (epoch, line) of every line a rule matched
        self.offset, self.partial = 0, b""
        self.thread = threading.Thread(target=self.follow, daemon=True)

    def read_new(self) -> None:
        """Act on the complete lines written since the last read."""
        try:
            size = self.log.stat().st_size
        except FileNotFoundError:
            return
        if size < self.offset:
            self.offset, self.partial = 0, b""
        if size == self.offset:
            return
        with self.log.open("rb") as handle:
            handle.seek(self.offset)
            chunk = handle.read(size - self.offset)
        self.offset += len(chunk)
        # split as bytes: a read may end inside a line, even inside a character
        *lines, self.partial = (self.partial + chunk).split(b"\n")
        for line in (raw.decode(errors="replace") for raw in lines):
            for pattern, action in self.rules:
                if pattern.search(line):
                    self.matched.append((round(time.time(), 3), line))
                    action(line)

    def follow(self) -> None:
        while not self.halt.wait(self.interval):
            self.read_new()
        self.read_new()

    def __enter__(self) -> LogFollower:
        self.thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.halt.set()
        self.thread.join(timeout=10)
