#!/usr/bin/env python3
"""Write tiny random DSA checkpoints and their golden outputs (the dsinfer test oracle).

For each fixture (glm_tiny, dsv32_tiny, glm_tiny_fp8) this script

  * draws random weights from a seeded torch.Generator in a fixed order, rounds them to the storage
    dtype (bf16, or fp8 e4m3 with 128x128 block scales for glm_tiny_fp8) and writes a Hugging Face
    checkpoint in the on-disk layout (config.json, model.safetensors or two shards + index), including
    the MTP layer at index num_hidden_layers;
  * loads that checkpoint with Hugging Face transformers (fp32, CPU, eager attention), verifies that
    HF parsed the config the way the on-disk config means and that every parameter equals what was
    written, and computes goldens under tests/fixtures/<name>/goldens/: teacher-forced logits, MTP
    logits, indexer top-k selections per layer and greedy continuations (full recompute, no cache).

Reference semantics: /work/shared/docs/dsa-reference.md (sections 1-3 and 5). HF is used as is, with
these deliberate corrections, applied by monkeypatching at run time:
  a) q_a_layernorm / kv_a_layernorm use config.rms_norm_eps (HF builds them with 1e-6);
  b) the lightning indexer selects its top-k in the defined total order (score descending, then
     position ascending) instead of torch.topk's unspecified tie order; its arithmetic is unchanged;
  c) the MTP layer (which HF does not run) is evaluated with HF's own decoder-layer class, following
     section 5 of the reference (embedding first in eh_proj's input).

Prompts are drawn at random and rejected when any discrete decision (greedy argmax, indexer top-k
boundary and order, MoE routing) lies within float noise of a flip; see README_fixtures.md.

Usage: python tools/make_fixtures.py --out tests/fixtures [--seed 0] [--only NAME] [--self-check]
"""

import argparse
import copy
import hashlib
import inspect
import json
import math
import os
import shutil
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

MIN_TRANSFORMERS = (5, 17)
GREEDY_NEW_TOKENS = 12
MAX_REJECTIONS_PER_LENGTH = 50
GREEDY_REL_THRESHOLD = 1e-3
INDEXER_REL_THRESHOLD = 1e-5
ROBUST_ZERO_REL_THRESHOLD = 1e-5
ROUTER_ABS_THRESHOLD = 1e-5
FP8_MAX = 448.0
FP8_BLOCK = 128


def require_transformers():
    """Import transformers and exit with a clear message unless it is >= 5.17."""
    try:
        import transformers
    except ImportError:
        sys.exit("make_fixtures.py needs Hugging Face transformers >= 5.17 (pip install 'transformers>=5.17').")
    parts = []
    for piece in transformers.__version__.split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    if tuple(parts) < MIN_TRANSFORMERS:
        sys.exit(
            f"make_fixtures.py needs transformers >= {MIN_TRANSFORMERS[0]}.{MIN_TRANSFORMERS[1]} "
            f"(glm_moe_dsa / deepseek_v32 support); found {transformers.__version__}."
        )
    return transformers


# ----------------------------------------------------------------------------------------------
# Fixture definitions
# ----------------------------------------------------------------------------------------------


def glm_tiny_config():
    """glm_tiny: glm_moe_dsa in the HF v5 config layout (rope_parameters, indexer_types, mlp_layer_types)."""
    return {
        "architectures": ["GlmMoeDsaForCausalLM"],
        "model_type": "glm_moe_dsa",
        "vocab_size": 512,
        "hidden_size": 128,
        "intermediate_size": 256,
        "moe_intermediate_size": 32,
        "num_hidden_layers": 4,
        "first_k_dense_replace": 1,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "q_lora_rank": 64,
        "kv_lora_rank": 64,
        "qk_nope_head_dim": 32,
        "qk_rope_head_dim": 16,
        "v_head_dim": 32,
        "index_n_heads": 4,
        "index_head_dim": 32,
        "index_topk": 8,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "n_shared_experts": 1,
        "n_group": 1,
        "topk_group": 1,
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 4096,
        "num_nextn_predict_layers": 1,
        "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
        "indexer_types": ["full", "shared", "full", "shared"],
        "mlp_layer_types": ["dense", "sparse", "sparse", "sparse"],
        "eos_token_id": [1, 2],
        "bos_token_id": 0,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "attention_bias": False,
        "dtype": "bfloat16",
    }


def dsv32_tiny_config():
    """dsv32_tiny: deepseek_v32 in the released (DeepSeek config.json) layout, YaRN rope_scaling."""
    return {
        "architectures": ["DeepseekV32ForCausalLM"],
        "model_type": "deepseek_v32",
        "vocab_size": 448,
        "hidden_size": 96,
        "intermediate_size": 192,
        "moe_intermediate_size": 32,
        "num_hidden_layers": 3,
        "first_k_dense_replace": 1,
        "moe_layer_freq": 1,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "q_lora_rank": 48,
        "kv_lora_rank": 32,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 16,
        "v_head_dim": 16,
        "index_n_heads": 4,
        "index_head_dim": 32,
        "index_topk": 12,
        "n_routed_experts": 16,
        "num_experts_per_tok": 4,
        "n_group": 4,
        "topk_group": 2,
        "n_shared_experts": 1,
        "topk_method": "noaux_tc",
        "scoring_func": "sigmoid",
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 1280,
        "rope_theta": 10000.0,
        "rope_scaling": {
            "type": "yarn",
            "factor": 40,
            "original_max_position_embeddings": 32,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
        },
        "num_nextn_predict_layers": 1,
        "eos_token_id": 1,
        "bos_token_id": 0,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "attention_bias": False,
        "torch_dtype": "bfloat16",
    }


def glm_tiny_fp8_config():
    """glm_tiny_fp8: glm_moe_dsa in the released layout (rope_theta, index_topk_freq/offset), fp8 blocks."""
    return {
        "architectures": ["GlmMoeDsaForCausalLM"],
        "model_type": "glm_moe_dsa",
        "vocab_size": 320,
        "hidden_size": 192,
        "intermediate_size": 384,
        "moe_intermediate_size": 80,
        "num_hidden_layers": 3,
        "first_k_dense_replace": 1,
        "num_attention_heads": 8,
        "num_key_value_heads": 8,
        "q_lora_rank": 160,
        "kv_lora_rank": 144,
        "qk_nope_head_dim": 32,
        "qk_rope_head_dim": 16,
        "v_head_dim": 32,
        "index_n_heads": 4,
        "index_head_dim": 32,
        "index_topk": 8,
        "index_topk_freq": 2,
        "index_skip_topk_offset": 1,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "n_shared_experts": 1,
        "n_group": 1,
        "topk_group": 1,
        "norm_topk_prob": True,
        "routed_scaling_factor": 2.5,
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 4096,
        "rope_theta": 8000000.0,
        "num_nextn_predict_layers": 1,
        "eos_token_id": [1],
        "bos_token_id": 0,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "attention_bias": False,
        "torch_dtype": "bfloat16",
        "quantization_config": {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "weight_block_size": [128, 128],
        },
    }


FIXTURES = [
    {
        "name": "glm_tiny",
        "config": glm_tiny_config,
        "seed_offset": 1000,
        "prompt_lengths": [1, 5, 8, 9, 24, 40],
        "shards": 1,
        "mtp_own_embed_head": False,
        "fp8": False,
    },
    {
        "name": "dsv32_tiny",
        "config": dsv32_tiny_config,
        "seed_offset": 2000,
        "prompt_lengths": [1, 3, 12, 13, 36, 60],
        "shards": 2,
        "mtp_own_embed_head": True,
        "fp8": False,
    },
    {
        "name": "glm_tiny_fp8",
        "config": glm_tiny_fp8_config,
        "seed_offset": 3000,
        "prompt_lengths": [1, 6, 9, 33],
        "shards": 1,
        "mtp_own_embed_head": False,
        "fp8": True,
    },
]


# ----------------------------------------------------------------------------------------------
# Intended semantics of an on-disk config (dsa-reference.md section 1), independent of HF
# ----------------------------------------------------------------------------------------------


def intended_semantics(cfg):
    """Return what the on-disk config means: per-layer indexer/MLP types and the RoPE parameters."""
    n = cfg["num_hidden_layers"]
    if cfg.get("indexer_types") is not None:
        indexer_types = list(cfg["indexer_types"])
    else:
        freq = max(int(cfg.get("index_topk_freq", 1)), 1)
        offset = int(cfg.get("index_skip_topk_offset", 0))
        indexer_types = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(n)]
    if cfg.get("mlp_layer_types") is not None:
        mlp_layer_types = list(cfg["mlp_layer_types"])
    else:
        k = cfg["first_k_dense_replace"]
        mlp_layer_types = ["dense" if i < k else "sparse" for i in range(n)]
    if cfg.get("rope_parameters") is not None:
        rope = dict(cfg["rope_parameters"])
    else:
        rope = dict(cfg.get("rope_scaling") or {})
        rope["rope_theta"] = cfg["rope_theta"]
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    rope_out = {"rope_type": rope_type, "rope_theta": float(rope["rope_theta"])}
    if rope_type == "yarn":
        for key in ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale", "mscale_all_dim"):
            if key in rope:
                rope_out[key] = rope[key]
    elif rope_type != "default":
        raise ValueError(f"unsupported rope type {rope_type}")
    return {"indexer_types": indexer_types, "mlp_layer_types": mlp_layer_types, "rope": rope_out}


def expected_inv_freq(cfg, sem):
    """RoPE inverse frequencies (float64) for the rope slice, plain or YaRN-blended (reference section 2)."""
    d = cfg["qk_rope_head_dim"]
    rope = sem["rope"]
    theta = rope["rope_theta"]
    base = np.array([theta ** (-(2.0 * i) / d) for i in range(d // 2)], dtype=np.float64)
    if rope["rope_type"] == "default":
        return base
    factor = float(rope["factor"])
    orig = float(rope["original_max_position_embeddings"])

    def correction_dim(rotations):
        return d * math.log(orig / (rotations * 2.0 * math.pi)) / (2.0 * math.log(theta))

    low = max(math.floor(correction_dim(rope.get("beta_fast", 32))), 0)
    high = min(math.ceil(correction_dim(rope.get("beta_slow", 1))), d - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(d // 2, dtype=np.float64) - low) / (high - low), 0.0, 1.0)
    keep = 1.0 - ramp  # weight of the unscaled (extrapolated) frequency
    return base / factor * (1.0 - keep) + base * keep


def expected_softmax_scale(cfg, sem):
    """MLA softmax scale tau = (qk_nope+qk_rope)^-1/2, times mscale^2 under YaRN with mscale_all_dim."""
    tau = (cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]) ** -0.5
    rope = sem["rope"]
    if rope["rope_type"] == "yarn" and rope.get("mscale_all_dim"):
        factor = float(rope["factor"])
        if factor > 1:
            m = 0.1 * float(rope["mscale_all_dim"]) * math.log(factor) + 1.0
            tau *= m * m
    return tau


# ----------------------------------------------------------------------------------------------
# Random weights
# ----------------------------------------------------------------------------------------------


def _randn(gen, shape, std, mean=0.0):
    """fp32 N(mean, std^2) from the fixture generator."""
    return torch.randn(shape, generator=gen, dtype=torch.float32) * std + mean


def _linear(gen, out_features, in_features, gain=1.0):
    """A [out, in] linear weight with entries N(0, gain^2 / in)."""
    return _randn(gen, (out_features, in_features), gain / math.sqrt(in_features))


def _norm_weight(gen, n):
    """An RMSNorm / LayerNorm weight 1 + 0.1 N(0, 1)."""
    return _randn(gen, (n,), 0.1, 1.0)


def layer_weights(gen, cfg, i, full_indexer, moe):
    """Weights of decoder layer i (fp32 master values, on-disk names without the layer prefix)."""
    D = cfg["hidden_size"]
    H = cfg["num_attention_heads"]
    nope, rope, vdim = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    qr, kvr = cfg["q_lora_rank"], cfg["kv_lora_rank"]
    w = {}
    w["input_layernorm.weight"] = _norm_weight(gen, D)
    w["self_attn.q_a_proj.weight"] = _linear(gen, qr, D)
    w["self_attn.q_a_layernorm.weight"] = _norm_weight(gen, qr)
    w["self_attn.q_b_proj.weight"] = _linear(gen, H * (nope + rope), qr)
    w["self_attn.kv_a_proj_with_mqa.weight"] = _linear(gen, kvr + rope, D)
    w["self_attn.kv_a_layernorm.weight"] = _norm_weight(gen, kvr)
    w["self_attn.kv_b_proj.weight"] = _linear(gen, H * (nope + vdim), kvr)
    w["self_attn.o_proj.weight"] = _linear(gen, D, H * vdim)
    if full_indexer:
        hi, di = cfg["index_n_heads"], cfg["index_head_dim"]
        w["self_attn.indexer.wq_b.weight"] = _linear(gen, hi * di, qr)
        w["self_attn.indexer.wk.weight"] = _linear(gen, di, D)
        w["self_attn.indexer.k_norm.weight"] = _norm_weight(gen, di)
        w["self_attn.indexer.k_norm.bias"] = _randn(gen, (di,), 0.1)
        w["self_attn.indexer.weights_proj.weight"] = _linear(gen, hi, D)
    w["post_attention_layernorm.weight"] = _norm_weight(gen, D)
    if moe:
        E, I = cfg["n_routed_experts"], cfg["moe_intermediate_size"]
        w["mlp.gate.weight"] = _linear(gen, E, D, gain=1.3)
        w["mlp.gate.e_score_correction_bias"] = _randn(gen, (E,), 0.05)
        for e in range(E):
            w[f"mlp.experts.{e}.gate_proj.weight"] = _linear(gen, I, D)
            w[f"mlp.experts.{e}.up_proj.weight"] = _linear(gen, I, D)
            w[f"mlp.experts.{e}.down_proj.weight"] = _linear(gen, D, I)
        Is = I * cfg["n_shared_experts"]
        w["mlp.shared_experts.gate_proj.weight"] = _linear(gen, Is, D)
        w["mlp.shared_experts.up_proj.weight"] = _linear(gen, Is, D)
        w["mlp.shared_experts.down_proj.weight"] = _linear(gen, D, Is)
    else:
        I = cfg["intermediate_size"]
        w["mlp.gate_proj.weight"] = _linear(gen, I, D)
        w["mlp.up_proj.weight"] = _linear(gen, I, D)
        w["mlp.down_proj.weight"] = _linear(gen, D, I)
    return w


def make_master_weights(gen, cfg, sem, mtp_own_embed_head):
    """All fp32 master weights in on-disk names, in a fixed generation order (main layers, then MTP)."""
    D, V = cfg["hidden_size"], cfg["vocab_size"]
    L = cfg["num_hidden_layers"]
    logit_gain = 3.0
    w = {"model.embed_tokens.weight": _randn(gen, (V, D), 1.0)}
    for i in range(L):
        lw = layer_weights(gen, cfg, i, sem["indexer_types"][i] == "full", sem["mlp_layer_types"][i] == "sparse")
        w.update({f"model.layers.{i}.{k}": v for k, v in lw.items()})
    mtp = layer_weights(gen, cfg, L, True, True)
    mtp["enorm.weight"] = _norm_weight(gen, D)
    mtp["hnorm.weight"] = _norm_weight(gen, D)
    mtp["eh_proj.weight"] = _linear(gen, D, 2 * D)
    mtp["shared_head.norm.weight"] = _norm_weight(gen, D)
    if mtp_own_embed_head:
        mtp["embed_tokens.weight"] = _randn(gen, (V, D), 1.0)
        mtp["shared_head.head.weight"] = _linear(gen, V, D, gain=logit_gain)
    w.update({f"model.layers.{L}.{k}": v for k, v in mtp.items()})
    w["model.norm.weight"] = _norm_weight(gen, D)
    w["lm_head.weight"] = _linear(gen, V, D, gain=logit_gain)
    return w


FP8_QUANTIZED_SUFFIXES = (
    "self_attn.q_a_proj.weight",
    "self_attn.q_b_proj.weight",
    "self_attn.kv_a_proj_with_mqa.weight",
    "self_attn.kv_b_proj.weight",
    "self_attn.o_proj.weight",
    "self_attn.indexer.wq_b.weight",
    "self_attn.indexer.wk.weight",
    "gate_proj.weight",
    "up_proj.weight",
    "down_proj.weight",
)


def is_fp8_quantized(name):
    """Whether a linear weight is stored as fp8 e4m3 with block scales in the fp8 fixture."""
    return name.startswith("model.layers.") and name.endswith(FP8_QUANTIZED_SUFFIXES)


def quantize_fp8_blocks(w):
    """Block-quantize [out, in] fp32 to (e4m3 weight, fp32 scale_inv [ceil(out/128), ceil(in/128)])."""
    out_f, in_f = w.shape
    nbo, nbi = -(-out_f // FP8_BLOCK), -(-in_f // FP8_BLOCK)
    scale_inv = torch.empty((nbo, nbi), dtype=torch.float32)
    w8 = torch.empty((out_f, in_f), dtype=torch.float8_e4m3fn)
    for bo in range(nbo):
        for bi in range(nbi):
            rs = slice(bo * FP8_BLOCK, (bo + 1) * FP8_BLOCK)
            cs = slice(bi * FP8_BLOCK, (bi + 1) * FP8_BLOCK)
            block = w[rs, cs]
            amax = block.abs().max()
            s = amax / FP8_MAX if float(amax) > 0 else torch.tensor(1.0, dtype=torch.float32)
            scale_inv[bo, bi] = s
            w8[rs, cs] = (block / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    assert not torch.isnan(w8.float()).any()
    return w8, scale_inv


def dequantize_fp8_blocks(w8, scale_inv):
    """W = W8 * scale_inv[i // 128, j // 128], computed in fp32."""
    out_f, in_f = w8.shape
    s = scale_inv.repeat_interleave(FP8_BLOCK, 0)[:out_f].repeat_interleave(FP8_BLOCK, 1)[:, :in_f]
    return w8.float() * s


def storage_and_reference(master, fp8):
    """Round master weights to the on-disk dtypes; return (stored tensors, fp32 reference tensors)."""
    stored, ref = {}, {}
    for name, w in master.items():
        if name.endswith("e_score_correction_bias"):
            stored[name] = w.clone()
            ref[name] = w.clone()
        elif fp8 and is_fp8_quantized(name):
            w8, s = quantize_fp8_blocks(w)
            stored[name] = w8
            stored[name[: -len("weight")] + "weight_scale_inv"] = s
            ref[name] = dequantize_fp8_blocks(w8, s)
        else:
            b = w.to(torch.bfloat16)
            stored[name] = b
            ref[name] = b.float()
    return stored, ref


def write_checkpoint(out_dir, cfg, stored, shards):
    """Write config.json and the safetensors file(s) (two shards + index when shards == 2)."""
    from safetensors.torch import save_file

    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    tensors = {k: v.contiguous() for k, v in stored.items()}
    if shards == 1:
        save_file(tensors, os.path.join(out_dir, "model.safetensors"), metadata={"format": "pt"})
        return
    sizes = {k: v.numel() * v.element_size() for k, v in tensors.items()}
    total = sum(sizes.values())
    parts, acc = [{}, {}], 0
    for k, v in tensors.items():  # generation order; the split may fall inside a layer
        parts[0 if acc < total / 2 else 1][k] = v
        acc += sizes[k]
    weight_map = {}
    for idx, part in enumerate(parts):
        fname = f"model-{idx + 1:05d}-of-{len(parts):05d}.safetensors"
        save_file(part, os.path.join(out_dir, fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in part})
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2)
        f.write("\n")


# ----------------------------------------------------------------------------------------------
# Recording and the tie-order-defined indexer
# ----------------------------------------------------------------------------------------------


class Recorder:
    """Collects indexer and router internals while active (no-cache forwards only)."""

    def __init__(self):
        self.active = False
        self.indexer = []
        self.router = []

    def start(self):
        """Clear and activate."""
        self.indexer, self.router, self.active = [], [], True
        return self

    def stop(self):
        """Deactivate and return (indexer records, router records)."""
        self.active = False
        return self.indexer, self.router


REC = Recorder()
_ORIGINAL_FORWARDS = {}


def _make_indexer_forward(rope_fn):
    """Build an indexer forward with HF's arithmetic and the defined top-k order (score desc, pos asc)."""

    def forward(self, hidden_states, q_resid, position_embeddings, attention_mask, position_ids=None,
                cache=None, past_key_values=None, **kwargs):
        """DSA indexer: HF's score computation, then a stable descending sort instead of topk."""
        if cache is None:
            cache = past_key_values
        batch_size, seq_len, _ = hidden_states.shape
        cos, sin = position_embeddings
        q = self.wq_b(q_resid).view(batch_size, seq_len, self.n_heads, self.head_dim)
        q_rot, q_pass = torch.split(q, [self.qk_rope_head_dim, self.head_dim - self.qk_rope_head_dim], dim=-1)
        k = self.k_norm(self.wk(hidden_states)).unsqueeze(2)
        k_rot, k_pass = torch.split(k, [self.qk_rope_head_dim, self.head_dim - self.qk_rope_head_dim], dim=-1)
        q_rot, k_rot = rope_fn(q_rot, k_rot, cos, sin, unsqueeze_dim=2)
        q = torch.cat([q_rot, q_pass], dim=-1)
        k = torch.cat([k_rot, k_pass], dim=-1).squeeze(2)
        if cache is not None:
            k = cache.update_indexer(k, self.layer_idx)
        qk = torch.matmul(q.float(), k.transpose(-1, -2).float().unsqueeze(1)) * self.softmax_scale  # [B,S,H,T]
        relu_qk = F.relu(qk)
        weights = self.weights_proj(hidden_states.to(self.weights_proj.weight.dtype)).float() * (self.n_heads ** -0.5)
        raw_scores = torch.matmul(weights.unsqueeze(-2), relu_qk).squeeze(-2)  # [B,S,T]
        if attention_mask.dtype == torch.bool:
            index_scores = raw_scores.masked_fill(~attention_mask, float("-inf"))
        else:
            index_scores = raw_scores + attention_mask
        topk = min(self.index_topk, index_scores.shape[-1])
        order = torch.sort(index_scores, dim=-1, descending=True, stable=True).indices
        selected = order[..., :topk].to(torch.int32)
        if REC.active:
            REC.indexer.append({
                "layer": self.layer_idx,
                "qk": qk[0].detach().clone(),
                "q_norm": torch.linalg.vector_norm(q[0].float(), dim=-1),
                "k_norm": torch.linalg.vector_norm(k[0].float(), dim=-1),
                "scale": float(self.softmax_scale),
                "scores": raw_scores[0].detach().clone(),
                "selected": selected[0].clone(),
            })
        return selected

    return forward


def patch_hf(modules):
    """Install the defined-order indexer forward on both families' indexer classes."""
    glm_mod, dsv_mod = modules
    for cls, rope_fn in ((glm_mod.GlmMoeDsaIndexer, glm_mod.apply_rotary_pos_emb_interleave),
                         (dsv_mod.DeepseekV32Indexer, dsv_mod.apply_rotary_pos_emb)):
        if cls not in _ORIGINAL_FORWARDS:
            _ORIGINAL_FORWARDS[cls] = cls.forward
        cls.forward = _make_indexer_forward(rope_fn)


def use_original_indexer(enable):
    """Temporarily switch the indexer classes back to HF's own forward (enable=True) or to the patch."""
    for cls, fwd in _ORIGINAL_FORWARDS.items():
        if enable:
            cls._oracle_patched_forward = cls.forward
            cls.forward = fwd
        else:
            cls.forward = cls._oracle_patched_forward


def fix_mla_norm_eps(layer, eps):
    """Correction (a): q_a_layernorm / kv_a_layernorm use the config rms_norm_eps."""
    layer.self_attn.q_a_layernorm.variance_epsilon = eps
    layer.self_attn.kv_a_layernorm.variance_epsilon = eps


def attach_router_hooks(module):
    """Record router logits (and HF's chosen experts) of every router under module."""

    def hook(router, inputs, output):
        if REC.active:
            REC.router.append({
                "logits": output[0].detach().float().clone(),
                "bias": router.e_score_correction_bias.detach().float().clone(),
                "chosen": output[2].detach().clone(),
                "n_group": router.num_group,
                "topk_group": router.topk_group,
                "top_k": router.top_k,
            })

    for sub in module.modules():
        if type(sub).__name__.endswith("TopkRouter"):
            sub.register_forward_hook(hook)


# ----------------------------------------------------------------------------------------------
# Robustness checks
# ----------------------------------------------------------------------------------------------


def check_index_row(s, robust, k):
    """Check one indexer row (causal keys only). Returns (ok, smallest normalised gap)."""
    m = len(s)
    norm = max(1.0, float(np.abs(s).max()))
    thr = INDEXER_REL_THRESHOLD * norm
    order = np.argsort(-s, kind="stable")
    margin = math.inf
    zero_ok = (s == 0) & robust
    # order of the recorded selection: adjacent ranks 0..k must be separated or be robust exact-zero ties
    top = min(m, k + 1)
    for r in range(top - 1):
        a, b = order[r], order[r + 1]
        if zero_ok[a] and zero_ok[b]:
            continue
        gap = float(s[a]) - float(s[b])
        if gap <= thr:
            return False, gap / norm
        margin = min(margin, gap / norm)
    if m > k:  # selection boundary: every key near the k-th score must be a robust exact-zero tie with it
        bk = order[k - 1]
        d = np.abs(s.astype(np.float64) - float(s[bk]))
        d[bk] = math.inf
        exempt = zero_ok & bool(zero_ok[bk])
        live = d[~exempt]
        if live.size:
            near = float(live.min())
            if near <= thr:
                return False, near / norm
            margin = min(margin, near / norm)
    return True, margin


def check_indexer_records(records, k):
    """Check every row of every recorded (no-cache) indexer call. Returns (ok, min margin)."""
    margin = math.inf
    for rec in records:
        qk = rec["qk"].numpy()  # [S, H, T], already times softmax_scale
        scores = rec["scores"].numpy()
        bound = -ROBUST_ZERO_REL_THRESHOLD * np.maximum(
            1.0, rec["q_norm"].numpy()[:, :, None] * rec["k_norm"].numpy()[None, None, :] * rec["scale"])
        robust_all = np.all(qk < bound, axis=1)  # [S, T]
        sel = rec["selected"].numpy()
        for t in range(scores.shape[0]):
            s = scores[t, : t + 1]
            ok, mg = check_index_row(s, robust_all[t, : t + 1], k)
            margin = min(margin, mg)
            if not ok:
                return False, margin
            # the defined order must be what the patched indexer selected
            want = np.argsort(-s, kind="stable")[: min(k, t + 1)]
            if not np.array_equal(sel[t, : len(want)], want):
                raise AssertionError("indexer selection differs from the defined order")
    return True, margin


def check_router_records(records):
    """Check group and expert selection gaps for every token of every router call."""
    margin = math.inf
    for rec in records:
        b = rec["logits"].sigmoid() + rec["bias"]  # scores_for_choice [N, E]
        n_tok, n_exp = b.shape
        ng, kg, top_k = rec["n_group"], rec["topk_group"], rec["top_k"]
        per = n_exp // ng
        if ng > 1:
            gs = b.view(n_tok, ng, per).topk(2, dim=-1).values.sum(-1)
            gsorted, gorder = torch.sort(gs, dim=-1, descending=True, stable=True)
            if kg < ng:
                gap = (gsorted[:, kg - 1] - gsorted[:, kg]).min().item()
                margin = min(margin, gap)
                if gap <= ROUTER_ABS_THRESHOLD:
                    return False, margin
            keep = torch.zeros(n_tok, ng, dtype=torch.bool)
            keep.scatter_(1, gorder[:, :kg], True)
            keep = keep.unsqueeze(-1).expand(n_tok, ng, per).reshape(n_tok, n_exp)
            b = b.masked_fill(~keep, -math.inf)
        bsorted, border = torch.sort(b, dim=-1, descending=True, stable=True)
        if top_k < bsorted.shape[1] and torch.isfinite(bsorted[:, top_k]).all():
            gap = (bsorted[:, top_k - 1] - bsorted[:, top_k]).min().item()
            margin = min(margin, gap)
            if gap <= ROUTER_ABS_THRESHOLD:
                return False, margin
        mine = torch.sort(border[:, :top_k], dim=-1).values
        theirs = torch.sort(rec["chosen"].long(), dim=-1).values
        if not torch.equal(mine, theirs):
            raise AssertionError("HF router chose different experts than the defined selection")
    return True, margin


def greedy_margin(row):
    """(top1 - top2) / max(1, std(row)) for one logits row."""
    top2 = torch.topk(row, 2).values
    return float(top2[0] - top2[1]) / max(1.0, float(row.double().std(unbiased=False)))


# ----------------------------------------------------------------------------------------------
# Model runs
# ----------------------------------------------------------------------------------------------


def run_main(model, ids):
    """No-cache forward of the main model. Returns (logits [n,V], hidden after norm [n,D], records)."""
    x = torch.tensor([ids], dtype=torch.long)
    REC.start()
    try:
        h = model.model(input_ids=x, use_cache=False).last_hidden_state
        logits = model.lm_head(h)
    finally:
        idx_recs, router_recs = REC.stop()
    return logits[0], h[0], (idx_recs, router_recs)


class MtpReference:
    """The MTP layer (index L) evaluated with HF's decoder-layer class (reference section 5)."""

    def __init__(self, model, ref, cfg):
        L = cfg["num_hidden_layers"]
        hf_cfg = copy.deepcopy(model.config)
        hf_cfg.num_hidden_layers = L + 1
        hf_cfg.mlp_layer_types = list(hf_cfg.mlp_layer_types) + ["sparse"]
        if getattr(hf_cfg, "indexer_types", None) is not None:
            hf_cfg.indexer_types = list(hf_cfg.indexer_types) + ["full"]
        if getattr(hf_cfg, "layer_types", None) is not None:
            hf_cfg.layer_types = list(hf_cfg.layer_types) + [hf_cfg.layer_types[-1]]
        layer_cls = type(model.model.layers[0])
        self.layer = layer_cls(hf_cfg, L).float().eval()
        prefix = f"model.layers.{L}."
        extras = ("enorm.", "hnorm.", "eh_proj.", "shared_head.", "embed_tokens.")
        layer_sd = {k[len(prefix):]: v for k, v in ref.items()
                    if k.startswith(prefix) and not k[len(prefix):].startswith(extras)}
        self.layer.load_state_dict(to_hf_layout(layer_sd), strict=True)
        assert_state_equal(self.layer.state_dict(), to_hf_layout(layer_sd), "MTP layer")
        fix_mla_norm_eps(self.layer, cfg["rms_norm_eps"])
        attach_router_hooks(self.layer)
        norm_cls = type(model.model.norm)
        eps = cfg["rms_norm_eps"]

        def norm(name):
            n = norm_cls(cfg["hidden_size"], eps=eps)
            n.weight.data.copy_(ref[prefix + name])
            return n.float().eval()

        self.enorm, self.hnorm, self.head_norm = norm("enorm.weight"), norm("hnorm.weight"), norm("shared_head.norm.weight")
        self.eh_proj = ref[prefix + "eh_proj.weight"]
        self.embed = ref.get(prefix + "embed_tokens.weight", ref["model.embed_tokens.weight"])
        self.head = ref.get(prefix + "shared_head.head.weight", ref["lm_head.weight"])
        self.rotary = model.model.rotary_emb

    def forward(self, ids, h):
        """Teacher-forced MTP logits [n-1, V] from prompt ids and main hidden states h [n, D]."""
        n = len(ids)
        nxt = torch.tensor(ids[1:], dtype=torch.long)
        e = self.enorm(F.embedding(nxt, self.embed))
        x = F.linear(torch.cat([e, self.hnorm(h[: n - 1])], dim=-1), self.eh_proj).unsqueeze(0)
        pos = torch.arange(n - 1, dtype=torch.long).unsqueeze(0)
        pe = self.rotary(x, pos)
        mask = torch.full((n - 1, n - 1), torch.finfo(torch.float32).min).triu(1)[None, None]
        REC.start()
        try:
            y = self.layer(x, attention_mask=mask, position_ids=pos, position_embeddings=pe)
        finally:
            recs = REC.stop()
        if isinstance(y, tuple):
            y = y[0]
        return F.linear(self.head_norm(y[0]), self.head), recs


def to_hf_layout(sd):
    """Map per-expert on-disk tensors to HF's fused experts.gate_up_proj / experts.down_proj."""
    out, experts = {}, {}
    for k, v in sd.items():
        parts = k.split(".")
        if "experts" in parts and parts[parts.index("experts") + 1].isdigit():
            i = parts.index("experts")
            base = ".".join(parts[: i + 1])
            experts.setdefault(base, {}).setdefault(int(parts[i + 1]), {})[parts[i + 2]] = v
        else:
            out[k] = v
    for base, per in experts.items():
        ids = sorted(per)
        out[base + ".gate_up_proj"] = torch.stack([torch.cat([per[e]["gate_proj"], per[e]["up_proj"]], 0) for e in ids])
        out[base + ".down_proj"] = torch.stack([per[e]["down_proj"] for e in ids])
    return out


def assert_state_equal(got, want, what):
    """Every key of got must be in want with identical values, and vice versa."""
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    if missing or extra:
        raise AssertionError(f"{what}: key mismatch; not in model: {missing[:5]}, not written: {extra[:5]}")
    for k in want:
        if got[k].shape != want[k].shape or not torch.equal(got[k].float(), want[k].float()):
            raise AssertionError(f"{what}: parameter {k} differs from the written tensor")


# ----------------------------------------------------------------------------------------------
# HF loading and config parse checks
# ----------------------------------------------------------------------------------------------


def hf_classes(transformers, model_type):
    """(causal LM class, config class) for a model_type."""
    if model_type == "glm_moe_dsa":
        return transformers.GlmMoeDsaForCausalLM, transformers.GlmMoeDsaConfig
    if model_type == "deepseek_v32":
        return transformers.DeepseekV32ForCausalLM, transformers.DeepseekV32Config
    raise ValueError(model_type)


def parse_problems(model, cfg, sem):
    """Differences between what HF built and what the on-disk config means (empty list if none)."""
    problems = []
    layers = model.model.layers
    got_idx = ["full" if layer.self_attn.indexer is not None else "shared"
               if hasattr(layer.self_attn, "indexer") else "?" for layer in layers]
    if got_idx != sem["indexer_types"]:
        problems.append(f"indexer types {got_idx} != {sem['indexer_types']}")
    got_mlp = ["sparse" if hasattr(layer.mlp, "gate") and hasattr(layer.mlp, "experts") else "dense" for layer in layers]
    if got_mlp != sem["mlp_layer_types"]:
        problems.append(f"mlp types {got_mlp} != {sem['mlp_layer_types']}")
    rot = model.model.rotary_emb
    want = expected_inv_freq(cfg, sem)
    got = rot.inv_freq.double().numpy()
    if got.shape != want.shape or not np.allclose(got, want, rtol=2e-6, atol=0):
        problems.append(f"rope inv_freq {got.tolist()} != {want.tolist()}")
    if abs(float(rot.attention_scaling) - 1.0) > 1e-12:
        problems.append(f"rope attention_scaling {rot.attention_scaling} != 1")
    tau = expected_softmax_scale(cfg, sem)
    if abs(layers[0].self_attn.scaling - tau) > 1e-9 * tau:
        problems.append(f"softmax scale {layers[0].self_attn.scaling} != {tau}")
    return problems


def explicit_hf_config(config_cls, cfg, sem):
    """Build the HF config object directly from the intended semantics (fallback when HF misparses)."""
    fields = {k: v for k, v in cfg.items() if k not in (
        "rope_theta", "rope_scaling", "rope_parameters", "index_topk_freq", "index_skip_topk_offset",
        "quantization_config", "indexer_types", "mlp_layer_types")}
    fields["rope_parameters"] = dict(sem["rope"])
    fields["mlp_layer_types"] = list(sem["mlp_layer_types"])
    if cfg["model_type"] == "glm_moe_dsa":
        fields["indexer_types"] = list(sem["indexer_types"])
    elif any(t != "full" for t in sem["indexer_types"]):
        raise ValueError("deepseek_v32 has no shared indexer layers in HF")
    return config_cls(**fields)


def load_hf(transformers, load_dir, cfg, sem, ref, force_explicit):
    """Load the checkpoint with HF (fp32, eager), check parse, loading info and every parameter."""
    model_cls, config_cls = hf_classes(transformers, cfg["model_type"])
    kwargs = dict(dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    note, model, info = None, None, None
    if not force_explicit:
        model, info = model_cls.from_pretrained(load_dir, **kwargs)
        problems = parse_problems(model, cfg, sem)
        if problems:
            note = "HF misparsed the on-disk config (" + "; ".join(problems) + "); built the HF config explicitly"
    if force_explicit or note:
        hf_cfg = explicit_hf_config(config_cls, cfg, sem)
        model, info = model_cls.from_pretrained(load_dir, config=hf_cfg, **kwargs)
        note = note or "HF config built explicitly from the intended semantics (--explicit-hf-config)"
        problems = parse_problems(model, cfg, sem)
        if problems:
            raise AssertionError("explicit HF config still differs: " + "; ".join(problems))
    model.eval()
    L = cfg["num_hidden_layers"]
    if info["missing_keys"]:
        raise AssertionError(f"HF reports missing keys: {sorted(info['missing_keys'])[:10]}")
    bad = [k for k in info["unexpected_keys"] if not k.startswith(f"model.layers.{L}.")]
    if bad:
        raise AssertionError(f"HF reports unexpected keys outside the MTP layer: {sorted(bad)[:10]}")
    if info.get("mismatched_keys"):
        raise AssertionError(f"HF reports mismatched keys: {info['mismatched_keys']}")
    main_ref = {k: v for k, v in ref.items() if not k.startswith(f"model.layers.{L}.")}
    assert_state_equal(model.state_dict(), to_hf_layout(main_ref), "main model")
    for layer in model.model.layers:
        fix_mla_norm_eps(layer, cfg["rms_norm_eps"])
    attach_router_hooks(model)
    return model, note, sorted(info["unexpected_keys"])


# ----------------------------------------------------------------------------------------------
# Goldens
# ----------------------------------------------------------------------------------------------


def topk_golden(idx_records, sem, n, k):
    """[num_layers, n, k] int32 selections in the defined order, -1 padded; shared layers repeat."""
    by_layer = {rec["layer"]: rec["selected"].numpy() for rec in idx_records}
    out = np.full((len(sem["indexer_types"]), n, k), -1, dtype=np.int32)
    last = None
    for i, kind in enumerate(sem["indexer_types"]):
        if kind == "full":
            last = by_layer[i]
        elif last is None:
            raise AssertionError("shared indexer layer before any full layer")
        for t in range(n):
            row = last[t][: min(k, t + 1)]
            if (row > t).any():
                raise AssertionError("non-causal key among the first t+1 selected")
            out[i, t, : len(row)] = row
    if sorted(by_layer) != [i for i, kind in enumerate(sem["indexer_types"]) if kind == "full"]:
        raise AssertionError(f"indexer ran on layers {sorted(by_layer)}, expected the full layers")
    return out


def evaluate_prompt(model, mtp, cfg, ids):
    """Run all goldens for one prompt with robustness checks. Returns (result or None, margins, reason)."""
    k = cfg["index_topk"]
    margins = {"greedy": math.inf, "indexer_boundary": math.inf, "router": math.inf}

    def checked(recs, where):
        ok, mg = check_indexer_records(recs[0], k)
        margins["indexer_boundary"] = min(margins["indexer_boundary"], mg)
        if not ok:
            return f"indexer near-tie ({where}, margin {mg:.3g})"
        ok, mg = check_router_records(recs[1])
        margins["router"] = min(margins["router"], mg)
        if not ok:
            return f"router near-tie ({where}, gap {mg:.3g})"
        return None

    with torch.no_grad():
        logits, h, recs = run_main(model, ids)
        reason = checked(recs, "teacher-forced")
        if reason:
            return None, margins, reason
        topk = topk_golden(recs[0], intended_semantics(cfg), len(ids), k)
        mtp_logits = None
        if len(ids) > 1:
            mtp_logits, mrecs = mtp.forward(ids, h)
            reason = checked(mrecs, "MTP")
            if reason:
                return None, margins, reason
        seq, greedy, step_logits = list(ids), [], logits
        for step in range(GREEDY_NEW_TOKENS):
            if step > 0:
                step_logits, _, srecs = run_main(model, seq)
                reason = checked(srecs, f"greedy step {step}")
                if reason:
                    return None, margins, reason
            row = step_logits[-1]
            mg = greedy_margin(row)
            margins["greedy"] = min(margins["greedy"], mg)
            if mg <= GREEDY_REL_THRESHOLD:
                return None, margins, f"greedy near-tie (step {step}, margin {mg:.3g})"
            tok = int(torch.argmax(row))
            greedy.append(tok)
            seq.append(tok)
    return {
        "ids": list(ids),
        "logits": logits.float().numpy().copy(),
        "mtp": None if mtp_logits is None else mtp_logits.float().numpy().copy(),
        "topk": topk,
        "greedy": greedy,
    }, margins, None


def e4m3_table():
    """All 256 e4m3fn byte values as floats (NaN as None)."""
    vals = torch.tensor(range(256), dtype=torch.uint8).view(torch.float8_e4m3fn).float().tolist()
    return [None if math.isnan(v) else v for v in vals]


def save_npy(path, arr):
    """numpy.save as little-endian C-order."""
    arr = np.ascontiguousarray(arr)
    arr = arr.astype(arr.dtype.newbyteorder("<"), copy=False)
    np.save(path, arr, allow_pickle=False)


def json_margin(x):
    """Finite float or None for JSON."""
    return None if not math.isfinite(x) else float(x)


def build_fixture(transformers, spec, out_root, seed, force_explicit):
    """Write one fixture's checkpoint and goldens; return a summary dict."""
    name = spec["name"]
    cfg = spec["config"]()
    sem = intended_semantics(cfg)
    gen = torch.Generator().manual_seed(seed + spec["seed_offset"])
    master = make_master_weights(gen, cfg, sem, spec["mtp_own_embed_head"])
    stored, ref = storage_and_reference(master, spec["fp8"])
    out_dir = os.path.join(out_root, name)
    if os.path.isdir(out_dir):
        shutil.rmtree(out_dir)
    write_checkpoint(out_dir, cfg, stored, spec["shards"])

    with tempfile.TemporaryDirectory() as tmp:
        load_dir = out_dir
        if spec["fp8"]:  # HF's own fp8 path needs a GPU: load an fp32 dequantized copy instead
            plain_cfg = {k: v for k, v in cfg.items() if k != "quantization_config"}
            write_checkpoint(tmp, plain_cfg, ref, 1)
            load_dir = tmp
        model, note, unexpected = load_hf(transformers, load_dir, cfg, sem, ref, force_explicit)
    mtp = MtpReference(model, ref, cfg)

    prompt_gen = torch.Generator().manual_seed(seed + spec["seed_offset"] + 500)
    prompts, rejected, reasons = [], 0, []
    min_margins = {"greedy": math.inf, "indexer_boundary": math.inf, "router": math.inf}
    for n in spec["prompt_lengths"]:
        for attempt in range(MAX_REJECTIONS_PER_LENGTH + 1):
            ids = torch.randint(3, cfg["vocab_size"], (n,), generator=prompt_gen).tolist()
            result, margins, reason = evaluate_prompt(model, mtp, cfg, ids)
            if result is not None:
                break
            rejected += 1
            reasons.append(f"len {n}: {reason}")
        else:
            raise RuntimeError(f"{name}: {MAX_REJECTIONS_PER_LENGTH} rejections for prompt length {n}")
        for key in min_margins:
            min_margins[key] = min(min_margins[key], margins[key])
        prompts.append(result)

    gdir = os.path.join(out_dir, "goldens")
    os.makedirs(gdir)
    entries = []
    for i, p in enumerate(prompts):
        pname = f"p{i}"
        save_npy(os.path.join(gdir, f"{pname}_logits.npy"), p["logits"].astype(np.float32))
        if p["mtp"] is not None:
            save_npy(os.path.join(gdir, f"{pname}_mtp.npy"), p["mtp"].astype(np.float32))
        save_npy(os.path.join(gdir, f"{pname}_topk.npy"), p["topk"].astype(np.int32))
        entries.append({
            "name": pname,
            "ids": p["ids"],
            "logits": f"{pname}_logits.npy",
            "mtp_logits": None if p["mtp"] is None else f"{pname}_mtp.npy",
            "topk": f"{pname}_topk.npy",
            "greedy": p["greedy"],
            "greedy_new_tokens": GREEDY_NEW_TOKENS,
        })
    rot = model.model.rotary_emb
    manifest = {
        "model": name,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "seed": seed,
        "rope_inv_freq": [float(x) for x in rot.inv_freq.float().tolist()],
        "rope_attention_scaling": float(rot.attention_scaling),
        "attn_softmax_scale": float(model.model.layers[0].self_attn.scaling),
        "e4m3_table": e4m3_table(),
        "rejected_prompts": rejected,
        "min_margins": {k: json_margin(v) for k, v in min_margins.items()},
        "prompts": entries,
    }
    with open(os.path.join(gdir, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=1)
        f.write("\n")

    return {
        "name": name,
        "model": model,
        "mtp": mtp,
        "cfg": cfg,
        "sem": sem,
        "prompts": prompts,
        "note": note,
        "unexpected": unexpected,
        "rejected": rejected,
        "reasons": reasons,
        "min_margins": min_margins,
        "bytes": dir_bytes(out_dir),
        "hf_parsed": {
            "rope_parameters": dict(model.config.rope_parameters),
            "indexer_types": list(getattr(model.config, "indexer_types", None) or []) or None,
            "mlp_layer_types": list(model.config.mlp_layer_types),
        },
    }


def dir_bytes(path):
    """Total size in bytes of the files under path."""
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


# ----------------------------------------------------------------------------------------------
# Diagnostics and self-checks
# ----------------------------------------------------------------------------------------------


def health_report(summary):
    """Activation and router statistics on the longest prompt (to show the model is not degenerate)."""
    model, p = summary["model"], max(summary["prompts"], key=lambda q: len(q["ids"]))
    rms = []
    hooks = [layer.register_forward_hook(
        lambda mod, inp, out: rms.append(float((out[0] if isinstance(out, tuple) else out).pow(2).mean().sqrt())))
        for layer in model.model.layers]
    try:
        with torch.no_grad():
            logits, _, (_, routers) = run_main(model, p["ids"])
    finally:
        for hk in hooks:
            hk.remove()
    sig = torch.cat([r["logits"].sigmoid().flatten() for r in routers]) if routers else torch.zeros(1)
    q = torch.quantile(sig, torch.tensor([0.05, 0.5, 0.95])).tolist()
    return (f"residual rms per layer {[round(x, 2) for x in rms]}, logits std {float(logits.std()):.2f}, "
            f"router sigmoid 5/50/95% {[round(x, 3) for x in q]}")


def cache_kwarg(model):
    """Name of the cache argument of model.forward ('cache' in newer transformers, else 'past_key_values')."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def self_check(summary):
    """(1) unpatched HF indexer vs patched logits; (2) HF cached decode vs full recompute."""
    model = summary["model"]
    lines = []
    with torch.no_grad():
        use_original_indexer(True)
        try:
            diffs = []
            for p in summary["prompts"]:
                logits, _, _ = run_main(model, p["ids"])
                diffs.append(float((logits - torch.from_numpy(p["logits"])).abs().max()))
        finally:
            use_original_indexer(False)
        lines.append(f"unpatched-HF-topk vs patched teacher-forced logits, max |diff| per prompt: "
                     f"{[f'{d:.3g}' for d in diffs]}")
        p = max(summary["prompts"], key=lambda q: len(q["ids"]))
        ids = p["ids"]
        from transformers import DynamicCache

        cache = DynamicCache(config=model.config)
        key = cache_kwarg(model)
        rows = []
        for t in range(len(ids)):
            out = model(input_ids=torch.tensor([[ids[t]]]), use_cache=True, **{key: cache})
            rows.append(out.logits[0, -1])
        full = torch.from_numpy(p["logits"])
        last_rel = float((rows[-1] - full[-1]).abs().max() / full[-1].abs().max())
        all_rel = max(float((r - full[t]).abs().max() / full[t].abs().max()) for t, r in enumerate(rows))
        argmax_same = all(int(torch.argmax(r)) == int(torch.argmax(full[t])) for t, r in enumerate(rows))
        lines.append(f"cached decode (len {len(ids)}, one token at a time) vs full recompute: last row rel err "
                     f"{last_rel:.3g} ({'OK' if last_rel <= 1e-4 else 'FAIL'} at 1e-4), worst row rel err "
                     f"{all_rel:.3g}, argmax identical on all rows: {argmax_same}")
    return lines


def main():
    """Entry point."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/fixtures", help="output root (default tests/fixtures)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", action="append", help="build only this fixture (repeatable)")
    ap.add_argument("--self-check", action="store_true",
                    help="also compare with HF's unpatched indexer and HF's cached decode")
    ap.add_argument("--explicit-hf-config", action="store_true",
                    help="build HF's config object from the intended semantics instead of HF's parse")
    args = ap.parse_args()

    transformers = require_transformers()
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)  # HF initialises modules before loading; keep even that reproducible
    from transformers.models.deepseek_v32 import modeling_deepseek_v32 as dsv_mod
    from transformers.models.glm_moe_dsa import modeling_glm_moe_dsa as glm_mod

    patch_hf((glm_mod, dsv_mod))

    specs = [s for s in FIXTURES if not args.only or s["name"] in args.only]
    os.makedirs(args.out, exist_ok=True)
    summaries = []
    for spec in specs:
        print(f"[{spec['name']}] building ...", flush=True)
        s = build_fixture(transformers, spec, args.out, args.seed, args.explicit_hf_config)
        summaries.append(s)
        print(f"[{spec['name']}] {health_report(s)}", flush=True)
        if args.self_check:
            for line in self_check(s):
                print(f"[{spec['name']}] self-check: {line}", flush=True)

    print(f"\nSummary (transformers {transformers.__version__}, torch {torch.__version__}, seed {args.seed})")
    for s in summaries:
        mm = ", ".join(f"{k} {v:.3g}" for k, v in s["min_margins"].items())
        print(f"  {s['name']}: {s['bytes'] / 1024:.0f} KiB, prompts {[len(p['ids']) for p in s['prompts']]}, "
              f"rejected {s['rejected']}, min margins: {mm}")
        print(f"    HF parsed: {s['hf_parsed']}")
        if s["note"]:
            print(f"    NOTE: {s['note']}")
        if s["unexpected"]:
            print(f"    HF unexpected keys (MTP layer, ignored): {len(s['unexpected'])}")
        for r in s["reasons"]:
            print(f"    rejected: {r}")
    total = dir_bytes(args.out)
    print(f"  total under {args.out}: {total / 1e6:.2f} MB")
    digest = hashlib.sha256()
    for d, _, fs in sorted(os.walk(args.out)):
        for f in sorted(fs):
            with open(os.path.join(d, f), "rb") as fh:
                digest.update(f.encode() + fh.read())
    print(f"  sha256 of all fixture files: {digest.hexdigest()}")


if __name__ == "__main__":
    main()
