"""Model directories as model_download leaves them on a node, written with the role's own record and marker shapes
(module_utils/model_download/files.py), for the tests of what reads or deletes them."""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from ansible_collections.vllm_node.vllm_node.plugins.module_utils.model_download import files as mdf


def downloaded_model(root: Path, repo: str, files: Mapping[str, bytes], commits: Sequence[str]) -> Path:
    """<root>/<repo>/ with its record (.vllm-node-download.json naming the repo and the last commit) and, per commit,
    revisions/<commit>/ holding the files and the completion marker. The later commits hard-link the first one's
    files, as model_download links the shards that did not change. Returns <root>/<repo>."""
    base = root / repo
    listing = [{"type": "file", "path": path, "size": len(data)} for path, data in sorted(files.items())]
    selected = mdf.select_files(listing)
    hashes = {path: hashlib.sha256(data).hexdigest() for path, data in sorted(files.items())}
    for index, commit in enumerate(commits):
        directory = base / "revisions" / commit
        directory.mkdir(parents=True)
        for path, data in sorted(files.items()):
            target = directory / path
            target.parent.mkdir(parents=True, exist_ok=True)
            if index:
                os.link(base / "revisions" / commits[0] / path, target)
            else:
                target.write_bytes(data)
        marker = mdf.new_marker(repo, commit, selected, True, hashes, "2026-01-01T00:00:00+00:00")
        (directory / mdf.MARKER_NAME).write_text(json.dumps(marker))
    request = {"repo": repo, "revision": commits[-1], "endpoint": "http://hub", "include": [], "exclude": []}
    record = mdf.new_record(request, commits[-1], listing, "2026-01-01T00:00:00+00:00")
    (base / mdf.RECORD_NAME).write_text(json.dumps(record))
    return base


def tree(path: Path) -> dict[str, int]:
    """{relative path: size} of every file below a directory (what a test compares before and after)."""
    return {p.relative_to(path).as_posix(): p.stat().st_size for p in sorted(path.rglob("*")) if p.is_file()}
