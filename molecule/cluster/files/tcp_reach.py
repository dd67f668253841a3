"""Try a TCP connection to each HOST:PORT argument at once and print JSON {address: state}: "open" (accepted),
"refused" (reset: reached, nothing listening or rejected) or "dropped" (no answer within the timeout). The cluster
scenario's firewall check runs it on the controller, a non-member of the cluster."""

from __future__ import annotations

import json
import socket
import sys
from concurrent.futures import ThreadPoolExecutor

TIMEOUT_SECONDS = 2.0


def reach(address: str) -> str:
    """The state of one HOST:PORT as seen from here."""
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=TIMEOUT_SECONDS):
            return "open"
    except ConnectionRefusedError:
        return "refused"
    except OSError:
        return "dropped"


def main(addresses: list[str]) -> None:
    """Print every address's state, probed in parallel (one timeout in all, not one per port)."""
    with ThreadPoolExecutor(max_workers=max(1, min(64, len(addresses)))) as pool:
        states = dict(zip(addresses, pool.map(reach, addresses), strict=True))
    print(json.dumps(states, sort_keys=True))


if __name__ == "__main__":
    main(sys.argv[1:])
