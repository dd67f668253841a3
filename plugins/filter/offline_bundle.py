"""Filters of the offline_bundle role."""

from __future__ import annotations

from typing import Any


def model_files(files: dict[str, dict[str, Any]], prefix: str) -> list[dict[str, Any]]:
    """The model files of a bundle manifest (`files`: path -> {sha256, size}) under `prefix`, in model_download's
    record shape: [{path, size, sha256}] sorted by path, paths relative to the snapshot, its SHA256SUMS left out."""
    selected = [
        {"path": path[len(prefix):], "size": int(entry["size"]), "sha256": str(entry["sha256"])}
        for path, entry in files.items()
        if path.startswith(prefix) and path[len(prefix):] != "SHA256SUMS"
    ]
    return sorted(selected, key=lambda f: f["path"])


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict[str, Any]:
        return {"offline_bundle_model_files": model_files}
