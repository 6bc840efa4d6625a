"""The checkpoint on disk (HF layout) and loading it back.

Tensors are stored bf16 except the routers' e_score_correction_bias (fp32), like the released GLM /
DeepSeek checkpoints and tests/fixtures/glm_tiny. Names: model.embed_tokens.weight, model.layers.{i}.*,
model.norm.weight, lm_head.weight; routed experts one by one as mlp.experts.{e}.{gate,up,down}_proj.weight;
the MTP layer is model.layers.{L}.* plus enorm, hnorm, eh_proj and shared_head.norm (no separate
embed_tokens / shared_head.head: the engine and HF-style loaders fall back to the main ones).
Shards model-0000k-of-0000n.safetensors hold at most SHARD_BYTES of tensor data each, filled in sorted
name order, with model.safetensors.index.json.
"""

import json
import os
import shutil

import torch
from safetensors.torch import load_file, save_file

from . import config as kconfig
from .model import KjvDsaModel

SHARD_BYTES = 12 * 1000 * 1000
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
_EXPERT_PARTS = ("gate_proj", "up_proj", "down_proj")


def _ckpt_prefix(name, L):
    """Map a module-path prefix of this code to the checkpoint's (None: keep the name after 'model.')."""
    if name.startswith("mtp.layer."):
        return f"model.layers.{L}." + name[len("mtp.layer."):]
    if name.startswith("mtp.shared_head_norm."):
        return f"model.layers.{L}.shared_head.norm." + name[len("mtp.shared_head_norm."):]
    if name.startswith("mtp."):
        return f"model.layers.{L}." + name[len("mtp."):]
    if name.startswith("lm_head."):
        return name
    return "model." + name


def checkpoint_tensors(model):
    """{checkpoint name: CPU tensor} in storage dtype (bf16; fp32 for e_score_correction_bias)."""
    L = model.cfg["num_hidden_layers"]
    out = {}
    for name, t in model.state_dict().items():
        t = t.detach().cpu()
        ck = _ckpt_prefix(name, L)
        parts = ck.split(".")
        if len(parts) >= 2 and parts[-2] == "experts" and parts[-1] in _EXPERT_PARTS:
            base = ".".join(parts[:-1])
            for e in range(t.shape[0]):
                out[f"{base}.{e}.{parts[-1]}.weight"] = t[e].to(torch.bfloat16).contiguous()
        elif ck.endswith("e_score_correction_bias"):
            out[ck] = t.float().contiguous()
        else:
            out[ck] = t.to(torch.bfloat16).contiguous()
    return out


def model_state_from_checkpoint(tensors, model):
    """Inverse of checkpoint_tensors for `model`'s names and shapes: {state_dict name: fp32 tensor}."""
    L = model.cfg["num_hidden_layers"]
    want = model.state_dict()
    state = {}
    for name, ref in want.items():
        ck = _ckpt_prefix(name, L)
        parts = ck.split(".")
        if len(parts) >= 2 and parts[-2] == "experts" and parts[-1] in _EXPERT_PARTS:
            base = ".".join(parts[:-1])
            state[name] = torch.stack([tensors[f"{base}.{e}.{parts[-1]}.weight"].float()
                                       for e in range(ref.shape[0])])
        else:
            state[name] = tensors[ck].float()
        if state[name].shape != ref.shape:
            raise ValueError(f"{ck}: shape {tuple(state[name].shape)} != {tuple(ref.shape)}")
    return state


def write_checkpoint(model, out_dir, data_dir):
    """config.json, shards + index, tokenizer files, generation_config.json. Returns the file list."""
    os.makedirs(out_dir, exist_ok=True)
    cfg = model.cfg
    with open(os.path.join(out_dir, "config.json"), "w", encoding="utf-8") as f:
        json.dump(kconfig.hf_config_json(cfg), f, indent=2)
        f.write("\n")
    tensors = checkpoint_tensors(model)
    shards, cur, size = [], {}, 0
    for name in sorted(tensors):
        nbytes = tensors[name].numel() * tensors[name].element_size()
        if cur and size + nbytes > SHARD_BYTES:
            shards.append(cur)
            cur, size = {}, 0
        cur[name] = tensors[name]
        size += nbytes
    if cur:
        shards.append(cur)
    weight_map, total = {}, 0
    for k, shard in enumerate(shards):
        fn = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, os.path.join(out_dir, fn), metadata={"format": "pt"})
        os.chmod(os.path.join(out_dir, fn), 0o644)
        for name, t in shard.items():
            weight_map[name] = fn
            total += t.numel() * t.element_size()
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w", encoding="utf-8") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)
        f.write("\n")
    for fn in TOKENIZER_FILES:
        shutil.copyfile(os.path.join(data_dir, fn), os.path.join(out_dir, fn))
    eos = cfg["eos_token_id"]
    gen = {"bos_token_id": None, "eos_token_id": [eos], "pad_token_id": eos, "do_sample": False,
           "max_new_tokens": 256}
    with open(os.path.join(out_dir, "generation_config.json"), "w", encoding="utf-8") as f:
        json.dump(gen, f, indent=2)
        f.write("\n")
    return {"shards": [f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors" for k in range(len(shards))],
            "tensor_bytes": total, "tensors": len(weight_map)}


def read_checkpoint_tensors(model_dir):
    """All tensors of a sharded (or single-file) checkpoint, as stored."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index, encoding="utf-8") as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    tensors = {}
    for fn in files:
        tensors.update(load_file(os.path.join(model_dir, fn)))
    return tensors


def load_model(model_dir, device):
    """Build the model from config.json and the safetensors (stored weights as fp32), eval mode."""
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        cfg = kconfig.from_hf_config_json(json.load(f))
    with torch.random.fork_rng(devices=[]):  # the throwaway default init must not touch the global RNG
        model = KjvDsaModel(cfg)
    tensors = read_checkpoint_tensors(model_dir)
    state = model_state_from_checkpoint(tensors, model)
    expected = set(checkpoint_tensors(model).keys())
    extra = sorted(set(tensors) - expected)
    if extra:
        raise ValueError(f"{model_dir}: unexpected tensors {extra[:5]}")
    model.load_state_dict(state, strict=True)
    model.to(device).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model, cfg
