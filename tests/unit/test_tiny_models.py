"""The generated tiny models must be valid checkpoints that vLLM's loaders and CPU kernels accept.

The checks read the written files (safetensors headers parsed by hand, config.json, tokenizer files), so they test
the output, not the generator's own tables.
"""
from __future__ import annotations

import json
import math
import stat
import subprocess
import sys
from pathlib import Path

import jinja2.sandbox
import pytest
from tokenizers import Tokenizer

import tiny_models

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"

ORG = "vllm-node-test"
REPOS = ["tiny-llama", "tiny-llama-private", "tiny-deepseek-v3", "tiny-deepseek-v3-fp8kv"]
CPU_HEAD_DIMS = {32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512}  # test-environment.md
DTYPE_BYTES = {"BF16": 2, "F16": 2, "F32": 4}


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Generated through the CLI, as the Makefile and molecule scenarios do."""
    root = tmp_path_factory.mktemp("models")
    result = subprocess.run([sys.executable, str(FIXTURES / "tiny_models.py"), "--out", str(root)],
                            capture_output=True, text=True, check=True)
    assert len(result.stdout.splitlines()) == len(REPOS)
    return root / ORG


def header(path: Path) -> dict[str, dict]:
    """The JSON header of a safetensors file, read without the safetensors library."""
    with path.open("rb") as handle:
        size = int.from_bytes(handle.read(8), "little")
        meta = json.loads(handle.read(size))
        data_end = max(v["data_offsets"][1] for k, v in meta.items() if k != "__metadata__")
        assert path.stat().st_size == 8 + size + data_end
    return meta


def load_json(path: Path) -> dict:
    return json.loads(path.read_text())


def tensors(repo: Path) -> dict[str, tuple[str, list[int]]]:
    """name -> (dtype, shape) over all shards, asserting the index matches the headers exactly."""
    index = load_json(repo / "model.safetensors.index.json")
    found: dict[str, tuple[str, list[int]]] = {}
    total = 0
    shards = sorted(repo.glob("*.safetensors"))
    assert len(shards) == 3 and {s.name for s in shards} == set(index["weight_map"].values())
    for shard in shards:
        meta = header(shard)
        assert meta["__metadata__"] == {"format": "pt"}
        for name, info in meta.items():
            if name == "__metadata__":
                continue
            assert index["weight_map"][name] == shard.name, name
            start, end = info["data_offsets"]
            assert end - start == math.prod(info["shape"]) * DTYPE_BYTES[info["dtype"]], name
            total += end - start
            found[name] = (info["dtype"], info["shape"])
    assert set(found) == set(index["weight_map"]), "index lists tensors no shard holds"
    assert index["metadata"]["total_size"] == total
    return found


@pytest.mark.parametrize("name", REPOS)
def test_files_are_world_readable_and_complete(out: Path, name: str) -> None:
    repo = out / name
    expected = {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                "special_tokens_map.json", "model.safetensors.index.json", "README.md", ".gitattributes",
                "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                "model-00003-of-00003.safetensors"}
    if name.endswith("fp8kv"):
        expected.add("hf_quant_config.json")
    assert {p.name for p in repo.iterdir()} == expected
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o644 for p in repo.iterdir())
    assert stat.S_IMODE(repo.stat().st_mode) == 0o755


def test_llama_tensors_match_transformers_layout(out: Path) -> None:
    repo = out / "tiny-llama"
    cfg = load_json(repo / "config.json")
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["head_dim"] in CPU_HEAD_DIMS
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"],
            cfg["head_dim"], cfg["vocab_size"]) == (2, 64, 4, 2, 32, 2048)
    found = tensors(repo)
    h, hd, v = cfg["hidden_size"], cfg["head_dim"], cfg["vocab_size"]
    assert found["model.embed_tokens.weight"] == ("BF16", [v, h])
    assert found["lm_head.weight"] == ("BF16", [v, h])
    assert found["model.layers.1.self_attn.q_proj.weight"][1] == [cfg["num_attention_heads"] * hd, h]
    assert found["model.layers.1.self_attn.k_proj.weight"][1] == [cfg["num_key_value_heads"] * hd, h]
    assert found["model.layers.0.self_attn.o_proj.weight"][1] == [h, cfg["num_attention_heads"] * hd]
    assert found["model.layers.0.mlp.down_proj.weight"][1] == [h, cfg["intermediate_size"]]
    per_layer = {"input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj",
                 "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}
    expected = {f"model.layers.{i}.{p}.weight" for i in range(2) for p in per_layer}
    expected |= {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}
    assert set(found) == expected
    assert all(dtype == "BF16" for dtype, _ in found.values())


def test_deepseek_tensors_match_transformers_layout(out: Path) -> None:
    repo = out / "tiny-deepseek-v3"
    cfg = load_json(repo / "config.json")
    assert cfg["architectures"] == ["DeepseekV3ForCausalLM"] and cfg["model_type"] == "deepseek_v3"
    # The CPU MLA kernel needs a 512 + 64 latent.
    assert (cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]) == (512, 64)
    assert cfg["topk_method"] == "noaux_tc" and cfg["n_routed_experts"] == 4 and cfg["first_k_dense_replace"] == 1
    assert cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"] in CPU_HEAD_DIMS
    found = tensors(repo)
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    attn = "model.layers.{}.self_attn."
    for i in range(cfg["num_hidden_layers"]):
        a = attn.format(i)
        assert found[a + "q_a_proj.weight"][1] == [cfg["q_lora_rank"], h]
        assert found[a + "q_a_layernorm.weight"][1] == [cfg["q_lora_rank"]]
        assert found[a + "q_b_proj.weight"][1] == [heads * (cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]),
                                                   cfg["q_lora_rank"]]
        assert found[a + "kv_a_proj_with_mqa.weight"][1] == [cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"], h]
        assert found[a + "kv_a_layernorm.weight"][1] == [cfg["kv_lora_rank"]]
        assert found[a + "kv_b_proj.weight"][1] == [heads * (cfg["qk_nope_head_dim"] + cfg["v_head_dim"]),
                                                    cfg["kv_lora_rank"]]
        assert found[a + "o_proj.weight"][1] == [h, heads * cfg["v_head_dim"]]
    assert "model.layers.0.mlp.gate_proj.weight" in found and "model.layers.0.mlp.gate.weight" not in found
    moe = "model.layers.1.mlp."
    assert found[moe + "gate.weight"] == ("BF16", [cfg["n_routed_experts"], h])
    assert found[moe + "gate.e_score_correction_bias"] == ("F32", [cfg["n_routed_experts"]])
    experts = {k for k in found if k.startswith(moe + "experts.")}
    assert len(experts) == 3 * cfg["n_routed_experts"]
    assert found[moe + "experts.3.down_proj.weight"][1] == [h, cfg["moe_intermediate_size"]]
    shared = cfg["moe_intermediate_size"] * cfg["n_shared_experts"]
    assert found[moe + "shared_experts.up_proj.weight"][1] == [shared, h]
    assert not any(".mlp.gate_proj" in k for k in found if k.startswith(moe))


def test_fp8kv_variant_declares_fp8_kv_over_the_same_weights(out: Path) -> None:
    plain, fp8 = out / "tiny-deepseek-v3", out / "tiny-deepseek-v3-fp8kv"
    quant = load_json(fp8 / "hf_quant_config.json")
    assert quant["producer"]["name"] == "modelopt"
    assert quant["quantization"]["kv_cache_quant_algo"] == "FP8"
    cfg = load_json(fp8 / "config.json")
    qc = cfg.pop("quantization_config")
    assert qc["quant_method"] == "modelopt"
    assert qc["kv_cache_scheme"] == {"dynamic": False, "num_bits": 8, "type": "float"}
    assert cfg == load_json(plain / "config.json")
    for shard in plain.glob("*.safetensors"):
        assert (fp8 / shard.name).read_bytes() == shard.read_bytes()


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-deepseek-v3"])
def test_tokenizer_round_trips_and_chat_template_renders(out: Path, name: str) -> None:
    repo = out / name
    tok = Tokenizer.from_file(str(repo / "tokenizer.json"))
    cfg = load_json(repo / "config.json")
    assert tok.get_vocab_size() == cfg["vocab_size"] == 2048
    for text in ["Hello world, the GPU node is serving.", "héllo wörld 🚀 \t\n  spaces", "12.0 + 97887 MiB?"]:
        assert tok.decode(tok.encode(text).ids) == text
    tcfg = load_json(repo / "tokenizer_config.json")
    for token_id, info in tcfg["added_tokens_decoder"].items():
        assert tok.encode(info["content"]).ids == [int(token_id)]
    gen = load_json(repo / "generation_config.json")
    assert tok.id_to_token(gen["eos_token_id"][0]) == tcfg["eos_token"]
    assert tok.id_to_token(cfg["bos_token_id"]) == tcfg["bos_token"]
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " Hi there \n"}]
    prompt = env.from_string(tcfg["chat_template"]).render(messages=messages, add_generation_prompt=True,
                                                          bos_token=tcfg["bos_token"], eos_token=tcfg["eos_token"])
    assert prompt == ("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                      "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
                      "<|start_header_id|>assistant<|end_header_id|>\n\n")
    ids = tok.encode(prompt).ids
    assert ids.count(cfg["bos_token_id"]) == 1 and ids[0] == cfg["bos_token_id"]


def test_generation_is_deterministic(out: Path, tmp_path: Path) -> None:
    tiny_models.generate(tmp_path)
    for name in REPOS:
        first = {p.name: p.read_bytes() for p in (out / name).iterdir()}
        second = {p.name: p.read_bytes() for p in (tmp_path / ORG / name).iterdir()}
        assert first == second, name


def test_another_seed_gives_other_weights(out: Path, tmp_path: Path) -> None:
    tiny_models.generate(tmp_path, seed=7)
    shard = "model-00002-of-00003.safetensors"
    assert (tmp_path / ORG / "tiny-llama" / shard).read_bytes() != (out / "tiny-llama" / shard).read_bytes()


def test_bf16_conversion_rounds_to_nearest_even() -> None:
    import numpy as np
    values = np.array([1.0, -2.5, 1.00390625, 1.01171875, 3.0e38], dtype=np.float32)
    bits = tiny_models.to_bf16_bits(values)
    assert bits.tolist() == [0x3F80, 0xC020, 0x3F80, 0x3F82, 0x7F62]


def test_revision_replaces_only_the_named_shards(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, str(FIXTURES / "tiny_models.py"), "--out", str(tmp_path),
                             "--revision", "tiny-llama@rev-b=7:1,3"], capture_output=True, text=True, check=True)
    assert "revision rev-b" in result.stdout
    main, rev = tmp_path / ORG / "tiny-llama", tmp_path / ORG / "tiny-llama@rev-b"
    changed = sorted(p.name for p in main.iterdir() if p.read_bytes() != (rev / p.name).read_bytes())
    assert changed == ["model-00001-of-00003.safetensors", "model-00003-of-00003.safetensors"]
    assert sorted(p.name for p in rev.iterdir()) == sorted(p.name for p in main.iterdir())
    assert tensors(rev) == tensors(main), "same names, shapes and index: the index still describes the shards"
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o644 for p in rev.iterdir())
    seven = tiny_models.repo_specs(7)["tiny-llama"][1]
    layout = tiny_models.split_shards(seven, 3)
    shard1 = header(rev / "model-00001-of-00003.safetensors")
    name = layout[0][0]
    begin, end = shard1[name]["data_offsets"]
    with (rev / "model-00001-of-00003.safetensors").open("rb") as handle:
        handle.seek(8 + int.from_bytes(handle.read(8), "little") + begin)
        assert handle.read(end - begin) == seven[name]["array"].tobytes(), "the revision holds seed 7's weights"


def test_revision_with_all_shards_and_bad_specs(out: Path, tmp_path: Path) -> None:
    tiny_models.generate(tmp_path)
    rev = tiny_models.write_revision(tmp_path, "tiny-deepseek-v3", "b", 11)
    main = tmp_path / ORG / "tiny-deepseek-v3"
    assert all((rev / f"model-0000{n}-of-00003.safetensors").read_bytes()
               != (main / f"model-0000{n}-of-00003.safetensors").read_bytes() for n in (1, 2, 3))
    assert (rev / "config.json").read_bytes() == (main / "config.json").read_bytes()
    assert tiny_models.parse_revision("tiny-llama@rev-b=7") == ("tiny-llama", "rev-b", 7, None)
    assert tiny_models.parse_revision("tiny-llama@v2=3:2") == ("tiny-llama", "v2", 3, [2])
    for spec in ("tiny-llama=7", "tiny-llama@b", "tiny-llama@b=x", "a/b@c=1"):
        with pytest.raises(ValueError, match="expected NAME@TAG=SEED"):
            tiny_models.parse_revision(spec)
    with pytest.raises(ValueError, match="shard numbers"):
        tiny_models.write_revision(tmp_path, "tiny-llama", "b", 7, [4])
    with pytest.raises(ValueError, match="no tiny repo"):
        tiny_models.write_revision(tmp_path, "nope", "b", 7)
    with pytest.raises(ValueError, match="not 'main'"):
        tiny_models.write_revision(tmp_path, "tiny-llama", "main", 7)
