"""Filter vllm_cluster: one node's part of a multi-node vLLM replica (rank, flags, cluster interface environment)."""

from __future__ import annotations

import re
from typing import Any

DOCUMENTATION = r"""
name: vllm_cluster
short_description: One member's rank, vLLM multi-node flags and cluster-interface environment
description:
  - The members of the cluster's inventory group, in order, are the ranks; rank 0 (the head) serves the API, the
    others run C(--headless).
  - The cluster interface is the one the node reaches the head's cluster address on, read from C(ip -o route get
    HEAD) (and, on the head, C(ip -o -4 addr show), where the route to its own address goes through C(lo)).
  - Fails with the node and the fix when the head is only reached through a gateway (not a directly connected
    network), through loopback on a worker, or when the head does not hold the master address.
positional: _input, host, master_address, master_port, route, addresses
options:
  _input:
    description: The cluster's members in rank order (inventory hostnames).
    type: list
    elements: str
    required: true
  host:
    description: This node's inventory hostname.
    type: str
    required: true
  master_address:
    description: The head's address on the cluster network (vLLM's C(--master-addr)).
    type: str
    required: true
  master_port:
    description: The torch.distributed store's port on the head (vLLM's C(--master-port)).
    type: int
    required: true
  route:
    description: Output of C(ip -o route get MASTER_ADDRESS) on this node.
    type: str
    required: true
  addresses:
    description: Output of C(ip -o -4 addr show) on this node.
    type: str
    required: true
author: vllm-node
"""

EXAMPLES = r"""
cluster: >-
  {{ groups['cluster_a'] | vllm_node.vllm_node.vllm_cluster(inventory_hostname, '10.0.0.10', 29501,
     route_out.stdout, addr_out.stdout) }}
"""

RETURN = r"""
_value:
  description: >-
    C(rank), C(node_count), C(role) (V(head) or V(worker)), C(interface), C(address) (this node's cluster
    address), C(args) (the flags appended to vllm serve) and C(environment) (VLLM_HOST_IP, GLOO_SOCKET_IFNAME,
    NCCL_SOCKET_IFNAME).
  type: dict
"""


class ClusterError(ValueError):
    """A cluster that cannot run as configured; the message names the node and the fix."""


def parse_route(route: str) -> dict[str, str]:
    """The fields of `ip -o route get` output: dev, src, via, and `local` when the address is this host's."""
    words = str(route or "").split()
    fields = {key: words[i + 1] for i, key in enumerate(words[:-1]) if key in ("dev", "src", "via")}
    if words and words[0] == "local":
        fields["local"] = "yes"
    return fields


def interface_of(address: str, addresses: str) -> str:
    """The interface holding `address` in `ip -o -4 addr show` output, or ''."""
    for line in str(addresses or "").splitlines():
        match = re.match(r"\d+:\s+(\S+)\s+inet\s+([0-9.]+)/", line)
        if match and match.group(2) == address:
            return match.group(1).split("@", 1)[0]
    return ""


def cluster_interface(host: str, is_head: bool, master_address: str, route: str, addresses: str) -> tuple[str, str]:
    """(interface, this node's cluster address); ClusterError naming the node and the fix otherwise."""
    fields = parse_route(route)
    if is_head:
        interface = interface_of(master_address, addresses)
        if not interface:
            raise ClusterError(f"{host} is the head (rank 0) but holds no address {master_address}: set "
                               f"vllm_cluster_master_address to the head's address on the cluster network, or "
                               f"put the head first in the cluster group")
        return interface, master_address
    if not fields.get("dev"):
        raise ClusterError(f"{host} has no route to the head's cluster address {master_address} ({route.strip()!r}): "
                           f"connect {host} to the cluster network or fix vllm_cluster_master_address")
    if fields.get("local") or fields["dev"] == "lo":
        raise ClusterError(f"{host} holds the head's cluster address {master_address} itself but is not rank 0: "
                           f"put {host} first in the cluster group or fix vllm_cluster_master_address")
    if fields.get("via"):
        raise ClusterError(f"{host} reaches the head's cluster address {master_address} only through the gateway "
                           f"{fields['via']} on {fields['dev']}, not on a directly connected cluster network: "
                           f"connect {host} to the head's cluster network (torch.distributed would pick that "
                           f"interface and its traffic would leave the cluster network)")
    if not fields.get("src"):
        raise ClusterError(f"{host}: no source address on {fields['dev']} towards {master_address}; give "
                           f"{fields['dev']} an address on the cluster network")
    return fields["dev"], fields["src"]


def vllm_cluster(members: list[str], host: str, master_address: str, master_port: int, route: str,
                 addresses: str) -> dict[str, Any]:
    """This member's rank, role, interface, vLLM flags and environment (see DOCUMENTATION)."""
    members = [str(m) for m in members or []]
    if host not in members:
        raise ClusterError(f"{host} is not a member of the cluster group ({', '.join(members)})")
    if len(set(members)) != len(members):
        raise ClusterError(f"the cluster group lists a member twice ({', '.join(members)})")
    try:
        port = int(master_port)
    except (TypeError, ValueError):
        raise ClusterError(f"vllm_cluster_master_port must be a port number, got {master_port!r}") from None
    if not 0 < port < 65536:
        raise ClusterError(f"vllm_cluster_master_port must be in 1..65535, got {port}")
    if not master_address:
        raise ClusterError("vllm_cluster_master_address is empty: set it to the head's address on the cluster network")
    rank = members.index(host)
    interface, address = cluster_interface(host, rank == 0, str(master_address), route, addresses)
    args = ["--distributed-executor-backend", "mp", "--nnodes", str(len(members)), "--node-rank", str(rank),
            "--master-addr", str(master_address), "--master-port", str(port)]
    if rank > 0:
        args.append("--headless")
    return {
        "rank": rank,
        "node_count": len(members),
        "role": "head" if rank == 0 else "worker",
        "head": members[0],
        "interface": interface,
        "address": address,
        "args": args,
        "environment": {"VLLM_HOST_IP": address, "GLOO_SOCKET_IFNAME": interface, "NCCL_SOCKET_IFNAME": interface},
    }


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict:
        """The filters of this file."""
        return {"vllm_cluster": vllm_cluster}
