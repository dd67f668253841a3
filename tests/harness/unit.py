"""A systemd unit seen from its node: the witness of one process (MainPID, invocation id, timestamps) and the
restarts between two witnesses, counted from the journal."""
from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

# What a witness holds; the monotonic timestamps time the last stop and start (stop_start_seconds()).
WITNESS = ("MainPID", "InvocationID", "ActiveEnterTimestamp", "ActiveEnterTimestampMonotonic",
           "ActiveExitTimestampMonotonic", "InactiveEnterTimestampMonotonic", "InactiveExitTimestampMonotonic")


def parse_show(text: str) -> dict[str, str]:
    """`systemctl show -p ...` output as a dict."""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def show(host: Any, unit: str = "vllm", properties: Iterable[str] = WITNESS) -> dict[str, str]:
    """The unit's properties on the node."""
    flags = " ".join(f"-p {name}" for name in properties)
    return parse_show(host.check_output(f"systemctl show {flags} {unit}"))


def witness(host: Any, unit: str = "vllm") -> dict[str, str]:
    """The unit's main PID, invocation, state timestamps and the node's clock ("now", epoch seconds)."""
    state = show(host, unit)
    state["now"] = host.check_output("date +%s").strip()
    return state


def invocations(journal_json: str) -> set[str]:
    """The invocation ids in `journalctl -o json` lines (systemd's own messages carry INVOCATION_ID, the
    service's output _SYSTEMD_INVOCATION_ID)."""
    seen: set[str] = set()
    for line in journal_json.splitlines():
        if line.strip():
            entry = json.loads(line)
            seen.update(v for k, v in entry.items() if k in ("INVOCATION_ID", "_SYSTEMD_INVOCATION_ID") and v)
    return seen


def count_restarts(journal_json: str, before: dict[str, str]) -> int:
    """Invocations in the journal other than the one `before` witnessed: one per (re)start, a failed one included."""
    return len(invocations(journal_json) - {before["InvocationID"]})


def restarts(host: Any, before: dict[str, str], unit: str = "vllm") -> int:
    """Invocations of the unit that began after the witness `before` (each start, a failed one included), so a
    missing and an extra restart both show."""
    out = host.check_output(
        f"journalctl --since @{int(before['now']) - 1} -o json --output-fields=INVOCATION_ID,_SYSTEMD_INVOCATION_ID "
        f"UNIT={unit}.service + _SYSTEMD_UNIT={unit}.service")
    return count_restarts(out, before)


def stop_start_seconds(state: dict[str, str]) -> dict[str, float | None]:
    """The last stop (active -> inactive) and start (inactive -> active, i.e. until /health answered) in seconds,
    from a witness's monotonic timestamps (µs); None where a timestamp is missing or out of order."""
    def span(a: str, b: str) -> float | None:
        x, y = int(state.get(a) or 0), int(state.get(b) or 0)
        return round((y - x) / 1e6, 1) if x and y and y >= x else None
    return {"stop_s": span("ActiveExitTimestampMonotonic", "InactiveEnterTimestampMonotonic"),
            "start_s": span("InactiveExitTimestampMonotonic", "ActiveEnterTimestampMonotonic")}
