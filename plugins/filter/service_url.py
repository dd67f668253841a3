"""Filter service_url: the base URL the node uses to reach vLLM (one rule for vllm_service and inference_check)."""

from __future__ import annotations

DOCUMENTATION = r"""
name: service_url
short_description: Base URL the node uses to reach a local server listening on an address and port
description:
  - A wildcard listen address (V(0.0.0.0), V(::) or empty) is reached on loopback V(127.0.0.1).
  - An IPv6 address is put in brackets (RFC 3986), e.g. V(http://[::1]:8000).
positional: _input, port
options:
  _input:
    description: The address the server listens on (vLLM's C(--host)).
    type: str
    required: true
  port:
    description: TCP port.
    type: int
    required: true
author: vllm-node
"""

EXAMPLES = r"""
url: "{{ '::1' | vllm_node.vllm_node.service_url(8000) }}"            # http://[::1]:8000
probe: "{{ '0.0.0.0' | vllm_node.vllm_node.service_url(8000) }}"      # http://127.0.0.1:8000
"""

RETURN = r"""
_value:
  description: C(http://host:port) without a trailing slash.
  type: str
"""

WILDCARDS = ("0.0.0.0", "::", "")
LOOPBACK = "127.0.0.1"


def probe_host(address: str) -> str:
    """The host to connect to for a listen address: loopback for a wildcard, else the address itself."""
    address = str(address or "").strip()
    if address.startswith("[") and address.endswith("]"):
        address = address[1:-1]
    return LOOPBACK if address in WILDCARDS else address


def service_url(address: str, port: int) -> str:
    """http://<host>:<port> for a server listening on `address`; IPv6 hosts in brackets.

    Raises ValueError for a port that is not a number in 1..65535.
    """
    try:
        number = int(port)
    except (TypeError, ValueError):
        raise ValueError(f"service_url: port must be a number in 1..65535, got {port!r}") from None
    if not 0 < number < 65536:
        raise ValueError(f"service_url: port must be a number in 1..65535, got {port!r}")
    host = probe_host(address)
    return f"http://{'[' + host + ']' if ':' in host else host}:{number}"


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict:
        """The filters of this file."""
        return {"service_url": service_url}
