"""The model's files in the page cache before a restart reads them (issue 29, "weights ready before the stop").

While a node drains, its weights are read into the page cache so that the restart's weight loading reads memory, not
disk. The budget is a share of the memory the kernel reports available at that moment (MemAvailable): more would
evict what the node needs, and a checkpoint larger than the budget gains little (its first shards are evicted by its
last ones before vLLM reads them), so it is skipped and the reason says so. The request is posix_fadvise
WILLNEED per file (the kernel reads ahead asynchronously, the drain goes on) or a streaming read (synchronous, the
figure measured end to end). Residency is measured with mincore(2) over a read-only mapping of each file.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

GiB = 1 << 30
READ_CHUNK = 8 << 20
# What a model directory holds that vLLM reads at start-up: the weights and the small files beside them.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


@dataclass(frozen=True)
class Decision:
    """Whether to warm the files, their bytes, the budget, and why not when not."""

    warm: bool
    total_bytes: int
    budget_bytes: int
    reason: str


def model_files(root: str) -> list[tuple[str, int]]:
    """(path, size) of every regular file under root that vLLM's loader reads (weights), links resolved, each
    real file once (a revision directory hard-links or symlinks the shards it shares with another)."""
    seen: set[tuple[int, int]] = set()
    found: list[tuple[str, int]] = []
    for directory, _dirs, names in os.walk(root):
        for name in sorted(names):
            if not name.endswith(WEIGHT_SUFFIXES):
                continue
            path = os.path.join(directory, name)
            try:
                st = os.stat(path)
            except OSError:
                continue
            if (st.st_dev, st.st_ino) in seen or not st.st_size:
                continue
            seen.add((st.st_dev, st.st_ino))
            found.append((path, st.st_size))
    return sorted(found)


def mem_available(meminfo: str) -> int:
    """MemAvailable from /proc/meminfo's text, in bytes; ValueError when it is not there."""
    for line in meminfo.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise ValueError("no MemAvailable line in /proc/meminfo (a kernel older than 3.14?)")


def decide(total_bytes: int, available_bytes: int, fraction: float) -> Decision:
    """Warm when the weights fit in `fraction` of the memory available now; otherwise say why not."""
    budget = int(available_bytes * fraction)
    if total_bytes == 0:
        return Decision(False, 0, budget, "no weight files there yet (a new revision is written during the change)")
    if total_bytes > budget:
        return Decision(False, total_bytes, budget,
                        f"the weights ({total_bytes / GiB:.1f} GiB) exceed what the page cache can hold for them "
                        f"({fraction:g} of {available_bytes / GiB:.1f} GiB available = {budget / GiB:.1f} GiB): "
                        "the restart reads them from disk")
    return Decision(True, total_bytes, budget, "")


def _libc() -> Any:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte)]
    return libc


def resident_bytes(path: str, size: int) -> int | None:
    """Bytes of the file that are in the page cache now (mincore over a read-only mapping); None if unknown."""
    if size == 0:
        return 0
    try:
        libc = _libc()
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            return None
        try:
            page = mmap.PAGESIZE
            pages = (size + page - 1) // page
            vec = (ctypes.c_ubyte * pages)()
            if libc.mincore(addr, size, vec) != 0:
                return None
            return min(size, sum(v & 1 for v in vec) * page)
        finally:
            libc.munmap(addr, size)
    finally:
        os.close(fd)


def advise(path: str, size: int) -> None:
    """posix_fadvise WILLNEED over the whole file: the kernel reads it ahead, this returns at once."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, size, os.POSIX_FADV_WILLNEED)
    finally:
        os.close(fd)


def stream(path: str, _size: int) -> None:
    """Read the file once from start to end (the pages stay cached)."""
    with open(path, "rb", buffering=0) as handle:
        while handle.read(READ_CHUNK):
            pass


def residency(files: Iterable[tuple[str, int]]) -> int | None:
    """Bytes of `files` in the page cache now; None when any is unknown."""
    total = 0
    for path, size in files:
        found = resident_bytes(path, size)
        if found is None:
            return None
        total += found
    return total


def warm(files: list[tuple[str, int]], how: Callable[[str, int], None],
         clock: Callable[[], float] = time.monotonic) -> dict[str, Any]:
    """Apply `how` (advise or stream) to each file; the seconds it took and the residency before and after."""
    before = residency(files)
    start = clock()
    for path, size in files:
        how(path, size)
    seconds = round(clock() - start, 3)
    return {"resident_bytes_before": before, "resident_bytes_after": residency(files), "seconds": seconds}


def report(root: str, decision: Decision, files: list[tuple[str, int]], done: Mapping[str, Any] | None,
           available: int, mode: str) -> dict[str, Any]:
    """What the module returns."""
    out: dict[str, Any] = {"path": root, "mode": mode, "files": len(files), "bytes": decision.total_bytes,
                           "mem_available_bytes": available, "budget_bytes": decision.budget_bytes,
                           "warmed": bool(done), "reason": decision.reason}
    out.update(done or {"resident_bytes_before": residency(files), "resident_bytes_after": None, "seconds": 0.0})
    return out
