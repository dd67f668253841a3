#!/usr/bin/python
"""Ansible module: the servers of an HAProxy backend and their state, read from the runtime API (read-only)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: gateway_servers
short_description: Read the servers of HAProxy's backends from its runtime API socket (read-only)
description:
  - Sends C(show stat) to HAProxy's runtime API (a UNIX socket, e.g. the gateway role's
    C(/run/haproxy/gateway.sock)) and returns backend -> server -> status, weight and current sessions.
  - With O(servers), fails naming the ones that are not servers of O(backend) (with O(backend) empty, of any
    backend, as a server of its own); playbooks/rollout.yml uses it to refuse a node the gateway does not know
    before anything is drained, and drains and enables it in every backend of RV(holding).
  - Changes nothing.
options:
  socket:
    description: Path of HAProxy's runtime API socket (a C(stats socket) line of its configuration).
    type: path
    required: true
  backend:
    description: >-
      The backend whose servers are checked against O(servers); "" = every backend that holds them as servers of
      their own (not tracking another server: the gateway's affinity pools, a model pool whose server is checked in
      another model's pool).
    type: str
    default: ""
  servers:
    description: Server names that must be in O(backend) (with O(backend) "", in some backend).
    type: list
    elements: str
    default: []
  timeout:
    description: Seconds to wait for HAProxy's answer.
    type: int
    default: 10
extends_documentation_fragment:
  - vllm_node.vllm_node.read_only
author: vllm-node
"""

EXAMPLES = r"""
- name: The gateway knows both nodes
  vllm_node.vllm_node.gateway_servers:
    socket: /run/haproxy/gateway.sock
    backend: vllm
    servers: [node1, node2]
  register: gateway
"""

RETURN = r"""
backends:
  description: Backend -> server -> C(status) (UP, DOWN, DRAIN, MAINT, ...), C(weight), C(scur) (current sessions),
    C(admin_drain), C(admin_maint).
  returned: success
  type: dict
missing:
  description: The names of O(servers) that O(backend) does not have (the task fails when any).
  returned: always
  type: list
holding:
  description: >-
    Where a drain or enable of O(servers) acts: [O(backend)] when given, else every backend that holds one of them as
    a server of its own, sorted (the gateway's C(vllm), or each model pool whose server is checked there).
  returned: success
  type: list
  elements: str
drained:
  description: The names of O(servers) that O(backend) (with O(backend) "", a backend of RV(holding)) holds in drain
    mode (set through the runtime API, e.g. a node an earlier rollout left out).
  returned: success
  type: list
"""

import os
import socket as _socket
import stat as _stat
from typing import Any

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.vllm_node.vllm_node.plugins.module_utils.haproxy_stat import (
    drained_servers,
    holding_backends,
    missing_servers,
    parse_show_stat,
)


def ask(path: str, command: str, timeout: int) -> str:
    """Send one command to HAProxy's runtime API socket and return its whole answer."""
    with _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        conn.connect(path)
        conn.sendall(command.encode() + b"\n")
        chunks = []
        while chunk := conn.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


def main() -> None:
    """Read `show stat`, parse it, check the wanted servers."""
    module = AnsibleModule(
        argument_spec={
            "socket": {"type": "path", "required": True},
            "backend": {"type": "str", "default": ""},
            "servers": {"type": "list", "elements": "str", "default": []},
            "timeout": {"type": "int", "default": 10},
        },
        supports_check_mode=True,
    )
    path, backend, wanted = module.params["socket"], module.params["backend"], module.params["servers"]
    try:
        mode = os.stat(path).st_mode
    except OSError as err:
        module.fail_json(msg=f"HAProxy's runtime API socket {path} is not there ({err.strerror}): is HAProxy "
                             "running with a `stats socket` line for it (the gateway role writes one)?", missing=wanted)
    if not _stat.S_ISSOCK(mode):
        module.fail_json(msg=f"{path} is not a socket: give the path of HAProxy's `stats socket`", missing=wanted)
    try:
        backends: dict[str, Any] = parse_show_stat(ask(path, "show stat", module.params["timeout"]))
    except (OSError, ValueError) as err:
        module.fail_json(msg=f"HAProxy's runtime API at {path} did not answer `show stat`: {err}", missing=wanted)
    if backend:
        missing = missing_servers(backends, backend, wanted)
        holding = [backend]
        known = ", ".join(sorted(backends.get(backend) or {})) or "no such backend"
        where = f"backend '{backend}' at {path} (it has {known}; "
    else:
        missing = [name for name in wanted if not holding_backends(backends, [name])]
        holding = holding_backends(backends, wanted)
        known = "; ".join(f"{name}: {', '.join(sorted(members))}" for name, members in sorted(backends.items()))
        where = f"any backend at {path} (they have {known or 'none'}; "
    if missing:
        module.fail_json(
            msg=f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not a server of {where}"
                f"backends: {', '.join(sorted(backends)) or 'none'}). List each node in the gateway's "
                "gateway_backends under its inventory name, or set rollout_gateway_server.",
            backends=backends, missing=missing)
    drained = [name for name in wanted if any(drained_servers(backends, held, [name]) for held in holding)]
    module.exit_json(changed=False, backends=backends, missing=missing, holding=holding, drained=drained)


if __name__ == "__main__":
    main()
