"""Exactness self-check: the exported checkpoint run by Hugging Face transformers vs this code.

HF (GlmMoeDsaForCausalLM, fp32, eager attention) loads the exported directory with two run-time
corrections that docs/semantics.md makes (nothing in site-packages is edited):
  a) q_a_layernorm / kv_a_layernorm get variance_epsilon = rms_norm_eps (HF builds them with 1e-6);
  b) while HF runs, torch.topk / Tensor.topk return the first k of a stable descending sort, i.e. the
     total order score descending then position (or expert id) ascending, for the indexer's top-k
     and the router's expert choice alike (HF's own topk leaves the order of ties unspecified).
The main logits on one held-out window are compared with this code's top-k-mode logits. The MTP layer
(which HF does not run) is checked too: HF's own decoder-layer class is built for index L and fed
eh_proj([enorm(embed(t_{i+1})) ; hnorm(h_i)]) with HF's RMSNorm class; its shared_head.norm -> lm_head
rows are compared with this code's MTP logits.
"""

import contextlib
import copy

import torch
import torch.nn.functional as F

from .export import read_checkpoint_tensors


@contextlib.contextmanager
def stable_topk():
    """Temporarily make torch.topk / Tensor.topk (largest=True) follow the defined total order."""
    orig_fn, orig_method = torch.topk, torch.Tensor.topk

    def topk(input, k, dim=-1, largest=True, sorted=True, *, out=None):
        if not largest or out is not None:
            return orig_fn(input, k, dim=dim, largest=largest, sorted=sorted)
        s = torch.sort(input, dim=dim, descending=True, stable=True)
        return torch.return_types.topk((s.values.narrow(dim, 0, k), s.indices.narrow(dim, 0, k)))

    def method(self, k, dim=-1, largest=True, sorted=True):
        return topk(self, k, dim=dim, largest=largest, sorted=sorted)

    torch.topk, torch.Tensor.topk = topk, method
    try:
        yield
    finally:
        torch.topk, torch.Tensor.topk = orig_fn, orig_method


def _fix_eps(module, eps):
    n = 0
    for name, m in module.named_modules():
        if name.endswith(("q_a_layernorm", "kv_a_layernorm")):
            m.variance_epsilon = eps
            n += 1
    return n


def _compare(ref, got):
    d = (ref.double() - got.double())
    return {"max_abs_diff": float(d.abs().max()),
            "nmse": float((d ** 2).mean() / (ref.double() ** 2).mean()),
            "argmax_agreement": float((ref.argmax(-1) == got.argmax(-1)).double().mean())}


def _hf_mtp_logits(hf, model_dir, cfg, ids, h, device):
    """HF's decoder-layer class as the MTP layer (index L), teacher-forced rows 0..n-2."""
    L = cfg["num_hidden_layers"]
    c2 = copy.deepcopy(hf.config)
    c2.num_hidden_layers = L + 1
    c2.mlp_layer_types = list(c2.mlp_layer_types) + ["sparse"]
    c2.indexer_types = list(c2.indexer_types) + ["full"]
    if getattr(c2, "layer_types", None) is not None:
        c2.layer_types = list(c2.layer_types) + [c2.layer_types[-1]]
    layer = type(hf.model.layers[0])(c2, L)
    tensors = {k: v.float() for k, v in read_checkpoint_tensors(model_dir).items()}
    pre = f"model.layers.{L}."
    state = {}
    for key, ref in layer.state_dict().items():
        if pre + key in tensors:
            state[key] = tensors[pre + key]
        elif key.endswith("experts.gate_up_proj"):
            base = pre + key[: -len("gate_up_proj")]
            state[key] = torch.stack([torch.cat([tensors[f"{base}{e}.gate_proj.weight"],
                                                 tensors[f"{base}{e}.up_proj.weight"]], 0)
                                      for e in range(ref.shape[0])])
        elif key.endswith("experts.down_proj"):
            base = pre + key[: -len("down_proj")]
            state[key] = torch.stack([tensors[f"{base}{e}.down_proj.weight"] for e in range(ref.shape[0])])
        else:
            raise KeyError(f"no checkpoint tensor for HF MTP layer parameter {key}")
    layer.load_state_dict(state, strict=True)
    _fix_eps(layer, cfg["rms_norm_eps"])
    layer.to(device).float().eval()
    norm_cls = type(hf.model.norm)

    def norm(name):
        n = norm_cls(cfg["hidden_size"], eps=cfg["rms_norm_eps"])
        n.weight.data.copy_(tensors[pre + name])
        return n.to(device).float().eval()

    enorm, hnorm, head_norm = norm("enorm.weight"), norm("hnorm.weight"), norm("shared_head.norm.weight")
    n = ids.shape[1]
    e = enorm(F.embedding(ids[:, 1:], hf.model.embed_tokens.weight))
    x = F.linear(torch.cat([e, hnorm(h[:, : n - 1])], dim=-1), tensors[pre + "eh_proj.weight"].to(device))
    pos = torch.arange(n - 1, device=device)[None]
    pe = hf.model.rotary_emb(x, pos)
    mask = torch.full((n - 1, n - 1), torch.finfo(torch.float32).min, device=device).triu(1)[None, None]
    y = layer(x, attention_mask=mask, position_ids=pos, position_embeddings=pe)
    if isinstance(y, tuple):
        y = y[0]
    return hf.lm_head(head_norm(y))


@torch.no_grad()
def hf_self_check(model_dir, model, cfg, window, device):
    """Compare HF's logits (and MTP logits) with this code's top-k mode on one window; returns a dict."""
    try:
        import transformers
    except ImportError as exc:
        return {"status": "skipped", "reason": f"transformers not importable: {exc}"}
    res = {"transformers_version": transformers.__version__, "window_tokens": int(window.numel())}
    try:
        transformers.logging.set_verbosity_error()
        transformers.utils.logging.disable_progress_bar()
        kwargs = dict(dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
        try:  # the plain per-expert loop, not grouped_mm (older versions lack the switch)
            hf, info = transformers.GlmMoeDsaForCausalLM.from_pretrained(
                model_dir, experts_implementation="eager", **kwargs)
        except (TypeError, ValueError):
            hf, info = transformers.GlmMoeDsaForCausalLM.from_pretrained(model_dir, **kwargs)
        res["hf_experts_implementation"] = str(getattr(hf.config, "_experts_implementation", None))
        res["hf_attn_implementation"] = str(getattr(hf.config, "_attn_implementation", None))
        res["hf_missing_keys"] = sorted(info.get("missing_keys", []))
        res["hf_unexpected_keys_outside_mtp"] = sorted(
            k for k in info.get("unexpected_keys", []) if not k.startswith(f"model.layers.{cfg['num_hidden_layers']}."))
        res["eps_fixed_norms"] = _fix_eps(hf, cfg["rms_norm_eps"])
        hf.to(device).eval()
        ids = window[None].to(device)
        with stable_topk():
            hf_h = hf.model(input_ids=ids, use_cache=False).last_hidden_state
            hf_logits = hf.lm_head(hf_h)[0]
        mine = model(ids, mode="sparse", next_ids=ids[:, 1:])
        res["main_logits"] = _compare(hf_logits, mine["logits"][0])
        res["main_hidden"] = _compare(hf_h[0], mine["h"][0])
        try:
            with stable_topk():
                hf_mtp = _hf_mtp_logits(hf, model_dir, cfg, ids, hf_h, device)[0]
            res["mtp_logits"] = _compare(hf_mtp, mine["mtp_logits"][0])
        except Exception as exc:  # the MTP check relies on HF internals that may change between versions
            res["mtp_logits"] = {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
        ok = (not res["hf_missing_keys"] and not res["hf_unexpected_keys_outside_mtp"]
              and res["main_logits"]["nmse"] < 1e-8 and res["main_logits"]["max_abs_diff"] < 1e-2)
        res["status"] = "match" if ok else "MISMATCH"
    except Exception as exc:
        res["status"] = "error"
        res["error"] = f"{type(exc).__name__}: {exc}"
    return res


@torch.no_grad()
def engine_check(engine, model_dir, model, window, device):
    """Optional: `dsinfer logits` (CPU backend) on the same window vs this code's top-k logits and MTP logits."""
    import os
    import subprocess
    import tempfile

    import numpy as np
    res = {"engine": engine}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            out, mtp = os.path.join(tmp, "logits.npy"), os.path.join(tmp, "mtp.npy")
            ids = ",".join(str(int(t)) for t in window.tolist())
            proc = subprocess.run([engine, "logits", "--model", model_dir, "--prompt-ids", ids, "--out", out,
                                   "--mtp-out", mtp], capture_output=True, text=True)
            if proc.returncode != 0:
                return dict(res, status="error", error=(proc.stderr or proc.stdout).strip()[-500:])
            e_logits = torch.from_numpy(np.load(out)).to(device)
            e_mtp = torch.from_numpy(np.load(mtp)).to(device)
        ids_t = window[None].to(device)
        mine = model(ids_t, mode="sparse", next_ids=ids_t[:, 1:])
        res["main_logits"] = _compare(e_logits, mine["logits"][0])
        res["mtp_logits"] = _compare(e_mtp, mine["mtp_logits"][0])
        ok = all(res[k]["nmse"] < 1e-8 and res[k]["max_abs_diff"] < 1e-2 for k in ("main_logits", "mtp_logits"))
        res["status"] = "match" if ok else "MISMATCH"
    except Exception as exc:
        res.update(status="error", error=f"{type(exc).__name__}: {exc}")
    return res
