"""gpu_topology.parse_topology: `nvidia-smi topo -m` as drivers print it (tabs, an ANSI-underlined header, NIC
columns, CPU/NUMA affinity, old and new layouts) -> {gpus, links}; anything else -> {} (no topology known)."""
from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ansible_collections.vllm_node.vllm_node.plugins.module_utils.gpu_topology import parse_topology

# Laid out like a DGX H100 on driver 570+ (8 GPUs all-to-all over NVSwitch, NV18; 4 NICs; two sockets).
DGX_H100 = (
    "\t\x1b[4mGPU0\tGPU1\tGPU2\tGPU3\tGPU4\tGPU5\tGPU6\tGPU7\tNIC0\tNIC1\tNIC2\tNIC3\tCPU Affinity\tNUMA Affinity"
    "\tGPU NUMA ID\x1b[0m\n"
    + "".join(
        f"GPU{i}\t" + "\t".join(" X " if j == i else "NV18" for j in range(8)) + "\t"
        + "\t".join(("PIX" if i // 2 == k else "NODE" if i // 4 == k // 2 else "SYS") for k in range(4))
        + ("\t0-55,112-167\t0\t\tN/A\n" if i < 4 else "\t56-111,168-223\t1\t\tN/A\n")
        for i in range(8))
    + "NIC0\tPIX\tPIX\tNODE\tNODE\tSYS\tSYS\tSYS\tSYS\t X \tNODE\tSYS\tSYS\n"
    + "\nLegend:\n\n  X    = Self\n  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA "
      "nodes (e.g., QPI/UPI)\n  NV#  = Connection traversing a bonded set of # NVLinks\n\nNIC Legend:\n\n"
      "  NIC0: mlx5_0\n  NIC1: mlx5_1\n")
# An older driver: NICs named by device in the header, SOC for the socket link, no GPU NUMA ID column, spaces.
OLD_PCIE = """        GPU0    GPU1    GPU2    GPU3    mlx5_0  CPU Affinity    NUMA Affinity
GPU0     X      PIX     SOC     SOC     PHB     0-13,28-41      0
GPU1    PIX      X      SOC     SOC     PHB     0-13,28-41      0
GPU2    SOC     SOC      X      PIX     SOC     14-27,42-55     1
GPU3    SOC     SOC     PIX      X      SOC     14-27,42-55     1
mlx5_0  PHB     PHB     SOC     SOC      X

Legend:

  X    = Self
  SOC  = Connection traversing PCIe as well as the SMP link between CPU sockets(e.g. QPI)
"""


def test_a_dgx_matrix_gives_every_gpu_its_numa_node_and_nvlinks() -> None:
    topo = parse_topology(DGX_H100)
    assert [g["numa"] for g in topo["gpus"]] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert topo["gpus"][5]["cpu_affinity"] == "56-111,168-223"
    assert topo["links"][0] == ["X"] + ["NV18"] * 7
    assert all(len(row) == 8 for row in topo["links"])   # NIC columns are not GPU links


def test_an_old_layout_with_device_named_nics_and_soc_parses() -> None:
    topo = parse_topology(OLD_PCIE)
    assert [g["numa"] for g in topo["gpus"]] == [0, 0, 1, 1]
    assert topo["links"][0] == ["X", "PIX", "SOC", "SOC"]
    assert topo["links"][3] == ["SOC", "SOC", "PIX", "X"]


@pytest.mark.parametrize("text", [
    "", "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n",
    "No devices were found\n",
    OLD_PCIE.replace("GPU1    PIX      X", "GPU1    PIX      Y"),        # a cell that is not a link
    OLD_PCIE.replace("GPU3    SOC     SOC     PIX      X      SOC     14-27,42-55     1\n", ""),   # a row missing
    OLD_PCIE.replace("GPU0     X      PIX", "GPU0    PIX      X "),      # self not on the diagonal
])
def test_anything_but_a_whole_gpu_matrix_is_no_topology(text: str) -> None:
    assert parse_topology(text) == {}


def test_numa_not_available_is_none() -> None:
    text = OLD_PCIE.replace("0-13,28-41      0", "N/A      N/A")
    topo = parse_topology(text)
    assert topo["gpus"][0] == {"index": 0, "numa": None, "cpu_affinity": None}


LINKS = st.sampled_from(["NV4", "NV12", "NV18", "PIX", "PXB", "PHB", "NODE", "SYS"])


@st.composite
def matrices(draw: Any) -> tuple[list[list[str]], list[int]]:
    """A symmetric link matrix over 1..12 GPUs and a NUMA node per GPU."""
    n = draw(st.integers(1, 12))
    links = [["X"] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            links[i][j] = links[j][i] = draw(LINKS)
    return links, draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))


@given(matrices(), st.booleans())
def test_any_matrix_in_the_driver_layout_parses_back(matrix: tuple[list[list[str]], list[int]], ansi: bool) -> None:
    links, numa = matrix
    names = [f"GPU{i}" for i in range(len(links))]
    head = "\t".join([*names, "NIC0", "CPU Affinity", "NUMA Affinity", "GPU NUMA ID"])
    lines = ["\t" + (f"\x1b[4m{head}\x1b[0m" if ansi else head)]
    for i, row in enumerate(links):
        cells = [" X " if v == "X" else v for v in row]
        lines.append("\t".join([names[i], *cells, "SYS", f"{numa[i] * 8}-{numa[i] * 8 + 7}", str(numa[i]), "", "N/A"]))
    topo = parse_topology("\n".join(lines) + "\n\nLegend:\n")
    assert topo["links"] == links
    assert [g["numa"] for g in topo["gpus"]] == numa
