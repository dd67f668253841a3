"""GPU topology: parse `nvidia-smi topo -m` (the GPU-to-GPU link matrix, CPU and NUMA affinity) into one schema.

Pure functions (no Ansible state, stdlib only), used by the node_facts role through the filter
``nvidia_smi_topology`` (plugins/filter/gpu_inventory.py); the sizing's GPU placement (sizing/placement.py) reads
the result. The simulated node's nvidia-smi (tests/fixtures/gpu_node) prints the same layout.

The topology (``node_facts_gpu_topology``)::

    {"gpus": [{"index": 0, "numa": 0, "cpu_affinity": "0-47,96-143"}, ...],   # numa None when N/A
     "links": [["X", "NV18", ...], ...]}                                       # GPU x GPU, by index

The matrix is what `nvidia-smi topo -m` prints: tab-separated cells, the header row optionally wrapped in ANSI
underline escapes, NIC columns after the GPU columns (mlx5_0 on older drivers, NIC0 with a NIC legend on newer),
then CPU Affinity, NUMA Affinity and (newer drivers) GPU NUMA ID. A link is X (self), NV# (# bonded NVLinks), PIX,
PXB, PHB, NODE, SYS (SOC on old drivers). Anything else (an error text, no GPU) parses to {} (no topology known).
"""

from __future__ import annotations

import re
from typing import Any

_ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")
_COLUMN_RE = re.compile(r"^(GPU\d+|NIC\d+|mlx\d+_\d+)$")
_GPU_RE = re.compile(r"^GPU(\d+)$")
_LINK_RE = re.compile(r"^(X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC)$")
_NUMA_RE = re.compile(r"^\d+$")


def _tokens(line: str) -> list[str]:
    """A row's cells: ANSI escapes dropped, split on tabs and spaces (no cell of interest holds a space)."""
    return _ANSI_RE.sub("", line).split()


def _header(lines: list[str]) -> tuple[int, list[str]] | None:
    """The header's line number and its link columns (GPU0.., NIC0.. / mlx5_0..), or None without one."""
    for number, line in enumerate(lines):
        columns = [t for t in _tokens(line) if _COLUMN_RE.match(t)]
        if columns and columns[0] == "GPU0":
            return number, columns
    return None


def _row(tokens: list[str], columns: list[str]) -> dict[str, Any] | None:
    """One GPU row: its index, its links to the GPU columns, CPU and NUMA affinity; None when malformed."""
    match = _GPU_RE.match(tokens[0]) if tokens else None
    links = tokens[1:1 + len(columns)]
    if match is None or len(links) != len(columns) or not all(_LINK_RE.match(v) for v in links):
        return None
    rest = tokens[1 + len(columns):]
    cpu = rest[0] if rest else None
    numa = int(rest[1]) if len(rest) > 1 and _NUMA_RE.match(rest[1]) else None
    gpu_links = [v for c, v in zip(columns, links, strict=True) if _GPU_RE.match(c)]
    return {"index": int(match.group(1)), "numa": numa, "cpu_affinity": None if cpu in (None, "N/A") else cpu,
            "links": gpu_links}


def parse_topology(text: str) -> dict[str, Any]:
    """`nvidia-smi topo -m` -> {gpus, links} (see the module docstring); {} when it holds no GPU matrix.

    A row whose cells are not links, or a matrix that is not square over the GPUs, gives {} too: a partial topology
    would place GPUs on wrong assumptions, no topology places them by index.
    """
    lines = [line for line in str(text or "").splitlines() if line.strip()]
    found = _header(lines)
    if found is None:
        return {}
    start, columns = found
    gpu_columns = [int(_GPU_RE.match(c).group(1)) for c in columns if _GPU_RE.match(c)]  # type: ignore[union-attr]
    rows = []
    for line in lines[start + 1:]:
        tokens = _tokens(line)
        if not tokens or not _GPU_RE.match(tokens[0]):
            continue
        row = _row(tokens, columns)
        if row is None:
            return {}
        rows.append(row)
    if sorted(r["index"] for r in rows) != sorted(gpu_columns) or gpu_columns != list(range(len(gpu_columns))):
        return {}
    rows.sort(key=lambda r: r["index"])
    if any(r["links"][r["index"]] != "X" for r in rows):
        return {}
    return {"gpus": [{k: r[k] for k in ("index", "numa", "cpu_affinity")} for r in rows],
            "links": [r["links"] for r in rows]}

