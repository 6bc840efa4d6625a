"""GLM-MoE-DSA (glm_moe_dsa) in plain PyTorch: exactly the math of docs/semantics.md, for training.

Parameter names follow the checkpoint (export.py maps them; the only difference is that the routed
experts are stored fused here as experts.{gate,up,down}_proj [E, ., .] and split per expert on export).

Per layer (pre-norm): u = RMSNorm_in(h); h += MLA(u); h += FFN(RMSNorm_post(h)); logits = lm_head(norm(h)).
  MLA: c_q = RMSNorm(q_a_proj u); q = q_b_proj c_q = per head [nope | rope]; kv_a_proj_with_mqa u =
       [c_kv | k_pe]; c_kv = RMSNorm(c_kv); kv_b_proj c_kv = per head [k_nope | v]; interleaved RoPE on
       q_pe / k_pe; softmax scale (qk_nope + qk_rope)^-1/2; every RMSNorm uses rms_norm_eps.
  Indexer ("full" layers): qI = wq_b c_q per head [rope | nope] (rope FIRST), kI = LayerNorm(wk u)
       (eps 1e-6, weight + bias) with RoPE on its first qk_rope dims, w = weights_proj u,
       score[t, s] = sum_j w_j H^-1/2 relu(d^-1/2 qI_tj . kI_s) for s <= t; TopK in the total order
       (score descending, position ascending) via a stable sort; "shared" layers reuse the last full
       layer's selection. Computed in fp32 (autocast off).
  MoE (noaux_tc): router logits in fp32, s = sigmoid, selection on s + e_score_correction_bias (ties:
       lower expert id first), weights = s[picked] / sum * routed_scaling_factor, SwiGLU experts plus
       the shared expert.
  MTP (layer index num_hidden_layers): x = eh_proj([enorm(embed(t_{i+1})) ; hnorm(h_i)]), a full decoder
       layer (own indexer, MoE), shared_head.norm, then the main lm_head.

Attention modes: "dense" attends to every causal key; "sparse" to the indexer's top-k (as the engine).
With kl=True the forward also returns, per full indexer (main layers and the MTP layer), the indexer
scores and the head-summed attention of the layers that use its selection (the KL target).
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def rms_norm(x, weight, eps):
    """RMSNorm in fp32 (HF GlmMoeDsaRMSNorm for fp32 inputs)."""
    xf = x.float()
    return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps))


class RMSNorm(nn.Module):
    """RMSNorm with a learned scale."""

    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return rms_norm(x, self.weight, self.eps)


def rope_tables(dim, theta, positions):
    """cos, sin [T, dim/2] for interleaved RoPE (inv_freq as HF's default rope, fp32)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    freqs = positions[:, None].float() * inv_freq.to(positions.device)[None, :]
    return freqs.cos(), freqs.sin()


def apply_rope(x, cos, sin):
    """Interleaved RoPE: rotate pairs (x[2i], x[2i+1]); the result is laid out [evens' | odds'] (as HF).

    Queries and keys get the same layout, so every dot product equals the interleaved rotation's."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def topk_mask(score, causal, k):
    """Boolean [B, T, T] selection: per row the min(k, t+1) best causal keys, score desc then position asc."""
    allowed = causal.expand(score.shape)
    if k >= score.shape[-1]:
        return allowed
    s = score.masked_fill(~allowed, float("-inf"))
    order = torch.sort(s, dim=-1, descending=True, stable=True).indices[..., :k]
    sel = torch.zeros(s.shape, dtype=torch.bool, device=s.device).scatter_(-1, order, True)
    return sel & allowed


class Indexer(nn.Module):
    """The lightning indexer of a "full" layer."""

    def __init__(self, c):
        super().__init__()
        self.n_heads, self.head_dim, self.rope_dim = c["index_n_heads"], c["index_head_dim"], c["qk_rope_head_dim"]
        self.wq_b = nn.Linear(c["q_lora_rank"], self.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(c["hidden_size"], self.head_dim, bias=False)
        self.k_norm = nn.LayerNorm(self.head_dim, eps=1e-6)
        self.weights_proj = nn.Linear(c["hidden_size"], self.n_heads, bias=False)

    def forward(self, u, cq, cos, sin):
        """Index scores [B, T, T] (fp32; not yet causally masked)."""
        B, T, _ = u.shape
        with torch.autocast(device_type=u.device.type, enabled=False):
            u, cq = u.float(), cq.float()
            q = self.wq_b(cq).view(B, T, self.n_heads, self.head_dim)
            q_rot, q_pass = q.split([self.rope_dim, self.head_dim - self.rope_dim], dim=-1)
            k = self.k_norm(self.wk(u))
            k_rot, k_pass = k.split([self.rope_dim, self.head_dim - self.rope_dim], dim=-1)
            q = torch.cat([apply_rope(q_rot, cos[:, None, :], sin[:, None, :]), q_pass], dim=-1)
            k = torch.cat([apply_rope(k_rot, cos, sin), k_pass], dim=-1)
            qk = torch.matmul(q, k.transpose(-1, -2).unsqueeze(1)) * (self.head_dim ** -0.5)  # [B,T,H,T]
            w = self.weights_proj(u) * (self.n_heads ** -0.5)  # [B,T,H]
            return torch.matmul(w.unsqueeze(-2), F.relu(qk)).squeeze(-2)


class Attention(nn.Module):
    """MLA (expanded form for training) with an optional lightning indexer."""

    def __init__(self, c, full_indexer):
        super().__init__()
        D, H = c["hidden_size"], c["num_attention_heads"]
        self.H, self.dn, self.dr, self.dv = H, c["qk_nope_head_dim"], c["qk_rope_head_dim"], c["v_head_dim"]
        self.kvr = c["kv_lora_rank"]
        eps = c["rms_norm_eps"]
        self.q_a_proj = nn.Linear(D, c["q_lora_rank"], bias=False)
        self.q_a_layernorm = RMSNorm(c["q_lora_rank"], eps)
        self.q_b_proj = nn.Linear(c["q_lora_rank"], H * (self.dn + self.dr), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(D, self.kvr + self.dr, bias=False)
        self.kv_a_layernorm = RMSNorm(self.kvr, eps)
        self.kv_b_proj = nn.Linear(self.kvr, H * (self.dn + self.dv), bias=False)
        self.o_proj = nn.Linear(H * self.dv, D, bias=False)
        self.scale = (self.dn + self.dr) ** -0.5
        self.indexer = Indexer(c) if full_indexer else None

    def q_latent(self, u):
        """c_q = RMSNorm(q_a_proj u) (also the indexer's query input)."""
        return self.q_a_layernorm(self.q_a_proj(u))

    def attend(self, u, cq, cos, sin, allowed):
        """(o_proj output [B,T,D], attention probabilities [B,H,T,T]) over the allowed keys."""
        B, T, _ = u.shape
        q = self.q_b_proj(cq).view(B, T, self.H, self.dn + self.dr).transpose(1, 2)
        q_nope, q_pe = q.split([self.dn, self.dr], dim=-1)
        c_kv, k_pe = self.kv_a_proj_with_mqa(u).split([self.kvr, self.dr], dim=-1)
        c_kv = self.kv_a_layernorm(c_kv)
        q_pe = apply_rope(q_pe, cos, sin)
        k_pe = apply_rope(k_pe.unsqueeze(1), cos, sin)
        kv = self.kv_b_proj(c_kv).view(B, T, self.H, self.dn + self.dv).transpose(1, 2)
        k_nope, v = kv.split([self.dn, self.dv], dim=-1)
        qf = torch.cat([q_nope, q_pe.to(q_nope.dtype)], dim=-1)
        kf = torch.cat([k_nope, k_pe.to(k_nope.dtype).expand(-1, self.H, -1, -1)], dim=-1)
        s = torch.matmul(qf, kf.transpose(-1, -2)) * self.scale
        s = s.masked_fill(~allowed.unsqueeze(1), float("-inf"))
        p = torch.softmax(s, dim=-1, dtype=torch.float32)
        o = torch.matmul(p.to(v.dtype), v).transpose(1, 2).reshape(B, T, self.H * self.dv)
        return self.o_proj(o), p


class MLP(nn.Module):
    """SwiGLU: down(silu(gate x) * up x)."""

    def __init__(self, D, inter):
        super().__init__()
        self.gate_proj = nn.Linear(D, inter, bias=False)
        self.up_proj = nn.Linear(D, inter, bias=False)
        self.down_proj = nn.Linear(inter, D, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Router(nn.Module):
    """noaux_tc router weight (fp32) and the load-balancing bias (a buffer, selection only)."""

    def __init__(self, E, D):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(E, D))
        self.register_buffer("e_score_correction_bias", torch.zeros(E))


class Experts(nn.Module):
    """Routed SwiGLU experts, fused: gate_proj / up_proj [E, I, D], down_proj [E, D, I]."""

    def __init__(self, E, D, inter):
        super().__init__()
        self.gate_proj = nn.Parameter(torch.zeros(E, inter, D))
        self.up_proj = nn.Parameter(torch.zeros(E, inter, D))
        self.down_proj = nn.Parameter(torch.zeros(E, D, inter))


class MoE(nn.Module):
    """Routed experts (top-k of E, sigmoid scores, noaux_tc) plus one shared expert.

    In training mode the forward leaves `stats` = (expert token counts [E] int64, sequence-wise
    balance term) for the trainer (bias update and the optional balance loss)."""

    def __init__(self, c):
        super().__init__()
        D, E, inter = c["hidden_size"], c["n_routed_experts"], c["moe_intermediate_size"]
        self.E, self.K, self.rsf = E, c["num_experts_per_tok"], c["routed_scaling_factor"]
        self.gate = Router(E, D)
        self.experts = Experts(E, D, inter)
        self.shared_experts = MLP(D, inter * c["n_shared_experts"])
        self.stats = None

    def route(self, x):
        """(dense weights [N, E] fp32 with zeros for unpicked experts, picked ids [N, K], sigmoid scores)."""
        with torch.autocast(device_type=x.device.type, enabled=False):
            s = torch.sigmoid(F.linear(x.float(), self.gate.weight.float()))
        choice = s.detach() + self.gate.e_score_correction_bias
        idx = torch.sort(choice, dim=-1, descending=True, stable=True).indices[:, :self.K]
        w = s.gather(1, idx)
        w = w / (w.sum(-1, keepdim=True) + 1e-20) * self.rsf
        return torch.zeros_like(s).scatter(1, idx, w), idx, s

    def forward(self, v):
        B, T, D = v.shape
        x = v.reshape(B * T, D)
        dense_w, idx, s = self.route(x)
        xe = x.unsqueeze(0)
        g = torch.matmul(xe, self.experts.gate_proj.transpose(1, 2))
        u = torch.matmul(xe, self.experts.up_proj.transpose(1, 2))
        o = torch.matmul(F.silu(g) * u, self.experts.down_proj.transpose(1, 2))  # [E, N, D]
        y = (o * dense_w.t().unsqueeze(-1)).sum(0)
        out = y.to(o.dtype).view(B, T, D) + self.shared_experts(v)
        if self.training:
            picked = torch.zeros_like(s, dtype=torch.bool).scatter_(1, idx, True)
            counts = picked.sum(0)
            f = picked.view(B, T, self.E).float().sum(1) * (self.E / (self.K * T))
            p = (s / s.sum(-1, keepdim=True)).view(B, T, self.E).mean(1)
            self.stats = (counts, (f * p).sum(-1).mean())
        return out


class DecoderLayer(nn.Module):
    """Pre-norm decoder layer: MLA (+ indexer on full layers) and a dense MLP or the MoE."""

    def __init__(self, c, full_indexer, moe):
        super().__init__()
        self.self_attn = Attention(c, full_indexer)
        self.mlp = MoE(c) if moe else MLP(c["hidden_size"], c["intermediate_size"])
        self.input_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])


class MTPLayer(nn.Module):
    """The MTP module: enorm, hnorm, eh_proj, a full decoder layer and shared_head.norm."""

    def __init__(self, c):
        super().__init__()
        D, eps = c["hidden_size"], c["rms_norm_eps"]
        self.enorm = RMSNorm(D, eps)
        self.hnorm = RMSNorm(D, eps)
        self.eh_proj = nn.Linear(2 * D, D, bias=False)
        self.layer = DecoderLayer(c, full_indexer=True, moe=True)
        self.shared_head_norm = RMSNorm(D, eps)


class KjvDsaModel(nn.Module):
    """The causal LM plus its MTP layer."""

    def __init__(self, c, dropout=0.0):
        super().__init__()
        self.cfg = dict(c)
        D, V, L = c["hidden_size"], c["vocab_size"], c["num_hidden_layers"]
        self.embed_tokens = nn.Embedding(V, D)
        self.layers = nn.ModuleList([
            DecoderLayer(c, full_indexer=c["indexer_types"][i] == "full", moe=i >= c["first_k_dense_replace"])
            for i in range(L)])
        self.norm = RMSNorm(D, c["rms_norm_eps"])
        self.lm_head = nn.Linear(D, V, bias=False)
        self.mtp = MTPLayer(c)
        self.drop = nn.Dropout(dropout)
        self.topk = c["index_topk"]

    def init_weights(self, generator):
        """Seeded init: linears N(0, 0.02), output projections scaled by (2 (L+1))^-1/2, norms 1."""
        out_std = 0.02 / math.sqrt(2 * (self.cfg["num_hidden_layers"] + 1))
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith("k_norm.bias"):
                    p.zero_()
                elif p.dim() == 1:
                    p.fill_(1.0)
                elif name.endswith(("o_proj.weight", "down_proj.weight", "experts.down_proj")):
                    p.normal_(0.0, out_std, generator=generator)
                else:
                    p.normal_(0.0, 0.02, generator=generator)
            for m in self.modules():
                if isinstance(m, Router):
                    m.e_score_correction_bias.zero_()

    def indexers(self):
        """All indexer modules (main full layers, then the MTP layer's)."""
        return [l.self_attn.indexer for l in list(self.layers) + [self.mtp.layer] if l.self_attn.indexer is not None]

    def moes(self):
        """All MoE modules (main layers, then the MTP layer's)."""
        return [l.mlp for l in list(self.layers) + [self.mtp.layer] if isinstance(l.mlp, MoE)]

    def _stack(self, x, layers, mode, kl):
        """Run decoder layers; returns (x, KL groups). Indexer inputs are detached from the LM graph."""
        T = x.shape[1]
        pos = torch.arange(T, device=x.device)
        cos, sin = rope_tables(self.cfg["qk_rope_head_dim"], self.cfg["rope_theta"], pos)
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril().unsqueeze(0)
        sel, group, groups = None, None, []
        for layer in layers:
            attn = layer.self_attn
            u = layer.input_layernorm(x)
            cq = attn.q_latent(u)
            if attn.indexer is not None and (mode == "sparse" or kl):
                score = attn.indexer(u.detach(), cq.detach(), cos, sin)
                if mode == "sparse":
                    sel = topk_mask(score.detach(), causal, self.topk)
                group = {"score": score, "allowed": sel if mode == "sparse" else causal, "p": None}
                groups.append(group)
            allowed = sel if mode == "sparse" else causal
            out, p = attn.attend(u, cq, cos, sin, allowed)
            if kl:
                ph = p.detach().sum(1)
                group["p"] = ph if group["p"] is None else group["p"] + ph
            x = x + self.drop(out)
            x = x + self.drop(layer.mlp(layer.post_attention_layernorm(x)))
        return x, groups

    def mtp_input(self, h, next_ids):
        """eh_proj([enorm(embed(t_{i+1})) ; hnorm(h_i)]) (embedding first)."""
        e = self.mtp.enorm(self.embed_tokens(next_ids))
        return self.mtp.eh_proj(torch.cat([e, self.mtp.hnorm(h)], dim=-1))

    def mtp_hidden(self, x, mode, kl=False):
        """shared_head.norm(MTP decoder layer(x)) at positions 0..M-1; returns (hidden, KL groups)."""
        y, groups = self._stack(x, [self.mtp.layer], mode, kl)
        return self.mtp.shared_head_norm(y), groups

    def forward(self, ids, mode="dense", next_ids=None, kl=False, with_logits=True):
        """Main model on ids [B, T]; MTP rows 0..M-1 when next_ids [B, M] (M <= T) is given.

        Returns a dict: h (after the final norm), logits, mtp_h / mtp_logits, groups (KL groups)."""
        if mode not in ("dense", "sparse"):
            raise ValueError(mode)
        x = self.drop(self.embed_tokens(ids))
        x, groups = self._stack(x, self.layers, mode, kl)
        h = self.norm(x)
        out = {"h": h, "groups": groups}
        if with_logits:
            out["logits"] = self.lm_head(h)
        if next_ids is not None:
            M = next_ids.shape[1]
            mh, mgroups = self.mtp_hidden(self.mtp_input(h[:, :M], next_ids), mode, kl)
            out["mtp_h"] = mh
            out["mtp_logits"] = self.lm_head(mh)
            out["groups"] = groups + mgroups
        return out


def indexer_kl(group):
    """Mean over query rows of KL(p || q): p = the group's head-summed attention, L1-normalised (detached);
    q = softmax of the indexer scores over the allowed keys (causal keys, or the selected ones)."""
    allowed = group["allowed"].expand(group["score"].shape)
    logq = torch.log_softmax(group["score"].masked_fill(~allowed, float("-inf")), dim=-1)
    p = group["p"] / group["p"].sum(-1, keepdim=True)
    kl = torch.xlogy(p, p) - p * logq.masked_fill(~allowed, 0.0)
    return kl.sum(-1).mean()


def cross_entropy(logits, targets):
    """Token-mean cross entropy in fp32 (logsumexp - gathered logit; deterministic on CUDA)."""
    lf = logits.float().reshape(-1, logits.shape[-1])
    t = targets.reshape(-1, 1)
    return (torch.logsumexp(lf, dim=-1) - lf.gather(1, t).squeeze(1)).mean()


def parameter_counts(model):
    """Parameter counts: total, per component, and active per token (routed experts: top-k of E)."""
    c = model.cfg
    total = sum(p.numel() for p in model.parameters())
    emb = model.embed_tokens.weight.numel()
    head = model.lm_head.weight.numel()
    mtp = sum(p.numel() for p in model.mtp.parameters())
    idx = sum(p.numel() for i in model.indexers() for p in i.parameters())
    routed = sum(m.experts.gate_proj.numel() * 3 for m in model.moes())
    active = total - routed + routed * c["num_experts_per_tok"] // c["n_routed_experts"]
    return {"total": total, "embed_tokens": emb, "lm_head": head, "mtp_layer": mtp, "indexers": idx,
            "routed_experts": routed, "active_per_token": active, "main_model_without_mtp": total - mtp}
