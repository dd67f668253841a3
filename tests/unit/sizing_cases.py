"""Model configs and the deployment story shared by the sizing tests."""

from __future__ import annotations

# The locally generated test models (tests/fixtures/tiny_models.py), KV-relevant fields as written there.
TINY_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "torch_dtype": "bfloat16",
              "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 32, "vocab_size": 2048, "max_position_embeddings": 4096}
TINY_DSV3 = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "torch_dtype": "bfloat16",
             "num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4,
             "q_lora_rank": 64, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
             "v_head_dim": 128, "n_routed_experts": 4, "num_experts_per_tok": 2, "vocab_size": 2048,
             "max_position_embeddings": 4096}
TINY_DSV3_FP8KV = dict(TINY_DSV3, quantization_config={
    "quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_scheme": {"dynamic": False, "num_bits": 8,
                                                                          "type": "float"}})
KIMI_TEXT = {"model_type": "kimi_k2", "num_hidden_layers": 61, "hidden_size": 7168, "num_attention_heads": 64,
             "num_key_value_heads": 64, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
             "qk_nope_head_dim": 128, "v_head_dim": 128, "n_routed_experts": 384, "first_k_dense_replace": 1,
             "num_experts_per_tok": 8, "vocab_size": 163840,
             "max_position_embeddings": 262144, "dtype": "bfloat16"}
KIMI = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25", "text_config": KIMI_TEXT}

RTX_PRO_6000 = {"name": "NVIDIA RTX PRO 6000 Blackwell Server Edition", "memory_mib": 97887, "torch_memory_gib": 94.97,
                "compute_capability": "12.0"}
STORY_HARDWARE = dict(gpu=RTX_PRO_6000, gpu_count=8, checkpoint_bytes=591_000_000_000,
             quant={"kv_cache_quant_algo": "FP8"}, model_key="kimi-k2.5-nvfp4",
             repo="nvidia/Kimi-K2.5-NVFP4", gpu_key="rtx-pro-6000-blackwell")
