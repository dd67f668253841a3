"""dirs_to_fix and paths_present: a file task loops only over the paths files_probe found not as it would leave them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ansible_collections.vllm_node.vllm_node.plugins.filter.files_state import dirs_to_fix, paths_present
from ansible_collections.vllm_node.vllm_node.plugins.modules.files_probe import probe


def found_at(*paths: Path) -> dict:
    """What the real files_probe module reports for these paths, keyed by path (as the roles call it)."""
    return probe({str(p): str(p) for p in paths}, [], [], 1024)


def test_a_directory_as_wanted_is_left_out_and_one_with_another_mode_is_kept(tmp_path: Path) -> None:
    good, loose, missing = tmp_path / "good", tmp_path / "loose", tmp_path / "missing"
    good.mkdir(mode=0o750)
    good.chmod(0o750)
    loose.mkdir()
    loose.chmod(0o755)
    found = found_at(good, loose, missing)
    uid, gid = os.getuid(), os.getgid()
    assert dirs_to_fix([str(good), str(loose), str(missing)], found, "0750", uid, gid) == [str(loose), str(missing)]
    # the mode as Ansible's file task takes it: with or without the leading 0
    assert dirs_to_fix([str(good)], found, "750", uid, gid) == []


def test_another_owner_or_group_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "d"
    path.mkdir()
    path.chmod(0o700)
    found = found_at(path)
    assert dirs_to_fix([str(path)], found, "0700", os.getuid(), os.getgid()) == []
    assert dirs_to_fix([str(path)], found, "0700", os.getuid() + 1, os.getgid()) == [str(path)]
    assert dirs_to_fix([str(path)], found, "0700", os.getuid(), str(os.getgid() + 1)) == [str(path)]
    # omitted: not compared
    assert dirs_to_fix([str(path)], found) == []


def test_a_file_a_link_to_a_directory_or_a_path_not_probed_is_left_to_the_file_task(tmp_path: Path) -> None:
    target, link, plain = tmp_path / "target", tmp_path / "link", tmp_path / "plain"
    target.mkdir()
    link.symlink_to(target)
    plain.write_text("x")
    found = found_at(link, plain)
    assert dirs_to_fix([str(link), str(plain), str(tmp_path / "unprobed")], found) == [
        str(link), str(plain), str(tmp_path / "unprobed")]


def test_a_mode_that_is_not_octal_is_refused(tmp_path: Path) -> None:
    found = found_at(tmp_path)
    with pytest.raises(ValueError, match="octal"):
        dirs_to_fix([str(tmp_path)], found, "u=rwx")


def test_paths_present_keeps_what_exists_a_dangling_link_and_what_was_not_probed(tmp_path: Path) -> None:
    there, gone, dangling = tmp_path / "there", tmp_path / "gone", tmp_path / "dangling"
    there.write_text("x")
    dangling.symlink_to(tmp_path / "nowhere")
    found = found_at(there, gone, dangling)
    paths = [str(there), str(gone), str(dangling), str(tmp_path / "unprobed")]
    assert paths_present(paths, found) == [str(there), str(dangling), str(tmp_path / "unprobed")]
    assert paths_present([str(gone)], found) == []
