"""Where the unit tests find the repository, whatever their depth under tests/unit: `from repo_root import ROOT`.

The one place a path is computed from a test file's own location (tests/unit/test_layout.py refuses any other), so
moving a test module between folders changes no path in it. Importable through pyproject.toml's pytest pythonpath
(tests/unit), and as a sibling by the helper scripts run directly (`python tests/unit/sizing_golden.py`)."""

from __future__ import annotations

from pathlib import Path

# The checkout: the first folder above this file that holds galaxy.yml (the collection's root).
ROOT = next(folder for folder in Path(__file__).resolve().parents if (folder / "galaxy.yml").is_file())
# Recorded inputs of the unit tests (vLLM start-up reports, index pages, the golden sizing plans).
UNIT_DATA = ROOT / "tests" / "unit" / "data"
