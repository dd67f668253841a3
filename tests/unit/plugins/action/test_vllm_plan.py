"""action/vllm_plan: an adapter's path on the controller becomes its config and header shapes for the plan's
checks; an unreadable one is one refusal naming the adapter and the directory."""

from __future__ import annotations

from pathlib import Path

import pytest

import tiny_models
from ansible_collections.vllm_node.vllm_node.plugins.action.vllm_plan import with_adapter_files
from ansible_collections.vllm_node.vllm_node.plugins.module_utils.sizing import SizingError


def test_an_adapter_path_is_read_into_config_and_shapes(tmp_path: Path) -> None:
    repo = tiny_models.write_adapter(tmp_path, "good", "tiny-llama", rank=8)
    args = {"model": "tiny-llama", "lora_adapters": [{"name": "good", "path": str(repo)}, {"name": "unread"}]}
    read = with_adapter_files(args)
    good, unread = read["lora_adapters"]
    assert "path" not in good and good["config"]["r"] == 8 and good["name"] == "good"
    assert good["shapes"]["base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"] == [8, 64]
    assert unread == {"name": "unread"} and read["model"] == "tiny-llama"
    assert with_adapter_files({"lora_adapters": []}) == {"lora_adapters": []}


def test_an_unreadable_adapter_is_refused_naming_it(tmp_path: Path) -> None:
    with pytest.raises(SizingError, match=f"adapter bad: cannot read its files in {tmp_path}"):
        with_adapter_files({"lora_adapters": [{"name": "bad", "path": str(tmp_path)}]})
    (tmp_path / "adapter_config.json").write_text("{}")
    (tmp_path / "adapter_model.safetensors").write_bytes(b"\x01")
    with pytest.raises(SizingError, match="adapter bad"):
        with_adapter_files({"lora_adapters": [{"name": "bad", "path": str(tmp_path)}]})
