"""The model_download_unserved module on a temporary models root: the models and adapters no unit serves go (what
the project wrote of them), the served ones, the foreign ones and the adapters still listed stay; check mode and a
second run delete nothing; a run that does not know what is served is refused."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ansible_collections.vllm_node.vllm_node.plugins.module_utils.model_download import files as mdf
from ansible_collections.vllm_node.vllm_node.plugins.modules import model_download_unserved as mdu
from harness.models import downloaded_model, tree

A, B = "a" * 40, "b" * 40
FILES = {"config.json": b"{}", "model.safetensors": b"w" * 4096}


def params(models: Path, **extra: Any) -> dict[str, Any]:
    return {"root": str(models), "lora_root": str(models / "lora"), "served_repos": ["org/served"],
            "served_dirs": [str(models / "org" / "served" / "revisions" / A)], "adapters": ["ad/kept"], "check": False,
            **extra}


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """Two models (one served), two adapters (one listed), a foreign directory, notes in a model no unit serves."""
    models = tmp_path / "models"
    downloaded_model(models, "org/served", FILES, [A])
    downloaded_model(models, "org/left", FILES, [A, B])
    downloaded_model(models, "solo/left", FILES, [B])
    (models / "solo" / "left" / "NOTES.md").write_text("mine")
    downloaded_model(models / "lora", "ad/kept", {"adapter_model.safetensors": b"a" * 64}, [A])
    downloaded_model(models / "lora", "ad/gone", {"adapter_model.safetensors": b"a" * 64}, [A])
    (models / "hand" / "made" / "revisions" / A).mkdir(parents=True)
    (models / "hand" / "made" / "revisions" / A / "weights.bin").write_bytes(b"x" * 10)
    return models


def test_deletes_what_no_unit_serves_once_and_reports_it(root: Path) -> None:
    served, foreign, kept = tree(root / "org" / "served"), tree(root / "hand"), tree(root / "lora" / "ad" / "kept")
    checked = mdu.run(params(root), check=True)
    assert checked["changed"] and [item["repo"] for item in checked["removed"]] == ["org/left", "solo/left", "ad/gone"]
    assert (root / "org" / "left").is_dir(), "check mode deletes nothing"
    result = mdu.run(params(root), check=False)
    assert {k: result[k] for k in ("changed", "bytes_freed", "left")} == {
        "changed": True, "bytes_freed": checked["bytes_freed"], "left": [str(root / "solo" / "left" / "NOTES.md")]}
    # org/left's two revisions share their files: each counted once, 4098 + 4098 (solo) + 64 (the adapter) of data
    assert result["bytes_freed"] > 4098 * 2 + 64
    assert "deleted org/left" in result["msg"] and "kept what the project did not write" in result["msg"]
    assert not (root / "org" / "left").exists() and not (root / "lora" / "ad" / "gone").exists()
    assert tree(root / "solo") == {"left/NOTES.md": 4}
    assert tree(root / "org" / "served") == served and tree(root / "hand") == foreign
    assert tree(root / "lora" / "ad" / "kept") == kept
    assert f"{root}/org/left/revisions/{A}\n" in result["diff"]["before"]
    again = mdu.run(params(root), check=False)
    assert again["changed"] is False and again["removed"] == [] and "nothing to delete" in again["msg"]


def test_a_served_repo_stays_in_any_revision_and_an_unlisted_root_is_left(root: Path) -> None:
    result = mdu.run(params(root, served_repos=["org/served", "ORG/left"], served_dirs=[], lora_root=""), check=False)
    assert [item["repo"] for item in result["removed"]] == ["solo/left"]
    assert (root / "org" / "left" / "revisions" / B / "model.safetensors").is_file()
    assert (root / "lora" / "ad" / "gone" / mdf.RECORD_NAME).is_file()


@pytest.mark.parametrize("extra", [{"served_repos": []}, {"served_repos": [""]}, {"root": "/"}, {"root": "models"}])
def test_refuses_a_run_that_does_not_know_what_is_served(root: Path, extra: dict[str, Any]) -> None:
    with pytest.raises(mdf.ModelDownloadError, match="model_download \\(unserved\\).*--tags prune alone"):
        mdu.run(params(root, **extra), check=False)
    assert (root / "org" / "left").is_dir()
