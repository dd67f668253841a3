"""Where things are: the repository, its artifacts, the scenario's molecule inventory and its hosts."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

# molecule exports the project directory to the verifier; the integration tests run from the checkout itself
PROJECT = Path(os.environ.get("MOLECULE_PROJECT_DIRECTORY") or Path(__file__).resolve().parents[2])
ARTIFACTS = PROJECT / "artifacts"
VENV_BIN = PROJECT / ".venv" / "bin"


def molecule_inventory() -> str:
    """The running scenario's inventory directory (molecule's generated inventory with its group/host vars links)."""
    return str(Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "inventory")


def machine(name: str) -> Any:
    """A testinfra host of the running scenario by inventory name (the `host` fixture is one host per module)."""
    import testinfra  # only where testinfra is installed: the scenarios' verifier

    return testinfra.get_host(f"ansible://{name}?ansible_inventory={molecule_inventory()}")
