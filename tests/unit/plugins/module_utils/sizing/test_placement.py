"""placement: disjoint GPU groups from the topology, the closest GPUs together, explicit groups as given."""
from __future__ import annotations

import itertools
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from ansible_collections.vllm_node.vllm_node.plugins.module_utils.sizing.placement import (
    Topology,
    best_group,
    describe_group,
    group_score,
    link_cost,
    place,
)


def two_sockets(n: int = 8, nvlink: tuple[int, ...] = ()) -> Topology:
    """n GPUs, the first half on NUMA node 0, pairs behind one PCIe switch; `nvlink` GPUs bonded with NV18."""
    numa = [0 if i < n // 2 else 1 for i in range(n)]
    links = [["X" if i == j else "NV18" if i in nvlink and j in nvlink else "PIX" if i // 2 == j // 2
              else "NODE" if numa[i] == numa[j] else "SYS" for j in range(n)] for i in range(n)]
    return Topology.of({"gpus": [{"index": i, "numa": numa[i]} for i in range(n)], "links": links}, n)


def test_links_rank_nvlink_then_pcie_hops_then_sockets() -> None:
    order = ["X", "NV18", "NV4", "PIX", "PXB", "PHB", "NODE", "SYS"]
    assert [link_cost(v) for v in order] == sorted(link_cost(v) for v in order)
    assert link_cost("SOC") == link_cost("SYS") and link_cost("???") == link_cost("SYS")


def test_a_pair_shares_a_switch_and_four_share_a_numa_node() -> None:
    topo = two_sockets()
    groups = place(topo, [2, 4, 2])
    assert groups == [(4, 5), (0, 1, 2, 3), (6, 7)]
    assert describe_group(topo, (4, 5)) == "one PCIe switch, NUMA node 1"
    assert describe_group(topo, (0, 1, 2, 3)) == "one NUMA node, NUMA node 0"


def test_nvlink_wins_over_index_order() -> None:
    topo = two_sockets(nvlink=(2, 5))
    assert best_group(topo, range(8), 2) == (2, 5)
    assert describe_group(topo, (2, 5)).startswith("NVLink (NV18)")


def test_explicit_groups_are_kept_and_counts_avoid_them() -> None:
    topo = two_sockets()
    assert place(topo, [[6, 7], 4, [7, 6]]) == [(6, 7), (0, 1, 2, 3), (6, 7)]
    assert place(topo, [6, 4]) == [(0, 1, 2, 3, 4, 5), None]   # no GPUs left for the second count


def test_without_topology_groups_follow_index_order() -> None:
    topo = Topology.of({}, 8)
    assert not topo.known
    assert place(topo, [2, 6]) == [(6, 7), (0, 1, 2, 3, 4, 5)]
    assert describe_group(topo, (0, 1)).startswith("topology unknown")


@st.composite
def nodes(draw: Any) -> tuple[Topology, list[int]]:
    """A node of 1..10 GPUs with random NUMA nodes and links, and counts that fit it."""
    n = draw(st.integers(1, 10))
    numa = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    cells = st.sampled_from(["NV6", "PIX", "PXB", "PHB", "NODE", "SYS"])
    links = [["X"] * n for _ in range(n)]
    for i, j in itertools.combinations(range(n), 2):
        links[i][j] = links[j][i] = draw(cells)
    counts = draw(st.lists(st.integers(1, n), min_size=1, max_size=4))
    return Topology.of({"gpus": [{"index": i, "numa": numa[i]} for i in range(n)], "links": links}, n), counts


@given(nodes())
def test_groups_are_disjoint_sized_and_none_only_when_too_few_are_left(node: tuple[Topology, list[int]]) -> None:
    topo, counts = node
    groups = place(topo, list(counts))
    placed = [g for g in groups if g is not None]
    flat = [i for g in placed for i in g]
    assert len(flat) == len(set(flat)) and set(flat) <= set(topo.indices)
    for count, group in zip(counts, groups, strict=True):
        assert group is None or len(group) == count
    if sum(counts) <= len(topo.indices):
        assert all(g is not None for g in groups)


@given(nodes())
def test_the_chosen_group_is_the_best_of_all_candidates(node: tuple[Topology, list[int]]) -> None:
    topo, counts = node
    size = counts[0]
    chosen = best_group(topo, topo.indices, size)
    assert chosen is not None
    best = min(group_score(topo, c) for c in itertools.combinations(topo.indices, size))
    assert group_score(topo, chosen) == best
