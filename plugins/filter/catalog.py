"""Shape checks of the catalog entries a user adds (vllm_node_extra_models, vllm_node_extra_gpus).

The roles read a handful of fields of each entry; a missing or mistyped one would surface much later as an
obscure template or sizing error. These functions return one plain sentence per problem (empty = fine), each
naming the entry, the field and how to fix it; the vllm_node role fails with them before anything else runs.
They check the MERGED entry: a user entry whose key is already in the product catalog is merged into it
(recursively), so `{kimi-k2.5-nvfp4: {revision: <sha>}}` alone is a valid amendment.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_REPO = re.compile(r"[\w.-]+/[\w.-]+")
_COMPUTE_CAPABILITY = re.compile(r"\d+\.\d+")
_PCI_ID = re.compile(r"[0-9a-fA-F]{4}:[0-9a-fA-F]{4}")
# config.json fields every attention layout needs (multimodal checkpoints nest them under text_config).
_CONFIG_FIELDS = ("num_hidden_layers", "num_attention_heads", "max_position_embeddings")
_MODEL_EXAMPLE = ("e.g. {repo: org/name, checkpoint_bytes: <index metadata.total_size>, config: <config.json "
                  "fields>}; see roles/vllm_node/README.md")
_GPU_EXAMPLE = ("e.g. {kind: cuda, name: <nvidia-smi name>, memory_mib: <memory.total>, compute_capability: "
                "'12.0', pci_ids: ['10de:xxxx']}; see roles/vllm_node/README.md")


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _shown(entry: Mapping[str, Any], field: str) -> str:
    """'missing', or the wrong value as Python shows it."""
    return "missing" if field not in entry else repr(entry[field])


def model_entry_errors(key: str, entry: Any) -> list[str]:
    """Problems of one model catalog entry, as sentences naming the field and the fix."""
    where = f"vllm_node_extra_models['{key}']"
    if not isinstance(entry, Mapping):
        return [f"{where} must be a mapping of fields, got {type(entry).__name__} ({_MODEL_EXAMPLE})."]
    errors: list[str] = []
    repo = entry.get("repo")
    if not isinstance(repo, str) or not _REPO.fullmatch(repo):
        errors.append(f"{where}.repo is {'missing' if repo is None else repr(repo)}: "
                      "set the Hugging Face repo id, e.g. repo: nvidia/Kimi-K2.5-NVFP4.")
    revision = entry.get("revision", "main")
    if not isinstance(revision, str) or not revision:
        errors.append(f"{where}.revision must be a branch, tag or 40-hex commit; got {revision!r}.")
    if not _positive_int(entry.get("checkpoint_bytes")):
        errors.append(f"{where}.checkpoint_bytes is {_shown(entry, 'checkpoint_bytes')}: "
                      "set the checkpoint size in bytes (model.safetensors.index.json metadata.total_size).")
    config = entry.get("config")
    if not isinstance(config, Mapping) or not config:
        errors.append(f"{where}.config is {'missing' if config is None else 'not a non-empty mapping'}: copy the "
                      "model's config.json fields (at least " + ", ".join(_CONFIG_FIELDS) + ").")
    else:
        nested = config.get("text_config")
        text: Mapping[str, Any] = nested if isinstance(nested, Mapping) else config
        missing = [name for name in _CONFIG_FIELDS if not _positive_int(text.get(name))]
        if missing:
            errors.append(f"{where}.config lacks positive integers for {', '.join(missing)}: copy them from the "
                          "model's config.json (under text_config for multimodal checkpoints).")
    quant = entry.get("quant")
    if quant is not None and not isinstance(quant, Mapping):
        errors.append(f"{where}.quant must be null or hf_quant_config.json's quantization mapping; got {quant!r}.")
    spec = entry.get("speculative_config")
    if spec is not None and not (isinstance(spec, Mapping) and spec.get("method")
                                 and _positive_int(spec.get("num_speculative_tokens"))):
        errors.append(f"{where}.speculative_config must be a mapping shaped like vLLM's --speculative-config JSON "
                      f"with method and a positive num_speculative_tokens, e.g. {{method: eagle3, model: org/draft, "
                      f"num_speculative_tokens: 3}}; got {spec!r}.")
    serving = entry.get("serving", {})
    if not isinstance(serving, Mapping):
        errors.append(f"{where}.serving must be a mapping (trust_remote_code, reasoning_parser, tool_call_parser, "
                      f"extra_args); got {serving!r}.")
    else:
        if not isinstance(serving.get("trust_remote_code", False), bool):
            errors.append(f"{where}.serving.trust_remote_code must be true or false.")
        extra = serving.get("extra_args", [])
        if not isinstance(extra, list) or not all(isinstance(arg, str) for arg in extra):
            errors.append(f"{where}.serving.extra_args must be a list of strings (vLLM CLI flags); got {extra!r}.")
    return errors


def gpu_entry_errors(key: str, entry: Any) -> list[str]:
    """Problems of one GPU catalog entry, as sentences naming the field and the fix."""
    where = f"vllm_node_extra_gpus['{key}']"
    if not isinstance(entry, Mapping):
        return [f"{where} must be a mapping of fields, got {type(entry).__name__} ({_GPU_EXAMPLE})."]
    kind = entry.get("kind", "cuda")
    if kind not in ("cuda", "cpu"):
        return [f"{where}.kind must be cuda or cpu; got {kind!r}."]
    errors: list[str] = []
    if kind == "cpu":
        if not _positive_int(entry.get("kv_cache_space_gib")):
            errors.append(f"{where}.kv_cache_space_gib must be a positive integer (VLLM_CPU_KVCACHE_SPACE, GiB).")
        return errors
    if not isinstance(entry.get("name"), str) or not entry.get("name"):
        errors.append(f"{where}.name is missing: set the name nvidia-smi prints (--query-gpu=name).")
    if not _positive_int(entry.get("memory_mib")):
        errors.append(f"{where}.memory_mib is {_shown(entry, 'memory_mib')}: "
                      "set memory.total in MiB as nvidia-smi --query-gpu=memory.total reports it.")
    cc = entry.get("compute_capability")
    if not isinstance(cc, str) or not _COMPUTE_CAPABILITY.fullmatch(cc):
        errors.append(f"{where}.compute_capability is {'missing' if cc is None else repr(cc)}: set it as a quoted "
                      "string, e.g. compute_capability: \"12.0\" (nvidia-smi --query-gpu=compute_cap).")
    for field in ("pci_ids", "names"):
        values = entry.get(field, [])
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            errors.append(f"{where}.{field} must be a list of strings; got {values!r}.")
        elif field == "pci_ids" and not all(_PCI_ID.fullmatch(v) for v in values):
            errors.append(f"{where}.pci_ids must be 'vendor:device' as lspci -nn prints them, e.g. '10de:2bb5'.")
    return errors


def catalog_errors(extra: Any, merged: Any, kind: str) -> list[str]:
    """Problems of every user entry in `extra` ('models' or 'gpus'), checked in its merged form."""
    name = f"vllm_node_extra_{kind}"
    if not isinstance(extra, Mapping):
        return [f"{name} must be a mapping of catalog key -> entry; got {type(extra).__name__}."]
    check = model_entry_errors if kind == "models" else gpu_entry_errors
    errors: list[str] = []
    for key in sorted(extra):
        errors.extend(check(str(key), merged.get(key) if isinstance(merged, Mapping) else extra[key]))
    return errors


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict[str, Any]:
        return {"vllm_node_catalog_errors": catalog_errors}
