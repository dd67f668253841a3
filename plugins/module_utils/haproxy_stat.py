"""HAProxy's runtime API as the rollout reads it: `show stat` (CSV) parsed into backend -> server -> state.

`show stat` answers one CSV line per proxy, backend server, FRONTEND and BACKEND pseudo-row, after a header that
starts with "# ". The rollout needs, per server of a backend, its status (UP, DOWN, DRAIN, MAINT, "DOWN (agent)",
"no check"...), weight and current sessions (`scur`), to refuse a node that is not a server of the gateway before
anything is drained.
"""

from __future__ import annotations

import csv
from typing import Any

# The pseudo-rows of a proxy, not servers.
PSEUDO_SERVERS = frozenset({"FRONTEND", "BACKEND"})


def _int(value: str | None) -> int | None:
    """A counter of the CSV, None when empty or not a number."""
    try:
        return int(value) if value not in (None, "") else None
    except ValueError:
        return None


def parse_show_stat(text: str) -> dict[str, dict[str, dict[str, Any]]]:
    """backend -> server -> {status, weight, scur, stot, admin_drain, admin_maint, tracked} from `show stat` output
    (scur: sessions now; stot: sessions so far; tracked: the backend/server whose state it follows, "" for one
    checked on its own).

    admin_drain / admin_maint are read from the status text: HAProxy prints DRAIN (or "DRAIN (agent)") for a
    server in drain mode and MAINT for one in maintenance. Raises ValueError when the text has no CSV header.
    """
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines or not lines[0].startswith("# pxname,"):
        raise ValueError("not HAProxy `show stat` output: no '# pxname,...' header line"
                         + (f" (got {lines[0][:80]!r})" if lines else " (empty answer)"))
    reader = csv.DictReader([lines[0][2:]] + lines[1:])
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for row in reader:
        backend, server = row.get("pxname") or "", row.get("svname") or ""
        if not backend or server in PSEUDO_SERVERS:
            continue
        status = (row.get("status") or "").strip()
        out.setdefault(backend, {})[server] = {
            "status": status,
            "weight": _int(row.get("weight")),
            "scur": _int(row.get("scur")),
            "stot": _int(row.get("stot")),
            "admin_drain": status.startswith("DRAIN"),
            "admin_maint": status.startswith("MAINT"),
            "tracked": (row.get("tracked") or "").strip(),
        }
    return out


def missing_servers(servers: dict[str, dict[str, dict[str, Any]]], backend: str, wanted: list[str]) -> list[str]:
    """The names of `wanted` that are not servers of `backend` (all of them when the backend is unknown)."""
    known = servers.get(backend) or {}
    return [name for name in wanted if name not in known]


def holding_backends(servers: dict[str, dict[str, dict[str, Any]]], wanted: list[str]) -> list[str]:
    """The backends that hold a server of `wanted` as one of their own (not tracking another's state), sorted: where
    a drain or enable of that server acts. The gateway's affinity pools, and a model pool whose server is checked in
    another model's pool, track it and follow."""
    return sorted(backend for backend, members in servers.items()
                  if any(name in members and not members[name]["tracked"] for name in wanted))


def drained_servers(servers: dict[str, dict[str, dict[str, Any]]], backend: str, wanted: list[str]) -> list[str]:
    """The names of `wanted` that `backend` holds in drain mode (set through the runtime API: HAProxy sends them no
    new request until they are enabled again)."""
    known = servers.get(backend) or {}
    return [name for name in wanted if (known.get(name) or {}).get("admin_drain")]
