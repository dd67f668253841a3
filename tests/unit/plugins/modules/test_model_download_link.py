"""The model_download_link module: atomic hard links of unchanged files, hf metadata copied, safe skips."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from ansible_collections.vllm_node.vllm_node.plugins.modules import model_download_link as mdl


def revision(tmp_path: Path, name: str, files: dict[str, bytes]) -> Path:
    root = tmp_path / name
    for path, data in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_bytes(data)
        meta = root / ".cache" / "huggingface" / "download" / f"{path}.metadata"
        meta.parent.mkdir(parents=True, exist_ok=True)
        meta.write_text(f"{name}\netag-{path}\n1.0\n")
    return root


def link(src: Path, path: str, size: int, source_path: str | None = None) -> dict[str, object]:
    rel = source_path or path
    return {"path": path, "size": size, "source": str(src / rel),
            "metadata": str(src / ".cache" / "huggingface" / "download" / f"{rel}.metadata")}


def test_links_files_copies_metadata_and_is_idempotent(tmp_path: Path) -> None:
    a = revision(tmp_path, "a", {"m1.safetensors": b"x" * 10, "sub/m2.safetensors": b"y" * 4})
    b = tmp_path / "b"
    b.mkdir()
    (b / "m1.safetensors").write_bytes(b"partial")  # a stale file is replaced, not appended to
    links = [link(a, "m1.safetensors", 10), link(a, "deep/m2.safetensors", 4, "sub/m2.safetensors")]
    result = mdl.run(str(b), links, check_mode=False)
    assert result == {"changed": True, "linked": ["m1.safetensors", "deep/m2.safetensors"], "linked_bytes": 14,
                      "not_linked": []}
    assert (b / "m1.safetensors").stat().st_ino == (a / "m1.safetensors").stat().st_ino
    assert (a / "m1.safetensors").stat().st_nlink == 2
    meta = b / ".cache" / "huggingface" / "download" / "deep" / "m2.safetensors.metadata"
    assert meta.read_text() == "a\netag-sub/m2.safetensors\n1.0\n"
    assert meta.stat().st_ino != (a / ".cache/huggingface/download/sub/m2.safetensors.metadata").stat().st_ino, (
        "the metadata is a copy: hf rewrites it in place for the new commit")
    assert not list(b.rglob("*.vllm-node-link.*"))
    again = mdl.run(str(b), links, check_mode=False)
    assert again == {"changed": False, "linked": [], "linked_bytes": 0, "not_linked": []}


def test_check_mode_reports_and_changes_nothing(tmp_path: Path) -> None:
    a = revision(tmp_path, "a", {"m1.safetensors": b"x" * 10})
    b = tmp_path / "b"
    b.mkdir()
    result = mdl.run(str(b), [link(a, "m1.safetensors", 10)], check_mode=True)
    assert result["changed"] and result["linked"] == ["m1.safetensors"]
    assert list(b.iterdir()) == []


def test_a_source_of_the_wrong_size_or_missing_is_skipped(tmp_path: Path) -> None:
    a = revision(tmp_path, "a", {"m1.safetensors": b"x" * 10})
    b = tmp_path / "b"
    b.mkdir()
    result = mdl.run(str(b), [link(a, "m1.safetensors", 11), link(a, "gone.safetensors", 3)], check_mode=False)
    assert not result["changed"]
    assert [s["path"] for s in result["not_linked"]] == ["m1.safetensors", "gone.safetensors"]
    assert "source size 10 != 11" in result["not_linked"][0]["reason"]
    assert list(b.iterdir()) == []


def test_a_source_without_metadata_is_linked_alone(tmp_path: Path) -> None:
    a = revision(tmp_path, "a", {"m1.safetensors": b"x" * 10})
    (a / ".cache/huggingface/download/m1.safetensors.metadata").unlink()
    b = tmp_path / "b"
    b.mkdir()
    assert mdl.run(str(b), [link(a, "m1.safetensors", 10)], check_mode=False)["linked"] == ["m1.safetensors"]
    assert not (b / ".cache").exists()


def test_cross_device_link_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a = revision(tmp_path, "a", {"m1.safetensors": b"x" * 10})
    b = tmp_path / "b"
    b.mkdir()

    def no_link(src: str, dst: str) -> None:
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", no_link)
    result = mdl.run(str(b), [link(a, "m1.safetensors", 10)], check_mode=False)
    assert result["linked"] == [] and "cannot hard-link" in result["not_linked"][0]["reason"]


@pytest.mark.parametrize("path", ["../escape", "/etc/passwd", "a/../../b", ""])
def test_paths_outside_the_revision_are_refused(tmp_path: Path, path: str) -> None:
    with pytest.raises(ValueError, match="not a relative path inside"):
        mdl.destination(str(tmp_path), path)
