"""The scenario's measured figures, shared by its test files: artifacts/site_e2e-measurements.json."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

PROJECT = Path(os.environ.get("MOLECULE_PROJECT_DIRECTORY", Path(__file__).resolve().parents[3]))
ARTIFACTS = PROJECT / "artifacts"
MEASUREMENTS = ARTIFACTS / "site_e2e-measurements.json"


def record(name: str, value: Any) -> None:
    """Keep a measured number for the report (and print it)."""
    ARTIFACTS.mkdir(exist_ok=True)
    data = json.loads(MEASUREMENTS.read_text()) if MEASUREMENTS.exists() else {}
    data[name] = value
    MEASUREMENTS.write_text(json.dumps(data, indent=2) + "\n")
    print(f"MEASURED {name}: {value}")
