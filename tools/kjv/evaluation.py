"""Evaluation of an exported checkpoint (bf16 weights loaded as fp32, no autocast).

Held-out perplexity: heldout.npy is cut into consecutive non-overlapping windows of seq_len tokens
(the last one shorter); each window is evaluated from scratch; inside a window token k (k >= 1) is
predicted from tokens 0..k-1, so every token except the first of each window is scored once. Done
with dense attention and with top-k attention (the model as the engine runs it). The MTP head is
scored in the same windows (top-k mode): row i predicts token i+2 from h_i and token i+1.

MTP acceptance (greedy speculative decoding, top-k attention everywhere; see measure_acceptance).
"""

import math

import torch

from . import data as kdata


@torch.no_grad()
def heldout_scores(model, tokens, seq_len, mode, batch_size=8):
    """Token-level CE / perplexity / top-1 accuracy of the main head, and of the MTP head."""
    wins = kdata.heldout_windows(tokens, seq_len)
    groups, cur = [], []
    for a, b in wins:
        if cur and (b - a != cur[0][1] - cur[0][0] or len(cur) == batch_size):
            groups.append(cur)
            cur = []
        cur.append((a, b))
    if cur:
        groups.append(cur)
    nll = mtp_nll = 0.0
    n = mtp_n = correct = mtp_correct = 0
    for g in groups:
        x = torch.stack([tokens[a:b] for a, b in g])
        out = model(x, mode=mode, next_ids=x[:, 1:-1])
        lf = out["logits"][:, :-1].float()
        tgt = x[:, 1:]
        tok_nll = torch.logsumexp(lf, -1) - lf.gather(-1, tgt[..., None]).squeeze(-1)
        nll += float(tok_nll.double().sum())
        n += tgt.numel()
        correct += int((lf.argmax(-1) == tgt).sum())
        mf = out["mtp_logits"].float()
        mt = x[:, 2:]
        m_nll = torch.logsumexp(mf, -1) - mf.gather(-1, mt[..., None]).squeeze(-1)
        mtp_nll += float(m_nll.double().sum())
        mtp_n += mt.numel()
        mtp_correct += int((mf.argmax(-1) == mt).sum())
    return {
        "mode": mode, "windows": len(wins), "tokens_scored": n,
        "ce": nll / n, "ppl": math.exp(nll / n), "top1_acc": correct / n,
        "mtp_tokens_scored": mtp_n, "mtp_ce": mtp_nll / mtp_n, "mtp_ppl": math.exp(mtp_nll / mtp_n),
        "mtp_top1_acc": mtp_correct / mtp_n,
    }


@torch.no_grad()
def greedy_generate(model, prompts, n_new, mode):
    """Greedy continuation (argmax, lowest id on ties) of equal-length prompts, recomputed without cache."""
    seq = prompts
    for _ in range(n_new):
        logits = model(seq, mode=mode)["logits"][:, -1]
        seq = torch.cat([seq, logits.argmax(-1, keepdim=True)], dim=1)
    return seq


@torch.no_grad()
def measure_acceptance(model, tokens, eos_id, n_prompts=32, prompt_len=64, n_gen=64, k_draft=3, mode="sparse"):
    """Per-position MTP acceptance of greedy speculative decoding with K chained drafts.

    1. P prompts of prompt_len tokens start at offsets floor(j (N - prompt_len) / P) of heldout.npy.
    2. The target greedily generates n_gen + K tokens (top-k attention); greedy speculative decoding
       emits exactly this sequence y, so the target's choice at position p is y[p+1].
    3. The target's hidden states h (after the final norm) come from one forward over y. The MTP layer's
       cache before a round starting at position i holds the teacher-forced rows p = 0..i, each
       x_p = eh_proj([enorm(embed(y[p+1])) ; hnorm(h_p)]) at position p.
    4. Round at i (h_i and t_{i+1} = y[i+1] known): draft 1 = argmax head(g_1) with g_1 the MTP layer's
       shared_head.norm output at row i; draft j+1 appends x = eh_proj([enorm(embed(draft j)) ; hnorm(g_j)])
       at position i+j and takes the new row's output g_{j+1}. Draft j is accepted iff drafts 1..j-1
       were and draft j == y[i+1+j]. With a accepted, the round emits a + 1 tokens and the next round
       starts at i + a + 1.
    5. Rounds start at i = prompt_len - 1 (after the prefill emitted y[prompt_len]) and continue while
       fewer than n_gen tokens were emitted and no <|endoftext|> was emitted.
    Reports accepted_j / rounds per position j, accepted / drafted, and 1 + accepted / rounds.
    """
    n = tokens.numel()
    n0 = prompt_len
    starts = [j * (n - prompt_len) // n_prompts for j in range(n_prompts)]
    prompts = torch.stack([tokens[s:s + prompt_len] for s in starts])
    seq = greedy_generate(model, prompts, n_gen + k_draft, mode)
    N = seq.shape[1]
    out = model(seq, mode=mode)
    h = out["h"]
    consistent = float((out["logits"][:, n0 - 1:-1].argmax(-1) == seq[:, n0:]).float().mean())
    x_tf = model.mtp_input(h[:, :N - 1], seq[:, 1:N])  # row p: (h_p, y[p+1])
    g_all, _ = model.mtp_hidden(x_tf, mode)
    d_all = model.lm_head(g_all).argmax(-1)  # [P, N-1]
    last_start = n0 + n_gen - 3
    drafts = {}
    for i in range(n0 - 1, last_start + 1):
        d, g = d_all[:, i], g_all[:, i]
        ds = [d]
        xs = x_tf[:, :i + 1]
        for _ in range(1, k_draft):
            xs = torch.cat([xs, model.mtp_input(g[:, None], d[:, None])], dim=1)
            gs, _ = model.mtp_hidden(xs, mode)
            g = gs[:, -1]
            d = model.lm_head(g).argmax(-1)
            ds.append(d)
        drafts[i] = torch.stack(ds, dim=1).cpu()
    y = seq.cpu()
    rounds, accepted = 0, [0] * k_draft
    for b in range(n_prompts):
        if int(y[b, n0]) == eos_id:
            continue
        i, emitted = n0 - 1, 1
        while emitted < n_gen:
            a = 0
            while a < k_draft and int(drafts[i][b, a]) == int(y[b, i + 2 + a]):
                a += 1
            rounds += 1
            for j in range(a):
                accepted[j] += 1
            new = y[b, i + 2:i + a + 3]
            emitted += a + 1
            i += a + 1
            if bool((new == eos_id).any()):
                break
    total = sum(accepted)
    return {
        "prompts": n_prompts, "prompt_len": prompt_len, "generated": n_gen, "k_draft": k_draft, "mode": mode,
        "rounds": rounds, "drafted": rounds * k_draft, "accepted": total,
        "per_position_acceptance": [a / max(rounds, 1) for a in accepted],
        "draft_acceptance_rate": total / max(rounds * k_draft, 1),
        "mean_acceptance_length": 1.0 + total / max(rounds, 1),
        "greedy_recompute_consistency": consistent,
        "sample_continuation_ids": y[0, n0:n0 + n_gen].tolist(),
        "sample_prompt_ids": y[0, :n0].tolist(),
    }


def evaluate(model, tokens, seq_len, eos_id, tokenizer=None, tiny=False):
    """All held-out numbers for a loaded (fp32, eval-mode) model."""
    res = {
        "heldout_dense": heldout_scores(model, tokens, seq_len, "dense"),
        "heldout_topk": heldout_scores(model, tokens, seq_len, "sparse"),
    }
    if tiny:
        acc = measure_acceptance(model, tokens, eos_id, n_prompts=4, prompt_len=16, n_gen=16)
    else:
        acc = measure_acceptance(model, tokens, eos_id)
    if tokenizer is not None:
        acc["sample_prompt"] = tokenizer.decode(acc["sample_prompt_ids"], skip_special_tokens=False)
        acc["sample_continuation"] = tokenizer.decode(acc["sample_continuation_ids"], skip_special_tokens=False)
    res["mtp_acceptance"] = acc
    return res
