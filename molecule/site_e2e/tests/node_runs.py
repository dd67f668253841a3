"""ansible-playbook runs against the scenario's node, shared by its test files and conftest.py."""
from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

PROJECT = Path(os.environ.get("MOLECULE_PROJECT_DIRECTORY", Path(__file__).resolve().parents[3]))
SCENARIO = Path(__file__).resolve().parents[1]
HOST = "site_e2e-bookworm"


def playbook(path: Path, *extra: str, timeout: int = 2400) -> tuple[int, str, float]:
    """Run ansible-playbook against the molecule inventory with the project's settings; (rc, output, seconds)."""
    inventory = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "inventory"
    env = dict(os.environ, ANSIBLE_ROLES_PATH=str(PROJECT / "roles"),
               ANSIBLE_COLLECTIONS_PATH=str(PROJECT / "collections"), ANSIBLE_CONFIG=str(PROJECT / "ansible.cfg"),
               ANSIBLE_FORCE_COLOR="0", ANSIBLE_NOCOLOR="1")
    start = time.monotonic()
    proc = subprocess.run(["ansible-playbook", "-i", str(inventory), str(path), *extra], cwd=PROJECT, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)
    return proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start


def changed_tasks(out: str) -> list[str]:
    """The tasks a playbook run reported as changed (TASK/HANDLER names), for the assertion message."""
    found, task = [], ""
    for line in out.splitlines():
        header = re.match(r"(?:TASK|RUNNING HANDLER) \[([^\]]+)\]", line)
        if header:
            task = header.group(1)
        elif line.startswith("changed:"):
            found.append(task)
    return found


def recap_changed(out: str) -> int:
    """changed= of the node in the PLAY RECAP (summed over the plays)."""
    return sum(int(n) for n in re.findall(rf"^{HOST}\s+:.*?changed=(\d+)", out, re.M))
