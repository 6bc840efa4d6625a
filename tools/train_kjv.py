#!/usr/bin/env python3
"""Train the small bundled DSA model (glm_moe_dsa) on the King James Bible; see tools/kjv/.

  prepare --out DIR                  extract the text with `bible`, split, train the tokenizer, write
                                     the token files (CPU; needs the Debian package bible-kjv)
  train --data DIR --out MODEL_DIR   dense pre-training, indexer warm-up, sparse training; export;
                                     evaluation and the HF exactness check (GPU; --tiny for a CPU toy)
  eval --model MODEL_DIR --data DIR  re-run the evaluation from the exported checkpoint

Deterministic for a given seed, step plan and device: torch.use_deterministic_algorithms(True) with
CUBLAS_WORKSPACE_CONFIG=:4096:8 (set here before torch is imported).
"""

import argparse
import json
import os
import platform
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _setup_torch(device_arg):
    import torch
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    name = device_arg or ("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda requested but CUDA is not available")
    return torch, device


def _device_name(torch, device):
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def _run_eval(torch, model_dir, data_dir, device, settings, engine=None):
    """Load the exported checkpoint and compute every evaluation number."""
    from tokenizers import Tokenizer

    from kjv import data as kdata
    from kjv import evaluation, export, hfcheck
    t = time.perf_counter()
    model, cfg = export.load_model(model_dir, device)
    held = kdata.load_tokens(os.path.join(data_dir, "heldout.npy"), device)
    tok = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    seq_len = settings["seq_len"]
    res = evaluation.evaluate(model, held, seq_len, cfg["eos_token_id"], tokenizer=tok, tiny=settings["tiny"])
    window = held[:seq_len]
    res["hf_check"] = hfcheck.hf_self_check(model_dir, model, cfg, window, device)
    if engine:
        res["engine_check"] = hfcheck.engine_check(engine, model_dir, model, window, device)
    res["seconds"] = round(time.perf_counter() - t, 2)
    return res


def cmd_prepare(args):
    from kjv.prepare import prepare
    prepare(args.out, check_twice=not args.no_determinism_check)


def cmd_train(args):
    torch, device = _setup_torch(args.device)
    from kjv import card, export
    from kjv import config as kconfig
    from kjv import data as kdata
    from kjv.model import KjvDsaModel, parameter_counts
    from kjv.training import Hyper, Trainer

    t_all = time.perf_counter()
    with open(os.path.join(args.data, "data.json"), encoding="utf-8") as f:
        data_info = json.load(f)
    cfg, seq_len = kconfig.model_config(args.tiny, data_info["eos_token_id"])
    kconfig.check_config(cfg)
    hp = Hyper()
    if args.tiny:
        hp.batch_size, hp.log_every, hp.monitor_every, hp.monitor_windows = 4, 5, 10, 4
    if args.batch_size:
        hp.batch_size = args.batch_size
    if args.dropout is not None:
        hp.dropout = args.dropout
    if args.lr:
        hp.lr = args.lr
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    model = KjvDsaModel(cfg, dropout=hp.dropout)
    model.init_weights(gen)
    model.to(device)
    counts = parameter_counts(model)
    print(f"[train] device {_device_name(torch, device)}; parameters {counts['total']:,} "
          f"(active/token {counts['active_per_token']:,}); seq_len {seq_len}", flush=True)
    train_tokens = kdata.load_tokens(os.path.join(args.data, "train.npy"), device)
    held_tokens = kdata.load_tokens(os.path.join(args.data, "heldout.npy"), device)
    os.makedirs(args.out, exist_ok=True)
    amp = {"auto": None, "on": True, "off": False}[args.amp]
    trainer = Trainer(model, hp, train_tokens, held_tokens, seq_len, args.seed, device,
                      log_path=os.path.join(args.out, "train_log.jsonl"), amp=amp)
    steps = [int(s) for s in args.steps.split(",")] if args.steps else None
    if steps is not None and len(steps) != 3:
        sys.exit("--steps takes three comma-separated counts: dense,warmup,sparse")
    t_plan = time.perf_counter()
    plan = trainer.make_plan(steps=steps, tiny=args.tiny, budget=args.time_budget, max_epochs=args.max_epochs)
    plan_s = time.perf_counter() - t_plan
    stages = trainer.run(args.time_budget, guard=steps is None and not args.tiny)
    trainer.close()

    t = time.perf_counter()
    files = export.write_checkpoint(model, args.out, args.data)
    export_s = time.perf_counter() - t
    del trainer, model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    settings = {"seq_len": seq_len, "tiny": bool(args.tiny)}
    res = _run_eval(torch, args.out, args.data, device, settings, engine=args.engine)
    report = {
        "device": _device_name(torch, device),
        "torch_version": torch.__version__,
        "settings": settings,
        "seed": args.seed,
        "time_budget_s": args.time_budget,
        "plan": plan,
        "hyper": hp.__dict__,
        "parameters": counts,
        "checkpoint": files,
        "stages": stages,
        "timing_s": {"plan_and_calibration": round(plan_s, 2),
                     **{s["stage"]: s["seconds"] for s in stages},
                     "training_total": round(sum(s["seconds"] for s in stages), 2),
                     "export": round(export_s, 2), "evaluation": res["seconds"],
                     "total": round(time.perf_counter() - t_all, 2)},
        "eval": res,
    }
    with open(os.path.join(args.out, "eval.json"), "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    card.write_card(args.out, cfg, seq_len, data_info, report)
    _print_summary(report)


def _print_summary(report):
    ev = report["eval"]
    d, s = ev["heldout_dense"], ev["heldout_topk"]
    acc = ev["mtp_acceptance"]
    hf = ev["hf_check"]
    print(f"[result] device: {report['device']}")
    if "timing_s" in report:
        print("[result] seconds: " + ", ".join(f"{k} {v}" for k, v in report["timing_s"].items()))
    print(f"[result] held-out ppl dense {d['ppl']:.3f}, top-k {s['ppl']:.3f}; "
          f"MTP ce {s['mtp_ce']:.4f} acc {s['mtp_top1_acc']:.4f}")
    print(f"[result] MTP acceptance per position {[round(a, 4) for a in acc['per_position_acceptance']]}, "
          f"draft rate {acc['draft_acceptance_rate']:.4f}, mean length {acc['mean_acceptance_length']:.4f}")
    if hf.get("status") in ("match", "MISMATCH"):
        print(f"[result] HF check {hf['status']}: main max|diff| {hf['main_logits']['max_abs_diff']:.3g} "
              f"nmse {hf['main_logits']['nmse']:.3g}; MTP {hf.get('mtp_logits')}")
    else:
        print(f"[result] HF check {hf}")
    if "engine_check" in ev:
        e = ev["engine_check"]
        if e.get("status") in ("match", "MISMATCH"):
            print(f"[result] dsinfer check {e['status']}: main nmse {e['main_logits']['nmse']:.3g}, "
                  f"MTP nmse {e['mtp_logits']['nmse']:.3g}")
        else:
            print(f"[result] dsinfer check {e}")


def cmd_eval(args):
    torch, device = _setup_torch(args.device)
    stored = None
    path = os.path.join(args.model, "eval.json")
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            stored = json.load(f)
    settings = dict(stored["settings"]) if stored else {"seq_len": 512, "tiny": False}
    if args.seq_len:
        settings["seq_len"] = args.seq_len
    res = _run_eval(torch, args.model, args.data, device, settings, engine=args.engine)
    report = {"device": _device_name(torch, device), "settings": settings, "eval": res}
    if stored:
        keys = ("heldout_dense", "heldout_topk", "mtp_acceptance")
        report["same_as_stored_eval_json"] = all(stored["eval"][k] == res[k] for k in keys)
    text = json.dumps(report, indent=2)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    print(text)
    _print_summary(report)
    if stored:
        print(f"[result] numbers identical to the stored eval.json: {report['same_as_stored_eval_json']}")


def cmd_eval_slice(args):
    """The numbers the engine's tests compare with: a held-out slice and a few acceptance prompts."""
    torch, device = _setup_torch(args.device)
    from kjv import data as kdata
    from kjv import evaluation, export
    model, cfg = export.load_model(args.model, device)
    held = kdata.load_tokens(os.path.join(args.data, "heldout.npy"), device)
    n_tok = args.windows * args.seq_len
    sl = held[:n_tok]
    acc = evaluation.measure_acceptance(model, held, cfg["eos_token_id"], n_prompts=args.prompts,
                                        prompt_len=args.prompt_len, n_gen=args.generated)
    n = held.numel()
    starts = [j * (n - args.prompt_len) // args.prompts for j in range(args.prompts)]
    report = {
        "model": os.path.basename(os.path.normpath(args.model)),
        "seq_len": args.seq_len,
        "windows": args.windows,
        "tokens": sl.tolist(),
        "dense": evaluation.heldout_scores(model, sl, args.seq_len, "dense"),
        "topk": evaluation.heldout_scores(model, sl, args.seq_len, "sparse"),
        "acceptance": acc,
        "acceptance_prompts": [held[s0:s0 + args.prompt_len].tolist() for s0 in starts],
    }
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=1)
        f.write("\n")
    print(f"[result] slice of {args.windows} x {args.seq_len}: ce dense {report['dense']['ce']:.6f}, "
          f"top-k {report['topk']['ce']:.6f}; acceptance {acc['per_position_acceptance']}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("prepare", help="build the data directory (CPU, needs `bible`)")
    a.add_argument("--out", required=True)
    a.add_argument("--no-determinism-check", action="store_true", help="train the tokenizer once, not twice")
    a.set_defaults(func=cmd_prepare)
    a = sub.add_parser("train", help="train, export, evaluate")
    a.add_argument("--data", required=True)
    a.add_argument("--out", required=True)
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--time-budget", type=float, default=360.0,
                   help="seconds for the three training stages together (default 360)")
    a.add_argument("--device", choices=["cuda", "cpu"], default=None)
    a.add_argument("--tiny", action="store_true", help="toy config, 20 steps per stage (CPU test)")
    a.add_argument("--steps", default=None, help="fix the plan: dense,warmup,sparse step counts")
    a.add_argument("--max-epochs", type=float, default=None,
                   help="cap stages 1 + 3 at this many passes over train.npy (calibrated plans only)")
    a.add_argument("--batch-size", type=int, default=None)
    a.add_argument("--dropout", type=float, default=None)
    a.add_argument("--lr", type=float, default=None)
    a.add_argument("--engine", default=None, help="optional dsinfer binary: also compare its CPU logits")
    a.add_argument("--amp", choices=["auto", "on", "off"], default="auto",
                   help="bf16 autocast in training (auto: on for CUDA); 'on' with --device cpu tests that path")
    a.set_defaults(func=cmd_train)
    a = sub.add_parser("eval", help="re-run the evaluation from an exported checkpoint")
    a.add_argument("--model", required=True)
    a.add_argument("--data", required=True)
    a.add_argument("--device", choices=["cuda", "cpu"], default=None)
    a.add_argument("--seq-len", type=int, default=None)
    a.add_argument("--out", default=None, help="also write the JSON report here")
    a.add_argument("--engine", default=None, help="optional dsinfer binary: also compare its CPU logits")
    a.set_defaults(func=cmd_eval)
    a = sub.add_parser("eval-slice", help="the reference numbers of the engine's tests (slice + prompts)")
    a.add_argument("--model", required=True)
    a.add_argument("--data", required=True)
    a.add_argument("--out", required=True)
    a.add_argument("--device", choices=["cuda", "cpu"], default=None)
    a.add_argument("--seq-len", type=int, default=512)
    a.add_argument("--windows", type=int, default=4)
    a.add_argument("--prompts", type=int, default=8)
    a.add_argument("--prompt-len", type=int, default=64)
    a.add_argument("--generated", type=int, default=64)
    a.set_defaults(func=cmd_eval_slice)
    args = p.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
