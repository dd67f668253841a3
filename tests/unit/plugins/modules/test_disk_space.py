"""The disk_space module (plugins/modules/disk_space.py): nearest existing parent, its mount point, statvfs."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from ansible_collections.vllm_node.vllm_node.plugins.modules import disk_space

MODULE = Path(disk_space.__file__)


def test_nearest_existing_parent() -> None:
    existing = {"/", "/srv", "/srv/vllm"}
    assert disk_space.nearest_existing("/srv/vllm/models/org", existing.__contains__) == "/srv/vllm"
    assert disk_space.nearest_existing("/srv/vllm/", existing.__contains__) == "/srv/vllm"
    assert disk_space.nearest_existing("/nothing/here", existing.__contains__) == "/"


def test_mount_point_walks_up_to_the_mount() -> None:
    mounts = {"/", "/data"}
    assert disk_space.mount_point("/data/models/x", mounts.__contains__) == "/data"
    assert disk_space.mount_point("/srv", mounts.__contains__) == "/"


def run_module(args: dict) -> dict:
    """Run the module file as Ansible would (JSON args on stdin) and return its JSON answer."""
    proc = subprocess.run([sys.executable, str(MODULE)], input=json.dumps({"ANSIBLE_MODULE_ARGS": args}),
                          capture_output=True, text=True, check=False, timeout=60)
    return json.loads(proc.stdout)


def test_measures_like_df_through_a_symlink(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    result = run_module({"path": str(tmp_path / "link" / "models" / "org")})
    assert result["changed"] is False
    assert result["path"] == str(tmp_path / "link")
    usage = shutil.disk_usage(tmp_path / "real")
    assert abs(result["free_bytes"] - usage.free) <= max(64 * 2**20, usage.free // 100)
    assert result["total_bytes"] == usage.total
    assert os.path.ismount(result["mount"]) and str(tmp_path.resolve()).startswith(result["mount"])


def test_relative_path_is_refused() -> None:
    result = run_module({"path": "models"})
    assert result.get("failed") and "path must be absolute" in result["msg"]
