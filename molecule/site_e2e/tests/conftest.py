"""The converged node's second run and its check-mode run, each done once, before any test (session fixtures).

They replace molecule's own idempotence and check stages (molecule.yml), which ran the same playbook and asserted
less: test_site.py holds the re-run to changed=0, no handler, the same process and a wall-time bound, and the
check-mode run to changed=0 and the same process; test_manifest.py holds the check-mode run's manifest tasks to
"ok". Both run the scenario's converge.yml (site.yml, the local Prometheus and the restart witness) right after the
converge, as molecule's stages did, before any test changes the node. Their output: artifacts/site_e2e/<run>.log.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from harness import node, playbook, project, unit
from harness.api import Gateway

HOST = "site_e2e-bookworm"
SCENARIO = Path(__file__).resolve().parents[1]
STATE = ("MainPID", "ActiveEnterTimestamp")


def _run(host: Any, name: str, *extra: str) -> dict[str, Any]:
    """converge.yml with `extra` flags; its result with the unit's state before and after and the mean load."""
    before = unit.show(host, "vllm", STATE)
    load_before = os.getloadavg()[0]
    rc, out, seconds = playbook.run(SCENARIO / "converge.yml", *extra, inventory=project.molecule_inventory(),
                                    log=project.ARTIFACTS / "site_e2e" / f"{name}.log")
    return {"rc": rc, "out": out, "seconds": seconds, "before": before, "after": unit.show(host, "vllm", STATE),
            "load": (load_before + os.getloadavg()[0]) / 2}


@pytest.fixture(scope="session", autouse=True)
def converged_reruns() -> dict[str, dict[str, Any]]:
    """{"rerun": ..., "check": ...}: the idempotent second run, then `--check --diff`, on the converged node."""
    # testinfra's `host` is per module; the same node, reached the same way, for the whole session
    host = project.machine(HOST)
    return {"rerun": _run(host, "rerun"), "check": _run(host, "check", "--check", "--diff")}


# Modules that change what the node is (test_instances.py switches it to several models and back): after every
# other module, which expects the node as converge.yml left it (with the single model's day-2 changes).
LAST = ("test_instances.py",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the LAST modules after all the others, in their own order (a stable sort keeps the rest as collected)."""
    items.sort(key=lambda item: item.path.name in LAST)


@pytest.fixture(scope="module")
def gateway(host) -> Gateway:
    """The node's gateway at the container's address, as a client reaches it (test_lora, test_instances)."""
    return Gateway(host.check_output("hostname -I").split()[0], 443)


@pytest.fixture(scope="module")
def key(host) -> str:
    """The API key the node serves with."""
    return node.api_key(host)
