"""LoRA adapters (--enable-lora, --max-loras, --max-lora-rank): the adapter slots vLLM keeps on every GPU.

vLLM preallocates, for each of max_loras slots, the A and B matrices of every LoRA-wrapped linear layer at
max_lora_rank, in the model dtype (lora/layers: column-parallel layers keep A whole and shard B over TP,
row-parallel layers shard A and keep B whole). Estimated for the dense attention and MLP projections
(qkv, o, gate_up, down) of each pipeline stage's layers; MoE expert adapters and the embeddings are not counted.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..lora_adapters import adapter_from, adapter_problems, base_linear_shapes
from .errors import SizingError
from .model import ModelShape, kv_bytes, text_config
from .units import to_int

# vLLM's LoRAConfig.max_lora_rank choices.
RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@dataclass(frozen=True)
class LoRA:
    """The plan's LoRA settings."""

    max_loras: int
    max_lora_rank: int

    def args(self) -> list[str]:
        """The vLLM flags that run them."""
        return ["--enable-lora", "--max-loras", str(self.max_loras), "--max-lora-rank", str(self.max_lora_rank)]


def resolve(enable_lora: Any, max_loras: Any, max_lora_rank: Any) -> LoRA | None:
    """Validated LoRA settings (None when LoRA is off); vLLM's defaults are 1 slot of rank 16."""
    if not enable_lora:
        return None
    loras = to_int("max_loras", 1 if max_loras in (None, "") else max_loras)
    rank = to_int("max_lora_rank", 16 if max_lora_rank in (None, "") else max_lora_rank)
    if loras < 1:
        raise SizingError("max_loras must be >= 1")
    if rank not in RANKS:
        raise SizingError(f"max_lora_rank {rank} is not one vLLM accepts; choose one of {', '.join(map(str, RANKS))}")
    return LoRA(loras, rank)


def slot_bytes_per_gpu(config: dict[str, Any], shape: ModelShape, lora: LoRA, tp: int, layers: int) -> int:
    """Bytes of all adapter slots on one GPU for `layers` decoder layers at tensor parallel size tp."""
    tc = text_config(config)
    hidden = shape.hidden_size or int(tc.get("hidden_size") or 0)
    if not hidden:
        raise SizingError("LoRA sizing needs hidden_size in config.json")
    inter = int(tc.get("intermediate_size") or 4 * hidden)
    heads = shape.num_heads * (shape.head_dim if not shape.mla else int(tc.get("v_head_dim") or shape.head_dim))
    kv = 0 if shape.mla else shape.num_kv_heads * shape.head_dim
    r = lora.max_lora_rank
    per_layer = (3 * r * hidden + (heads + 2 * kv) * r // tp     # qkv: A whole (3 slices), B sharded
                 + r * heads // tp + hidden * r                # o: A sharded, B whole
                 + 2 * r * hidden + 2 * inter * r // tp        # gate_up: A whole (2 slices), B sharded
                 + r * inter // tp + hidden * r)               # down: A sharded, B whole
    return lora.max_loras * layers * per_layer * kv_bytes(shape.dtype)


# --lora-modules name=path, split on whitespace by systemd: a name of these characters only, a Hub repository id and
# a full commit (pinned: a branch or tag can move under the adapter).
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_REPOSITORY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_ENTRY_KEYS = ("name", "repository", "revision", "base", "path", "config", "shapes")


@dataclass(frozen=True)
class AdapterPlan:
    """The adapters the plan serves: the slots that hold them, their entries for plan.lora.adapters, notes."""

    settings: LoRA
    adapters: tuple[dict[str, Any], ...]
    notes: tuple[str, ...]


def _entry(index: int, entry: Any) -> dict[str, str]:
    """One inventory entry's name, repository, revision and base, checked (a SizingError names the entry)."""
    where = f"vllm_node_lora_adapters[{index}]"
    if not isinstance(entry, Mapping):
        raise SizingError(f"{where} is {entry!r}: give a mapping with name, repository, revision and base")
    unknown = sorted(set(map(str, entry)) - set(_ENTRY_KEYS))
    if unknown:
        raise SizingError(f"{where} has unknown keys {', '.join(unknown)}: use name, repository, revision, base "
                          "and path")
    values = {key: str(entry.get(key) or "").strip() for key in ("name", "repository", "revision", "base")}
    missing = [key for key, value in values.items() if not value]
    if missing:
        raise SizingError(f"{where} has no {', '.join(missing)}: every adapter needs name, repository, a pinned "
                          "revision and the base model it belongs to")
    if not _NAME.match(values["name"]):
        raise SizingError(f"{where}.name {values['name']!r} is not an adapter name vLLM can take on its command "
                          "line: use letters, digits, '.', '_' and '-' (up to 128)")
    if not _REPOSITORY.match(values["repository"]):
        raise SizingError(f"adapter {values['name']}: repository {values['repository']!r} is not a Hub repository "
                          "id: write it as owner/name")
    if not _COMMIT.match(values["revision"]):
        raise SizingError(f"adapter {values['name']}: revision {values['revision']!r} is not pinned: set it to the "
                          "40-hex commit of the adapter's repository (a branch or tag can move)")
    return values


def _checked(entry: Mapping[str, Any], name: str, base: str, config: dict[str, Any], rank: int) -> list[str]:
    """Why the adapter's files do not fit the base and the slots ([] = they do)."""
    shapes = entry.get("shapes") or {}
    if not isinstance(entry.get("config"), Mapping) or not isinstance(shapes, Mapping):
        raise SizingError(f"adapter {name}: config and shapes must be its adapter_config.json and its tensor shapes "
                          "(the vllm_plan action reads them from path)")
    adapter = adapter_from(name, dict(entry["config"]), {str(k): tuple(int(d) for d in v) for k, v in shapes.items()})
    return adapter_problems(adapter, base, base_linear_shapes(text_config(config)), rank)


def plan_adapters(entries: Any, settings: LoRA | None, *, base: str, base_names: tuple[str, ...],
                  config: dict[str, Any], served_model_name: str, adapter_root: str) -> AdapterPlan | None:
    """The inventory's adapters checked against the base and the slots before anything changes (None: none).

    Each entry names its base (the model's catalog key, repository or served name); its files, when the vllm_plan
    action read them from `path` (config, shapes), must be a LoRA adapter of this base's module shapes with a rank
    the slots hold. More adapters than --max-loras raise the slots to their count (the plan sizes the raised
    value, so the fit is checked again). Every refusal names the adapter, the base and the fix.
    """
    if entries in (None, "", []):
        return None
    if not isinstance(entries, (list, tuple)):
        raise SizingError(f"vllm_node_lora_adapters must be a list of adapters; got {entries!r}")
    checked = [_entry(i, entry) for i, entry in enumerate(entries)]
    if settings is None:
        raise SizingError(f"{len(checked)} LoRA adapter(s) are listed ({checked[0]['name']} ...) for {base} but "
                          "vllm_node_enable_lora is false: set vllm_node_enable_lora to true (the plan sizes the "
                          "adapter slots) or empty vllm_node_lora_adapters")
    names = [entry["name"] for entry in checked]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise SizingError(f"adapter name {twice[0]} is listed twice in vllm_node_lora_adapters: give each adapter a "
                          "name of its own (clients ask for it as the model)")
    if served_model_name in names:
        raise SizingError(f"adapter {served_model_name} has the name the base {base} is served under: rename the "
                          "adapter")
    out, notes, problems = [], [], []
    for raw, entry in zip(entries, checked, strict=True):
        if entry["base"] not in base_names:
            problems.append(f"adapter {entry['name']} belongs to base {entry['base']}, but this node serves {base}: "
                            f"set its base to {base} if it was trained on it, or list it on a node serving "
                            f"{entry['base']}")
            continue
        has_files = "config" in raw
        if has_files:
            problems.extend(_checked(raw, entry["name"], base, config, settings.max_lora_rank))
        else:
            notes.append(f"adapter {entry['name']}: its files were not read (no path), so its rank and modules are "
                         f"checked by vLLM when it loads, not by the plan")
        # model_download's layout: one directory per commit under the repository's revisions/
        out.append(dict(entry, path=f"{adapter_root}/{entry['repository']}/revisions/{entry['revision']}",
                        checked=has_files))
    if problems:
        raise SizingError("; ".join(problems))
    slots = settings.max_loras
    if len(out) > slots:
        notes.append(f"max_loras raised from {slots} to {len(out)}: {len(out)} adapters are served and each gets a "
                     "slot on every GPU (the plan's memory budget includes them)")
        slots = len(out)
    return AdapterPlan(LoRA(slots, settings.max_lora_rank), tuple(out), tuple(notes))
