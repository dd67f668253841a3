"""Weights into the page cache before a restart (plugins/module_utils/page_cache.py): the budget decision, the files
a revision directory holds (each real file once), MemAvailable, and residency measured with mincore on real files."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ansible_collections.vllm_node.vllm_node.plugins.module_utils import page_cache

GiB = 1 << 30


def test_the_weights_are_warmed_only_when_they_fit_in_the_share_of_available_memory() -> None:
    fits = page_cache.decide(10 * GiB, 100 * GiB, 0.5)
    assert fits.warm and fits.budget_bytes == 50 * GiB and fits.reason == ""
    edge = page_cache.decide(50 * GiB, 100 * GiB, 0.5)
    assert edge.warm, "exactly the budget fits"
    story = page_cache.decide(540 * 10**9, 480 * GiB, 0.5)   # the story's 540 GB on a node with 480 GiB free
    assert not story.warm
    assert story.reason.startswith("the weights (502.9 GiB) exceed what the page cache can hold for them (0.5 of "
                                   "480.0 GiB available = 240.0 GiB)"), story.reason
    nothing = page_cache.decide(0, 100 * GiB, 0.5)
    assert not nothing.warm and "no weight files there yet" in nothing.reason


def test_mem_available_is_read_from_proc_meminfo() -> None:
    text = "MemTotal:       24576000 kB\nMemFree:         1000000 kB\nMemAvailable:   16000000 kB\n"
    assert page_cache.mem_available(text) == 16000000 * 1024
    with pytest.raises(ValueError, match="MemAvailable"):
        page_cache.mem_available("MemTotal: 1 kB\n")


def test_a_revision_s_weight_files_are_listed_once_each(tmp_path: Path) -> None:
    (tmp_path / "a.safetensors").write_bytes(b"x" * 100)
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.bin").write_bytes(b"y" * 50)
    os.link(tmp_path / "a.safetensors", tmp_path / "sub" / "a-linked.safetensors")   # a shard shared by hard link
    (tmp_path / "c.safetensors").symlink_to(tmp_path / "a.safetensors")
    (tmp_path / "empty.safetensors").write_bytes(b"")
    files = page_cache.model_files(str(tmp_path))
    assert [(Path(p).name, s) for p, s in files] == [("a.safetensors", 100), ("b.bin", 50)]
    assert page_cache.model_files(str(tmp_path / "missing")) == []


@pytest.fixture()
def on_disk() -> Iterator[Path]:
    """A 4 MiB file on a disk-backed filesystem (tmpfs keeps every page resident and cannot show the effect)."""
    directory = Path(tempfile.mkdtemp(dir="/var/tmp" if os.path.isdir("/var/tmp") else None))
    path = directory / "shard.safetensors"
    path.write_bytes(os.urandom(4 << 20))
    try:
        yield path
    finally:
        path.unlink()
        directory.rmdir()


def evict(path: Path) -> int:
    """Drop the file's clean pages from the page cache; the bytes still resident afterwards."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return page_cache.resident_bytes(str(path), path.stat().st_size) or 0


def test_residency_follows_a_read_and_an_eviction(on_disk: Path) -> None:
    size = on_disk.stat().st_size
    page_cache.stream(str(on_disk), size)
    assert page_cache.resident_bytes(str(on_disk), size) == size, "a file just read is in the page cache"
    if evict(on_disk) == size:
        pytest.skip("this filesystem does not drop clean pages on POSIX_FADV_DONTNEED")
    assert page_cache.resident_bytes(str(on_disk), size) < size


def test_willneed_brings_an_evicted_file_back_and_the_report_says_so(on_disk: Path) -> None:
    size = on_disk.stat().st_size
    if evict(on_disk) == size:
        pytest.skip("this filesystem does not drop clean pages on POSIX_FADV_DONTNEED")
    files = [(str(on_disk), size)]
    done = page_cache.warm(files, page_cache.advise)
    assert done["resident_bytes_before"] < size
    deadline = time.monotonic() + 10
    while page_cache.residency(files) != size:   # the kernel reads ahead asynchronously
        assert time.monotonic() < deadline, "WILLNEED did not bring the file into the page cache within 10 s"
        time.sleep(0.05)
    decision = page_cache.decide(size, 100 * GiB, 0.5)
    report = page_cache.report(str(on_disk.parent), decision, files, done, 100 * GiB, "willneed")
    assert report["warmed"] and report["files"] == 1 and report["bytes"] == size and report["reason"] == ""
    skipped = page_cache.report(str(on_disk.parent), page_cache.decide(size, 1000, 0.5), files, None, 1000, "read")
    assert not skipped["warmed"] and skipped["resident_bytes_after"] is None and "exceed" in skipped["reason"]
