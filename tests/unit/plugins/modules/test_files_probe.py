"""The files_probe module: what ansible.builtin.stat and slurp report, for several paths in one call."""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from ansible_collections.vllm_node.vllm_node.plugins.modules import files_probe as fp


def test_reports_files_links_directories_and_missing_paths(tmp_path: Path) -> None:
    unit = tmp_path / "vllm.service"
    unit.write_text("[Unit]\n")
    unit.chmod(0o640)
    venv = tmp_path / "venvs" / "vllm-0.32.0"
    venv.mkdir(parents=True)
    (tmp_path / "current").symlink_to(venv)
    files = fp.probe({"unit": str(unit), "venv": str(tmp_path / "current"), "dir": str(venv),
                      "gone": str(tmp_path / "gone")}, ["sha1", "sha256"], ["unit"], 1024)
    assert files["unit"]["exists"] and files["unit"]["isreg"] and not files["unit"]["islnk"]
    assert files["unit"]["mode"] == "0640" and files["unit"]["size"] == 7
    assert files["unit"]["checksum"] == hashlib.sha1(b"[Unit]\n").hexdigest()
    assert files["unit"]["checksums"]["sha256"] == hashlib.sha256(b"[Unit]\n").hexdigest()
    assert files["unit"]["content"] == "[Unit]\n"
    assert files["venv"]["islnk"] and files["venv"]["lnk_source"] == str(venv.resolve())
    assert "checksum" not in files["venv"], "a link is not followed, as with ansible.builtin.stat"
    assert files["dir"]["isdir"] and not files["dir"]["executable"]
    assert files["gone"] == {"path": str(tmp_path / "gone"), "exists": False}


def test_a_content_only_for_the_names_asked_and_no_hash_when_switched_off(tmp_path: Path) -> None:
    record = tmp_path / "record.json"
    record.write_text('{"a": 1}')
    tool = tmp_path / "hf"
    tool.write_text("#!/bin/sh\n")
    os.chmod(tool, 0o755)
    files = fp.probe({"record": str(record), "tool": str(tool)}, [], [], 1024)
    assert "content" not in files["record"] and "checksum" not in files["record"]
    assert files["tool"]["executable"]


def test_bad_input_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not keys of paths"):
        fp.probe({"a": str(tmp_path)}, [], ["b"], 1024)
    with pytest.raises(ValueError, match="must be absolute.*'rel'"):
        fp.probe({"rel": "etc/x"}, [], [], 1024)
    big = tmp_path / "big"
    big.write_bytes(b"x" * 2048)
    with pytest.raises(ValueError, match="more than read_max_bytes=1024"):
        fp.probe({"big": str(big)}, [], ["big"], 1024)
