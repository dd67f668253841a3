"""Small readers of a converged node and of what the play wrote about it on the controller."""
from __future__ import annotations

import json
from typing import Any

from harness.project import ARTIFACTS

API_KEY_FILE = "/etc/vllm/api-key"


def api_key(host: Any) -> str:
    """The API key the node serves with (vllm_service writes it root-only)."""
    return host.check_output(f"cat {API_KEY_FILE}").strip()


def parse_listening(ss_output: str) -> list[tuple[str, int, str]]:
    """(address, port, the rest: process users) of each line of `ss -Hltn[p]`."""
    found = []
    for line in ss_output.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        addr, port = fields[3].rsplit(":", 1)
        found.append((addr.strip("[]"), int(port), " ".join(fields[5:])))
    return found


def listening(host: Any) -> list[tuple[str, int, str]]:
    """(address, port, process users) of every listening TCP socket on the node."""
    return parse_listening(host.check_output("ss -Hltnp"))


def planned(host: str) -> dict[str, Any]:
    """The plan site.yml wrote for `host` (artifacts/plan-<host>.json)."""
    return json.loads((ARTIFACTS / f"plan-{host}.json").read_text())


def inference_check(host: str) -> dict[str, Any]:
    """The inference check's report for `host` (artifacts/inference-check-<host>.json)."""
    return json.loads((ARTIFACTS / f"inference-check-{host}.json").read_text())
