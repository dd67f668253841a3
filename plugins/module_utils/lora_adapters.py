"""LoRA adapters checked against their base model before anything is loaded (issue 30).

An adapter (PEFT's layout: adapter_config.json + adapter_model.safetensors) is usable by vLLM on a base when it is a
LoRA adapter, its rank fits the plan's --max-lora-rank slots, and every module it adapts is a linear layer of the
base with the same input and output width: lora_A is (rank, in_features) and lora_B (out_features, rank) of the
base's weight (out_features, in_features). Shapes are read from the safetensors headers (the first 8 bytes give the
JSON header's length), so nothing is loaded. The base's module names and shapes come from its checkpoint's headers
too: an adapter trained on another model fails here, naming both models, instead of failing inside vLLM.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# PEFT's tensor names: base_model.model.<module path>.lora_A.weight / .lora_B.weight
_LORA_TENSOR = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<side>[AB])(?:\.[^.]+)?\.weight$")
# vLLM's --max-lora-rank choices (the plan's sizing/lora.py RANKS).
MAX_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@dataclass(frozen=True)
class Adapter:
    """What an adapter's files say: its name, kind, rank, targets, the base it names and its LoRA tensor shapes."""

    name: str
    peft_type: str
    rank: int
    target_modules: tuple[str, ...] | str
    base_model: str
    shapes: dict[str, tuple[int, ...]]


def safetensors_shapes(header: bytes) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape from a safetensors file's start (8-byte little-endian length, then the JSON header)."""
    if len(header) < 8:
        raise ValueError("not a safetensors file: shorter than its 8-byte header length")
    (length,) = struct.unpack("<Q", header[:8])
    if len(header) < 8 + length:
        raise ValueError(f"safetensors header of {length} bytes, only {len(header) - 8} given")
    table = json.loads(header[8:8 + length])
    return {name: tuple(int(d) for d in spec["shape"]) for name, spec in table.items() if name != "__metadata__"}


def read_safetensors_shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """The shapes in one safetensors file, reading only its header."""
    with path.open("rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        return safetensors_shapes(struct.pack("<Q", length) + handle.read(length))


def read_adapter(name: str, directory: Path) -> Adapter:
    """An adapter from its downloaded directory (adapter_config.json + adapter_model.safetensors)."""
    config = json.loads((directory / "adapter_config.json").read_text())
    return adapter_from(name, config, read_safetensors_shapes(directory / "adapter_model.safetensors"))


def adapter_from(name: str, config: dict[str, Any], shapes: dict[str, tuple[int, ...]]) -> Adapter:
    """An Adapter from adapter_config.json's fields and the tensor shapes of its weights."""
    targets = config.get("target_modules") or ()
    return Adapter(name=name, peft_type=str(config.get("peft_type") or ""), rank=int(config.get("r") or 0),
                   target_modules=targets if isinstance(targets, str) else tuple(str(t) for t in targets),
                   base_model=str(config.get("base_model_name_or_path") or ""), shapes=dict(shapes))


def lora_modules(shapes: dict[str, tuple[int, ...]]) -> dict[str, dict[str, tuple[int, ...]]]:
    """Module path -> {"A": shape, "B": shape} of every adapted module in an adapter's tensors."""
    out: dict[str, dict[str, tuple[int, ...]]] = {}
    for tensor, shape in shapes.items():
        match = _LORA_TENSOR.match(tensor)
        if match:
            out.setdefault(match["module"], {})[match["side"]] = shape
    return out


def module_problem(module: str, pair: dict[str, tuple[int, ...]], rank: int,
                   base_shapes: dict[str, tuple[int, ...]]) -> str:
    """Why one adapted module does not fit the base ('' when it does)."""
    base = base_shapes.get(f"{module}.weight")
    short = module.rsplit(".", 1)[-1]
    if base is None:
        return f"adapts {module}, a module the base does not have"
    if set(pair) != {"A", "B"}:
        return f"has only lora_{''.join(pair)} for {module}"
    (a_rank, a_in), (b_out, b_rank) = pair["A"][:2], pair["B"][:2]
    if a_rank != rank or b_rank != rank:
        return f"{short}'s matrices have rank {a_rank}/{b_rank}, its config says r={rank}"
    if (b_out, a_in) != tuple(base[:2]):
        return (f"its {short} maps {a_in} inputs to {b_out} outputs where the base's {short} maps "
                f"{base[1]} to {base[0]}")
    return ""


def adapter_problems(adapter: Adapter, base_name: str, base_shapes: dict[str, tuple[int, ...]],
                     max_lora_rank: int) -> list[str]:
    """Every reason this adapter cannot be served on this base with these slots, each with its fix ([] = fine)."""
    problems = []
    if adapter.peft_type.upper() != "LORA":
        problems.append(f"adapter {adapter.name} is a {adapter.peft_type or 'unnamed'} adapter, not LoRA: vLLM "
                        "serves LoRA adapters only")
    if adapter.rank > max_lora_rank:
        problems.append(f"adapter {adapter.name} has rank {adapter.rank}, above the plan's max_lora_rank "
                        f"{max_lora_rank}: set vllm_node_max_lora_rank to {next_rank(adapter.rank)} (the plan sizes "
                        "the slots again) or use an adapter of a lower rank")
    modules = lora_modules(adapter.shapes)
    if not modules:
        problems.append(f"adapter {adapter.name} has no lora_A/lora_B tensors in adapter_model.safetensors")
    # one reason once: every layer's o_proj of another base says the same
    mismatches = list(dict.fromkeys(why for module, pair in sorted(modules.items())
                                    if (why := module_problem(module, pair, adapter.rank, base_shapes))))
    if mismatches:
        trained = f" (its config names {adapter.base_model} as its base)" if adapter.base_model else ""
        problems.append(f"adapter {adapter.name} was not trained for {base_name}{trained}: "
                        + "; ".join(mismatches[:3]) + (f"; and {len(mismatches) - 3} more" if len(mismatches) > 3
                                                         else "")
                        + f". Use an adapter trained on {base_name}, or serve it beside its own base")
    return problems


def next_rank(rank: int) -> int:
    """The smallest --max-lora-rank vLLM accepts that holds this rank."""
    fitting = [choice for choice in MAX_LORA_RANKS if choice >= rank]
    if not fitting:
        raise ValueError(f"rank {rank} is above every --max-lora-rank vLLM accepts ({MAX_LORA_RANKS[-1]})")
    return fitting[0]


def slots_for(adapters: list[Adapter], max_loras: int) -> tuple[int, str]:
    """The --max-loras the plan sizes: the inventory's, raised to the number of adapters served at start so all of
    them fit on the GPU at once; and a note when it was raised ('' otherwise)."""
    if len(adapters) <= max_loras:
        return max_loras, ""
    return len(adapters), (f"max_loras raised from {max_loras} to {len(adapters)}: {len(adapters)} adapters are "
                           "served and each gets a slot on every GPU (the plan's memory budget includes them)")


def adapter_metadata(directory: Path) -> dict[str, Any]:
    """What the plan reads of an adapter's files: {"config": adapter_config.json, "shapes": tensor -> shape list}
    (the weights' header only), as JSON data for the plan's inputs."""
    config = json.loads((directory / "adapter_config.json").read_text())
    if not isinstance(config, dict):
        raise ValueError(f"{directory / 'adapter_config.json'} is not a JSON object")
    shapes = read_safetensors_shapes(directory / "adapter_model.safetensors")
    return {"config": config, "shapes": {name: list(shape) for name, shape in shapes.items()}}


def _layer_count(config: dict[str, Any]) -> int:
    return int(config.get("num_hidden_layers") or config.get("num_layers") or 0)


def base_linear_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """The base's LoRA-able linear layers and their (out_features, in_features), from config.json alone, named as
    in the checkpoint (model.layers.N.self_attn.q_proj.weight ...).

    Derived for the decoder layout vLLM wraps with LoRA: the attention projections q/k/v/o (for MLA attention only
    o_proj, whose input is heads x v_head_dim) and, for dense models, the MLP's gate/up/down. MoE experts and MLA's
    low-rank projections are left out: an adapter of them is refused as adapting a module the base does not have.
    """
    hidden = int(config.get("hidden_size") or 0)
    heads = int(config.get("num_attention_heads") or 0)
    if not hidden or not heads:
        return {}
    head_dim = int(config.get("head_dim") or hidden // heads)
    kv_heads = int(config.get("num_key_value_heads") or heads)
    inter = int(config.get("intermediate_size") or 0)
    mla = bool(config.get("kv_lora_rank"))
    moe = any(config.get(key) for key in ("n_routed_experts", "num_experts", "num_local_experts"))
    shapes: dict[str, tuple[int, ...]] = {}
    for layer in range(_layer_count(config)):
        attn, mlp = f"model.layers.{layer}.self_attn.", f"model.layers.{layer}.mlp."
        if mla:
            shapes[attn + "o_proj.weight"] = (hidden, heads * int(config.get("v_head_dim") or head_dim))
        else:
            shapes.update({attn + "q_proj.weight": (heads * head_dim, hidden),
                           attn + "k_proj.weight": (kv_heads * head_dim, hidden),
                           attn + "v_proj.weight": (kv_heads * head_dim, hidden),
                           attn + "o_proj.weight": (hidden, heads * head_dim)})
        if inter and not moe:
            shapes.update({mlp + "gate_proj.weight": (inter, hidden), mlp + "up_proj.weight": (inter, hidden),
                           mlp + "down_proj.weight": (hidden, inter)})
    return shapes


# ---- the adapters the node downloaded (model_download's pipeline) ----------------------------------------------

_ENTRY_KEYS = ("name", "repository", "revision", "base", "path")


def downloaded_adapters(entries: list[dict[str, Any]], downloads: list[dict[str, Any]],
                        seals: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each inventory adapter with what model_download published for it, in the same order: its directory on the
    node, every file's sha256 and the hash over them (the seal's, on the run that first completed the revision;
    else the completion marker's). {} downloads (check mode before the first download) give no directory."""
    if not len(entries) == len(downloads) == len(seals):
        raise ValueError(f"{len(entries)} adapters but {len(downloads)} downloads and {len(seals)} seals: pass the "
                         "results of the role's loops over the same list")
    out = []
    for entry, download, seal in zip(entries, downloads, seals, strict=True):
        facts = {**(download or {}), **(seal or {})}
        files = facts.get("model_download_file_sha256") or {}
        out.append({"name": str(entry.get("name") or ""), "repository": str(entry.get("repository") or ""),
                    "revision": str(entry.get("revision") or ""), "base": str(entry.get("base") or ""),
                    "commit": facts.get("model_download_commit") or None,
                    "dir": facts.get("model_download_dir") or None,
                    "complete": bool(facts.get("model_download_complete")),
                    "files": dict(sorted(files.items())),
                    "files_sha256": facts.get("model_download_manifest_sha256") or None})
    return out


def plan_entry(entry: dict[str, Any], metadata: dict[str, Any] | None) -> dict[str, Any]:
    """The inventory entry as the plan takes it (its own keys only), with the downloaded files' config and tensor
    shapes when they were read (None: not downloaded yet, the plan then says it could not check them)."""
    out = {key: entry[key] for key in _ENTRY_KEYS if key in entry}
    return {**out, **metadata} if metadata else out
