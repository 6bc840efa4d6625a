"""The model card (MODEL_DIR/README.md), written from the config, the data info and eval.json."""

import os

from .training import FRACTIONS


def _f(x, nd=4):
    return f"{x:.{nd}f}" if isinstance(x, float) else str(x)


def write_card(out_dir, cfg, seq_len, data_info, report):
    """Write README.md."""
    ev = report["eval"]
    d, s, acc, hf = ev["heldout_dense"], ev["heldout_topk"], ev["mtp_acceptance"], ev["hf_check"]
    pc = report["parameters"]
    hp = report["hyper"]
    L = cfg["num_hidden_layers"]
    stages = {x["stage"]: x for x in report["stages"]}
    tiny = report["settings"]["tiny"]
    lines = [
        "---",
        "language: en",
        "library_name: dsinfer",
        "tags: [glm_moe_dsa, deepseek-sparse-attention, mla, moe, mtp, toy-model]",
        "---",
        "",
        f"# kjv-dsa{'-tiny' if tiny else ''}: a small GLM-MoE-DSA model trained on the King James Bible",
        "",
        "A deliberately small model with the full GLM-5 (`glm_moe_dsa`) architecture, so that dsinfer can be "
        "run and tested end to end on a real trained checkpoint: MLA attention, the lightning indexer with "
        "top-k sparse attention (including \"shared\" indexer layers), a noaux_tc MoE with a shared expert, "
        "and one MTP layer for speculative decoding. It writes King-James-style verses; it knows nothing else.",
        "The chat template exists for format tests only: the model never saw chat data.",
        "",
        "## Architecture",
        "",
        "| field | value |", "|---|---|",
        f"| vocab / hidden / layers | {cfg['vocab_size']} / {cfg['hidden_size']} / {L} (+1 MTP layer at index {L}) |",
        f"| heads, q_lora / kv_lora | {cfg['num_attention_heads']}, {cfg['q_lora_rank']} / {cfg['kv_lora_rank']} |",
        f"| qk_nope / qk_rope / v_head | {cfg['qk_nope_head_dim']} / {cfg['qk_rope_head_dim']} / {cfg['v_head_dim']} |",
        f"| indexer heads x dim, top-k | {cfg['index_n_heads']} x {cfg['index_head_dim']}, {cfg['index_topk']} "
        f"(training context {seq_len}) |",
        f"| indexer_types | {cfg['indexer_types']} (MTP layer: own indexer) |",
        f"| dense layers / MoE | first {cfg['first_k_dense_replace']} dense (intermediate {cfg['intermediate_size']}); "
        f"{cfg['n_routed_experts']} routed experts top-{cfg['num_experts_per_tok']} + {cfg['n_shared_experts']} shared, "
        f"moe_intermediate {cfg['moe_intermediate_size']}, routed_scaling_factor {cfg['routed_scaling_factor']}, n_group 1 |",
        f"| RoPE | default, theta {cfg['rope_theta']:g}, interleaved (indexer: rope dims first) |",
        f"| rms_norm_eps / max positions | {cfg['rms_norm_eps']} / {cfg['max_position_embeddings']} |",
        f"| eos | <\\|endoftext\\|> = {cfg['eos_token_id']}; untied lm_head |",
        "",
        f"Parameters: {pc['total']:,} in total ({pc['main_model_without_mtp']:,} without the MTP layer; "
        f"{pc['active_per_token']:,} active per token; embeddings {pc['embed_tokens']:,}, lm_head {pc['lm_head']:,}, "
        f"indexers {pc['indexers']:,}, routed experts {pc['routed_experts']:,}). Stored as bf16 "
        f"({report['checkpoint']['tensor_bytes'] / 1e6:.1f} MB of tensors in {len(report['checkpoint']['shards'])} shards), "
        "except the routers' e_score_correction_bias (fp32).",
        "",
        "## Data and tokenizer",
        "",
        f"- Text: {data_info['source']}; {data_info['verses']} verses, {data_info['chapters']} chapters.",
        f"- Documents: {data_info['document']}.",
        f"- Split: {data_info['split_rule']} ({data_info['heldout']['documents']} held-out chapters, "
        f"{data_info['heldout']['tokens']:,} tokens; training {data_info['train']['documents']} chapters, "
        f"{data_info['train']['tokens']:,} tokens).",
        "- Tokenizer: byte-level BPE (HF tokenizers) trained on the training split only; "
        f"{data_info['vocab_size']} tokens: 256 bytes, {data_info['vocab_size'] - 262} merges, then the special tokens "
        "<|endoftext|>, [gMASK], <sop>, <|system|>, <|user|>, <|assistant|>. Pre-tokenizer as in the GLM / "
        "DeepSeek tokenizer.json files (cl100k-style Split regex, then ByteLevel without prefix space).",
        "- Chat template (GLM-style): `[gMASK]<sop>` then `<|role|>\\n` + content per message; generation prompt "
        "`<|assistant|>\\n`.",
        "",
        "## Training",
        "",
        f"Device: {report['device']}, torch {report['torch_version']}. Seed {report['seed']}; "
        "`torch.use_deterministic_algorithms(True)`, CUBLAS_WORKSPACE_CONFIG=:4096:8; bf16 autocast on CUDA "
        "(router logits, indexer and losses in fp32), fp32 master weights. Batches: "
        f"{hp['batch_size']} windows of {seq_len} (+2) tokens at seeded random offsets of train.npy "
        f"({hp['batch_size'] * seq_len:,} tokens per step).",
        "",
        "| stage | what trains | attention | loss | steps | seconds | tokens |", "|---|---|---|---|---|---|---|",
    ]
    desc = {
        "dense": ("everything but the indexers", "all causal keys",
                  f"CE + {hp['mtp_lambda']} MTP CE + {hp['balance_alpha']:g} balance"),
        "warmup": ("indexers only (main model frozen)", "all causal keys", "KL(attention || indexer)"),
        "sparse": ("everything", f"indexer top-{cfg['index_topk']}",
                   f"CE + {hp['mtp_lambda']} MTP CE + {hp['balance_alpha']:g} balance + KL on selected keys"),
    }
    for name in ("dense", "warmup", "sparse"):
        st = stages.get(name, {})
        trunc = " (stopped early by the time guard)" if st.get("truncated") else ""
        lines.append(f"| {name} | {desc[name][0]} | {desc[name][1]} | {desc[name][2]} | {st.get('steps')}{trunc} | "
                     f"{st.get('seconds')} | {st.get('tokens', 0):,} |")
    plan_src = report["plan"]
    lines += [
        "",
        f"Stage budget fractions {FRACTIONS} of --time-budget {report['time_budget_s']:g} s; step plan {plan_src} "
        "(train_log.jsonl records how it was chosen; `--steps a,b,c` reproduces a run exactly).",
        "",
        "- Stage 1, dense pre-training: next-token CE plus the MTP loss (the MTP layer predicts t_{i+2} from "
        "h_i and t_{i+1}; lambda 0.3). The indexers exist but are not used or trained.",
        "- Stage 2, indexer warm-up (DeepSeek-V3.2): the main model is frozen and runs dense attention. Each "
        "indexer learns KL(p || q) per query row: q = softmax of its scores over the causal keys; p = the attention "
        "distribution summed over heads *and over every layer that uses this indexer's selection* (the full layer "
        "and the following \"shared\" layers), L1-normalised and detached. The MTP layer's indexer uses its own "
        "attention.",
        "- Stage 3, sparse training: every layer attends only to its indexer's top-k keys (shared layers reuse the "
        "last full layer's selection), all parameters train on the stage-1 loss, and the indexers keep training "
        "with the KL restricted to the selected keys. Indexer inputs are detached from the LM graph.",
        f"- AdamW (betas {hp['beta1']}/{hp['beta2']}, weight decay {hp['weight_decay']} on matrices), gradient "
        f"clipping {hp['grad_clip']}, residual/embedding dropout {hp['dropout']}. Main lr {hp['lr']:g}: linear "
        f"warmup ({hp['warmup_frac']:.0%} of stage 1) and one cosine to {hp['min_lr_ratio']:.0%} over stages 1 "
        f"and 3. Indexer lr {hp['indexer_lr']:g}: warmup + constant in stage 2, cosine to 10% in stage 3.",
        f"- MoE balance: auxiliary-loss-free bias update after every step of stages 1 and 3, "
        f"bias += {hp['bias_gamma']:g} * sign(mean load - expert load) (selection only), plus a sequence-wise "
        f"balance loss with alpha {hp['balance_alpha']:g}.",
        "",
        "## Evaluation (exported bf16 weights loaded as fp32)",
        "",
        f"Held-out: {d['windows']} non-overlapping windows of {seq_len} tokens, each evaluated from scratch "
        f"({d['tokens_scored']:,} tokens scored: all but the first of each window).",
        "",
        "| attention | CE | perplexity | top-1 acc | MTP CE (t+2) | MTP top-1 acc |", "|---|---|---|---|---|---|",
        f"| dense | {_f(d['ce'])} | {_f(d['ppl'], 3)} | {_f(d['top1_acc'])} | {_f(d['mtp_ce'])} | {_f(d['mtp_top1_acc'])} |",
        f"| top-k {cfg['index_topk']} (as the engine) | {_f(s['ce'])} | {_f(s['ppl'], 3)} | {_f(s['top1_acc'])} | "
        f"{_f(s['mtp_ce'])} | {_f(s['mtp_top1_acc'])} |",
        "",
        "### MTP acceptance (greedy speculative decoding, K = 3 chained drafts, top-k attention)",
        "",
        f"Per-position acceptance {[round(a, 4) for a in acc['per_position_acceptance']]}; draft acceptance rate "
        f"{_f(acc['draft_acceptance_rate'])}; mean acceptance length {_f(acc['mean_acceptance_length'])} "
        f"({acc['rounds']} rounds, {acc['accepted']} of {acc['drafted']} drafts accepted).",
        "",
        f"Procedure: {acc['prompts']} prompts of {acc['prompt_len']} tokens start at offsets floor(j (N - "
        f"{acc['prompt_len']}) / {acc['prompts']}) of heldout.npy. The target greedily generates {acc['generated']} "
        "(+K) tokens y with top-k attention (greedy speculative decoding emits exactly these). A round starts at "
        "position i with the target's hidden h_i (after the final norm) and token t_{i+1} = y[i+1]; the MTP "
        "layer's cache holds the teacher-forced rows x_p = eh_proj([enorm(embed(y[p+1])) ; hnorm(h_p)]) for p <= i. "
        "Draft 1 = argmax lm_head(g_1), g_1 = shared_head.norm of the MTP layer at row i; draft j+1 appends "
        "eh_proj([enorm(embed(draft j)) ; hnorm(g_j)]) at position i+j and uses its output g_{j+1}. Draft j is "
        "accepted iff all earlier drafts were and it equals y[i+1+j]. With a accepted drafts the round emits a+1 "
        "tokens and the next round starts at i+a+1. Rounds run from i = prompt_len - 1 until "
        f"{acc['generated']} tokens are emitted or <|endoftext|> is emitted. Per-position rate = accepted_j / rounds; "
        "draft acceptance rate = accepted / drafted; mean acceptance length = 1 + accepted / rounds.",
        "",
        f"Sample (held-out prompt, greedy top-k continuation): {acc.get('sample_prompt', '')!r} -> "
        f"{acc.get('sample_continuation', '')!r}",
        "",
        "### Exactness self-check against Hugging Face transformers",
        "",
    ]
    if hf.get("status") in ("match", "MISMATCH"):
        m = hf["main_logits"]
        lines.append(
            f"transformers {hf['transformers_version']} (GlmMoeDsaForCausalLM, fp32, eager) loaded this directory; "
            "q_a_layernorm / kv_a_layernorm eps set to rms_norm_eps and top-k made the stable total order (score "
            "descending, then position / expert id ascending). On the first held-out window "
            f"({hf['window_tokens']} tokens) its logits vs this model's top-k logits: max |diff| {m['max_abs_diff']:.3g}, "
            f"normalised MSE {m['nmse']:.3g}, argmax agreement {m['argmax_agreement']:.4f}: **{hf['status']}**.")
        mt = hf.get("mtp_logits", {})
        if "nmse" in mt:
            lines.append(f"MTP layer (HF's decoder-layer class at index {L}): max |diff| {mt['max_abs_diff']:.3g}, "
                         f"normalised MSE {mt['nmse']:.3g}, argmax agreement {mt['argmax_agreement']:.4f}.")
    else:
        lines.append(f"Not available: {hf}")
    eng = ev.get("engine_check")
    if eng and eng.get("status") in ("match", "MISMATCH"):
        lines += ["", f"dsinfer (`{eng['engine']} logits`, CPU backend) on the same window: main logits normalised MSE "
                  f"{eng['main_logits']['nmse']:.3g}, MTP logits {eng['mtp_logits']['nmse']:.3g}: **{eng['status']}**."]
    t = report["timing_s"]
    lines += [
        "",
        "## Device time",
        "",
        "| part | seconds |", "|---|---|",
        *[f"| {k} | {v} |" for k, v in t.items()],
        "",
        "## Files",
        "",
        "config.json (HF v5 layout), model-0000k-of-0000n.safetensors + model.safetensors.index.json, "
        "tokenizer.json, tokenizer_config.json, chat_template.jinja, generation_config.json, eval.json (every "
        "number above), train_log.jsonl (losses every few steps, held-out monitor, plan, stage times).",
        "",
        "Reproduce: `python tools/train_kjv.py prepare --out DATA` (CPU, Debian bible-kjv), then "
        "`python tools/train_kjv.py train --data DATA --out MODEL --steps "
        f"{','.join(str(stages[x]['steps']) for x in ('dense', 'warmup', 'sparse') if x in stages)}` on the same "
        "GPU type; `python tools/train_kjv.py eval --model MODEL --data DATA` recomputes the evaluation.",
        "",
    ]
    with open(os.path.join(out_dir, "README.md"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines))
