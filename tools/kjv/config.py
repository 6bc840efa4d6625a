"""Model configurations and config.json (glm_moe_dsa, HF v5 layout like tests/fixtures/glm_tiny).

FULL is the bundled model; TINY is the toy used by `train --tiny` on the CPU. A config here is a plain
dict with the config.json field names; `seq_len` (the training context) is kept out of config.json.
"""

import copy

FULL = {
    "vocab_size": 4096,
    "hidden_size": 256,
    "intermediate_size": 512,
    "moe_intermediate_size": 192,
    "num_hidden_layers": 5,
    "first_k_dense_replace": 1,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "q_lora_rank": 128,
    "kv_lora_rank": 128,
    "qk_nope_head_dim": 32,
    "qk_rope_head_dim": 32,
    "v_head_dim": 32,
    "index_n_heads": 4,
    "index_head_dim": 64,
    "index_topk": 64,
    "indexer_types": ["full", "full", "shared", "full", "shared"],
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": True,
    "routed_scaling_factor": 2.5,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "max_position_embeddings": 2048,
    "num_nextn_predict_layers": 1,
}
FULL_SEQ_LEN = 512

TINY = dict(FULL, **{
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "q_lora_rank": 32,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 16,
    "v_head_dim": 16,
    "index_n_heads": 2,
    "index_head_dim": 32,
    "index_topk": 16,
    "indexer_types": ["full", "full", "shared"],
    "n_routed_experts": 4,
})
TINY_SEQ_LEN = 64


def model_config(tiny, eos_id):
    """(config dict, training seq_len) for the full model or the toy."""
    cfg = copy.deepcopy(TINY if tiny else FULL)
    cfg["eos_token_id"] = eos_id
    return cfg, (TINY_SEQ_LEN if tiny else FULL_SEQ_LEN)


def mlp_layer_types(cfg):
    """'dense' for layers < first_k_dense_replace, else 'sparse'."""
    k = cfg["first_k_dense_replace"]
    return ["dense" if i < k else "sparse" for i in range(cfg["num_hidden_layers"])]


def check_config(cfg):
    """Reject configs the model code does not implement."""
    L = cfg["num_hidden_layers"]
    if len(cfg["indexer_types"]) != L or cfg["indexer_types"][0] != "full":
        raise ValueError("indexer_types must have one entry per layer and start with 'full'")
    if cfg["index_head_dim"] < cfg["qk_rope_head_dim"] or cfg["qk_rope_head_dim"] % 2:
        raise ValueError("index_head_dim must be >= qk_rope_head_dim, which must be even")
    if cfg["n_group"] != 1 or cfg["num_nextn_predict_layers"] != 1:
        raise ValueError("this trainer implements n_group == 1 and exactly one MTP layer")
    if cfg["num_key_value_heads"] != cfg["num_attention_heads"]:
        raise ValueError("MLA has num_key_value_heads == num_attention_heads")


def hf_config_json(cfg):
    """config.json content (HF v5 layout)."""
    out = {
        "architectures": ["GlmMoeDsaForCausalLM"],
        "model_type": "glm_moe_dsa",
    }
    for k in ("vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
              "first_k_dense_replace", "num_attention_heads", "num_key_value_heads", "q_lora_rank",
              "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "index_n_heads",
              "index_head_dim", "index_topk", "n_routed_experts", "num_experts_per_tok", "n_shared_experts",
              "n_group", "topk_group", "norm_topk_prob", "routed_scaling_factor", "rms_norm_eps",
              "max_position_embeddings", "num_nextn_predict_layers"):
        out[k] = cfg[k]
    out["rope_parameters"] = {"rope_type": "default", "rope_theta": cfg["rope_theta"]}
    out["indexer_types"] = list(cfg["indexer_types"])
    out["mlp_layer_types"] = mlp_layer_types(cfg)
    out["eos_token_id"] = cfg["eos_token_id"]
    out["pad_token_id"] = cfg["eos_token_id"]
    out["bos_token_id"] = None
    out["tie_word_embeddings"] = False
    out["hidden_act"] = "silu"
    out["attention_bias"] = False
    out["attention_dropout"] = 0.0
    out["initializer_range"] = 0.02
    out["use_cache"] = True
    out["dtype"] = "bfloat16"
    return out


def from_hf_config_json(js):
    """Inverse of hf_config_json (for loading an exported checkpoint)."""
    cfg = {k: js[k] for k in FULL if k in js and k != "rope_theta"}
    cfg["rope_theta"] = float(js["rope_parameters"]["rope_theta"])
    if js["rope_parameters"].get("rope_type", "default") != "default":
        raise ValueError("only default RoPE is implemented")
    cfg["eos_token_id"] = js["eos_token_id"]
    missing = [k for k in FULL if k not in cfg]
    if missing:
        raise ValueError(f"config.json lacks {missing}")
    if js.get("mlp_layer_types") is not None and js["mlp_layer_types"] != mlp_layer_types(cfg):
        raise ValueError("mlp_layer_types disagrees with first_k_dense_replace")
    check_config(cfg)
    return cfg
