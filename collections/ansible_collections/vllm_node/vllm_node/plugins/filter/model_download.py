"""Pure helpers for the model_download role: file selection and size bookkeeping.

Kept free of Ansible state so they can be unit-tested (tests/unit/test_model_download_filters.py).
"""

from __future__ import annotations

import fnmatch
import re
from typing import Any, Iterable

_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")


def _normalise_patterns(patterns: Iterable[str] | None) -> list[str]:
    """Apply the Hub client's convention: a pattern ending in '/' means 'everything below'."""
    out: list[str] = []
    for pattern in patterns or []:
        out.append(pattern + "*" if pattern.endswith("/") else pattern)
    return out


def select_files(
    listing: list[dict[str, Any]],
    include: Iterable[str] | None = None,
    exclude: Iterable[str] | None = None,
) -> list[dict[str, Any]]:
    """Keep the files of a `hf models ls -R --format json` listing matching include and not exclude.

    Same semantics as huggingface_hub's allow/ignore patterns: fnmatch on the repo path, an empty
    include list selects everything. Folders are dropped. Returns [{path, size}] sorted by path.
    """
    allow = _normalise_patterns(include)
    ignore = _normalise_patterns(exclude)
    selected: list[dict[str, Any]] = []
    for item in listing:
        path = item.get("path")
        if not path or item.get("type", "file") != "file" or "size" not in item:
            continue
        if allow and not any(fnmatch.fnmatch(path, p) for p in allow):
            continue
        if any(fnmatch.fnmatch(path, p) for p in ignore):
            continue
        selected.append({"path": path, "size": int(item["size"])})
    return sorted(selected, key=lambda f: f["path"])


def split_metadata(files: list[dict[str, Any]], metadata_patterns: Iterable[str]) -> list[dict[str, Any]]:
    """Return the files whose path matches one of the metadata patterns (the small files)."""
    patterns = _normalise_patterns(metadata_patterns)
    return [f for f in files if any(fnmatch.fnmatch(f["path"], p) for p in patterns)]


def parse_local_listing(text: str) -> dict[str, int]:
    """Parse `find DIR -type f -printf '%s %P\\n'` output (size, space, relative path) into {path: size}."""
    sizes: dict[str, int] = {}
    for line in text.splitlines():
        size, sep, path = line.partition(" ")
        if sep and path and size.isdigit():
            sizes[path] = int(size)
    # model_config keeps the pristine file as <file>.orig beside its patched copy: the original is what the Hub
    # served, so its size stands for the file (a patched config is not a missing or broken download).
    for path in [p for p in sizes if p.endswith(".orig")]:
        if path[: -len(".orig")] in sizes:
            sizes[path[: -len(".orig")]] = sizes[path]
    return sizes


def missing_files(expected: list[dict[str, Any]], local: dict[str, int]) -> list[dict[str, Any]]:
    """Expected files that are absent locally or whose size differs from the Hub's."""
    return [f for f in expected if local.get(f["path"]) != f["size"]]


def total_size(files: list[dict[str, Any]]) -> int:
    """Sum of the 'size' fields."""
    return sum(int(f["size"]) for f in files)


def is_commit(revision: str) -> bool:
    """True when the revision is a full 40-hex commit id (no resolution needed)."""
    return bool(_COMMIT_RE.match(revision or ""))


def verify_mismatches(text: str) -> list[str]:
    """Paths named as checksum mismatches in `hf cache verify` output ('  - PATH: expected ...')."""
    return re.findall(r"^\s*- (.+?): expected \S+", text or "", flags=re.MULTILINE)


def progress_line(done: int, total: int, elapsed: float) -> str:
    """One progress line: bytes, percent, rate and ETA (total may be 0)."""
    done = max(0, min(done, total)) if total > 0 else done  # du also counts hf's own small bookkeeping files
    pct = 100.0 if total <= 0 else 100.0 * done / total
    rate = done / elapsed if elapsed > 0 else 0.0
    eta = (total - done) / rate if rate > 0 and total > done else 0.0
    return (
        f"{_human(done)} / {_human(total)} ({pct:.1f} %), {_human(rate)}/s, "
        f"elapsed {int(elapsed)} s, ETA {int(eta)} s"
    )


def _human(num: float) -> str:
    """Binary-prefixed size (GiB, MiB...)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(num) < 1024 or unit == "TiB":
            return f"{num:.0f} {unit}" if unit == "B" else f"{num:.2f} {unit}"
        num /= 1024.0
    return f"{num:.2f} TiB"


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict[str, Any]:
        return {
            "model_download_select": select_files,
            "model_download_metadata": split_metadata,
            "model_download_local_sizes": parse_local_listing,
            "model_download_missing": missing_files,
            "model_download_total": total_size,
            "model_download_is_commit": is_commit,
            "model_download_verify_mismatches": verify_mismatches,
            "model_download_progress": progress_line,
            "model_download_human": _human,
        }
