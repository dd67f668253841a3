"""A scenario's measured figures, kept by name in one JSON file (the reports and docs/measurements.md read them)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class Figures:
    """The figures file of one scenario: record() adds or replaces one name's value and prints it."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def read(self) -> dict[str, Any]:
        """Every figure kept so far ({} before the first)."""
        return json.loads(self.path.read_text()) if self.path.exists() else {}

    def record(self, name: str, value: Any) -> None:
        """Keep `value` under `name` (replacing an earlier one) and print it as `MEASURED name: <json>`."""
        data = self.read()
        data[name] = value
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(data, indent=2) + "\n")
        print(f"MEASURED {name}: {json.dumps(value)}")

    def reset(self) -> None:
        """Start a new file: the figures of an earlier run are dropped."""
        self.path.unlink(missing_ok=True)
