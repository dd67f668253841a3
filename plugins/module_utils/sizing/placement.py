"""Which GPUs each instance gets: disjoint groups chosen from the node's topology (pure, no sizing).

The topology is node_facts_gpu_topology (plugins/module_utils/gpu_topology.py: `nvidia-smi topo -m` parsed):
a GPU x GPU matrix of links. A group is better the closer its farthest pair is (NVLink, then one PCIe switch,
several, the host bridge, the same NUMA node, across sockets), then the closer its pairs are on the whole, then the
fewer NUMA nodes it spans, then the lower its indices. Without a topology (the controller's plan.yml) every pair is
equally far and groups are taken in index order.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# A link's distance: X (self) 0, NV# 1 (more bonded links slightly closer), then PCIe hops, NUMA node, sockets.
_PCIE_COST = {"PIX": 2.0, "PXB": 3.0, "PHB": 4.0, "NODE": 5.0, "SYS": 6.0, "SOC": 6.0}
_UNKNOWN_COST = 6.0
_NV_RE = re.compile(r"^NV(\d+)$")
# Beyond this many candidate groups the search goes by NUMA node and index instead of trying every group.
_MAX_CANDIDATES = 20000
LINK_WORDS = {"PIX": "one PCIe switch", "PXB": "several PCIe switches", "PHB": "a PCIe host bridge",
              "NODE": "one NUMA node", "SYS": "across NUMA nodes", "SOC": "across NUMA nodes"}


def link_cost(link: str) -> float:
    """How far two GPUs are by their `topo -m` cell: 0 self, ~1 NVLink, 2-6 PCIe hops up to across sockets."""
    if link == "X":
        return 0.0
    match = _NV_RE.match(link)
    if match:
        return 1.0 + 1.0 / (1 + int(match.group(1)))
    return _PCIE_COST.get(link, _UNKNOWN_COST)


@dataclass(frozen=True)
class Topology:
    """The node's GPUs as placement sees them: indices, NUMA node per GPU (None: unknown), links."""

    indices: tuple[int, ...]
    numa: Mapping[int, int | None]
    links: Mapping[tuple[int, int], str]

    @classmethod
    def of(cls, facts: Mapping[str, Any] | None, count: int) -> Topology:
        """From node_facts_gpu_topology, or GPUs 0..count-1 with unknown links when it is empty or shorter."""
        gpus = list((facts or {}).get("gpus") or [])
        matrix = list((facts or {}).get("links") or [])
        if len(gpus) < count or len(matrix) != len(gpus):
            return cls(tuple(range(count)), dict.fromkeys(range(count)), {})
        indices = tuple(int(g["index"]) for g in gpus)
        links = {(a, b): str(matrix[i][j]) for i, a in enumerate(indices) for j, b in enumerate(indices)}
        return cls(indices, {int(g["index"]): g.get("numa") for g in gpus}, links)

    @property
    def known(self) -> bool:
        """Whether the links are known (from nvidia-smi topo -m)."""
        return bool(self.links)

    def link(self, a: int, b: int) -> str:
        """The `topo -m` cell between two GPUs ('' when unknown)."""
        return "X" if a == b else self.links.get((a, b), "")


def group_score(topology: Topology, group: Sequence[int]) -> tuple[float, float, int, tuple[int, ...]]:
    """Sort key of a candidate group, lower is better: farthest pair, sum over pairs, NUMA nodes spanned, indices."""
    costs = [link_cost(topology.link(a, b)) for a, b in itertools.combinations(group, 2)] if topology.known else []
    spans = len({topology.numa.get(g) for g in group})
    return (max(costs, default=0.0), sum(costs), spans, tuple(sorted(group)))


def best_group(topology: Topology, free: Sequence[int], size: int) -> tuple[int, ...] | None:
    """The best group of `size` GPUs among `free`, or None when too few are free."""
    free = sorted(free)
    if size > len(free) or size < 1:
        return None
    if not topology.known:
        return tuple(free[:size])
    candidates: Iterable[tuple[int, ...]]
    if math.comb(len(free), size) <= _MAX_CANDIDATES:
        candidates = itertools.combinations(free, size)
    else:   # contiguous windows in (NUMA, index) order: the groups a large node's islands make
        ordered = sorted(free, key=lambda g: (topology.numa.get(g) is None, topology.numa.get(g) or 0, g))
        candidates = (tuple(ordered[i:i + size]) for i in range(len(ordered) - size + 1))
    return tuple(sorted(min(candidates, key=lambda c: group_score(topology, c))))


def place(topology: Topology, wanted: Sequence[int | Sequence[int]]) -> list[tuple[int, ...] | None]:
    """A group per request, in the requests' order: explicit indices as given, counts from the GPUs left.

    Counts are served largest first (the largest instance gets the best island; ties in the given order); a count
    that no longer fits gets None. Explicit groups may overlap (GPUs shared on purpose): they are not taken from
    the free GPUs twice, and counts never land on them.
    """
    taken = {g for request in wanted if not isinstance(request, int) for g in request}
    free = [g for g in topology.indices if g not in taken]
    groups: list[tuple[int, ...] | None] = [None if isinstance(r, int) else tuple(sorted(r)) for r in wanted]
    counts = {i: r for i, r in enumerate(wanted) if isinstance(r, int)}
    for i in sorted(counts, key=lambda i: (-counts[i], i)):
        group = best_group(topology, free, counts[i])
        groups[i] = group
        if group is not None:
            free = [g for g in free if g not in group]
    return groups


def describe_group(topology: Topology, group: Sequence[int]) -> str:
    """Why this group: its farthest link in words, and its NUMA node(s), e.g. 'one PCIe switch, NUMA node 1'."""
    if not topology.known:
        return "topology unknown (no nvidia-smi topo -m): GPUs in index order"
    links = [topology.link(a, b) for a, b in itertools.combinations(group, 2)]
    worst = max(links, key=link_cost) if links else "X"
    nodes = sorted({str(topology.numa.get(g)) for g in group})
    where = "one GPU" if worst == "X" else \
        f"NVLink ({worst})" if _NV_RE.match(worst) else LINK_WORDS.get(worst, worst)
    return f"{where}, NUMA node{'s' if len(nodes) > 1 else ''} {', '.join(nodes)}"
