"""The training recipe: dense pre-training, indexer warm-up, sparse training (DeepSeek-V3.2 style).

Stage 1 "dense": every causal key attended; the indexers exist but are neither used nor trained.
  loss = CE(next token) + lambda_mtp * CE(MTP: t_{i+2} from h_i and t_{i+1}) + alpha * balance.
Stage 2 "warmup": main model frozen (eval mode: no dropout), dense attention; only the indexers (full
  layers and the MTP layer's) train, with KL(p || q) per query row: p = head-summed attention of the
  layers that use the indexer's selection (the full layer and the "shared" layers after it),
  L1-normalised and detached; q = softmax of the index scores over the causal keys.
Stage 3 "sparse": attention restricted to each indexer's top-k keys; all parameters train with the
  stage-1 loss; the indexers keep training with the KL restricted to the selected keys. Indexer inputs
  are detached from the LM graph, so the LM loss never reaches the indexers and the KL never reaches
  the model.
After every optimiser step of stages 1 and 3, the auxiliary-loss-free balancing updates each router's
e_score_correction_bias += gamma * sign(mean load - expert load).

Main-model learning rate: one linear-warmup + cosine schedule over the main-model steps of stages 1
and 3 (stage 3 continues where stage 1 stopped). Indexer learning rate: warmup then constant in stage 2,
cosine to 10% in stage 3. AdamW (betas 0.9/0.95), gradient clipping 1.0, bf16 autocast on CUDA.

Step plan: --steps fixes the three step counts. Otherwise (--tiny: 20 each) a calibration measures the
seconds per step of each stage on a throwaway copy (RNG state restored afterwards), and stage k gets
floor(0.92 * fraction_k * budget / seconds_per_step_k) steps rounded down to 2 significant digits, with
the fractions 0.6 / 0.1 / 0.3. A guard ends a stage early if it runs past 1.15 x its share + 5 s
(logged as truncated). --max-epochs optionally caps stages 1 + 3 at that many passes over train.npy.
"""

import copy
import json
import math
import time
from dataclasses import asdict, dataclass

import torch

from . import data as kdata
from .model import cross_entropy, indexer_kl

STAGES = ("dense", "warmup", "sparse")
FRACTIONS = {"dense": 0.6, "warmup": 0.1, "sparse": 0.3}
SAFETY = 0.92  # calibrated steps fill 92% of each share (logging, held-out monitor, timing noise)
GUARD = 1.15  # a calibrated stage is cut when it has run 1.15 x its share + 5 s


@dataclass
class Hyper:
    """Training hyper-parameters (recorded in train_log.jsonl and the model card)."""
    batch_size: int = 32
    lr: float = 1.5e-3
    min_lr_ratio: float = 0.1
    warmup_frac: float = 0.05
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    mtp_lambda: float = 0.3
    balance_alpha: float = 1e-4
    bias_gamma: float = 1e-3
    indexer_lr: float = 1e-3
    dropout: float = 0.2
    log_every: int = 50
    monitor_every: int = 500
    monitor_windows: int = 64


def round_2sig(n):
    """Round a positive int down to 2 significant digits (stabilises calibrated step counts)."""
    if n < 100:
        return max(int(n), 1)
    q = 10 ** (int(math.log10(n)) - 1)
    return int(n // q * q)


def sync(device):
    """Wait for the device (for timing)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Trainer:
    """Holds the model, optimisers, samplers and the log; runs the stages."""

    def __init__(self, model, hp, train_tokens, heldout_tokens, seq_len, seed, device, log_path=None, amp=None):
        self.model, self.hp, self.seq_len, self.device = model, hp, seq_len, device
        self.train_tokens, self.heldout_tokens = train_tokens, heldout_tokens
        self.seed = seed
        self.amp = device.type == "cuda" if amp is None else amp
        idx_params = [p for i in model.indexers() for p in i.parameters()]
        idx_ids = {id(p) for p in idx_params}
        self.main_params = [p for p in model.parameters() if id(p) not in idx_ids]
        self.idx_params = idx_params
        decay = [p for p in self.main_params if p.dim() >= 2]
        no_decay = [p for p in self.main_params if p.dim() < 2]
        betas = (hp.beta1, hp.beta2)
        self.main_opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": hp.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=hp.lr, betas=betas, eps=1e-8)
        self.idx_opt = torch.optim.AdamW(self.idx_params, lr=hp.indexer_lr, betas=betas, eps=1e-8,
                                         weight_decay=0.0)
        self.log_path = log_path
        self.log_file = open(log_path, "w", encoding="utf-8") if log_path else None
        self.plan = None
        self.t0 = None
        self.stage_info = []

    # ------------------------------------------------------------------ logging
    def log(self, rec):
        """Append one JSON line to train_log.jsonl (and echo a short form)."""
        if self.log_file:
            self.log_file.write(json.dumps(rec) + "\n")
            self.log_file.flush()
        if rec.get("event") in ("step", "heldout", "stage_end", "plan"):
            keys = [k for k in rec if k not in ("event",)]
            print("[train] " + rec["event"] + " " + " ".join(
                f"{k}={rec[k]:.4g}" if isinstance(rec[k], float) else f"{k}={rec[k]}" for k in keys), flush=True)

    def close(self):
        if self.log_file:
            self.log_file.close()

    # ------------------------------------------------------------------ schedules
    def main_lr(self, m):
        """Main-model lr at main step m (0-based over stages 1 and 3)."""
        total = self.plan["dense"] + self.plan["sparse"]
        warm = max(1, round(self.hp.warmup_frac * self.plan["dense"]))
        if m < warm:
            return self.hp.lr * (m + 1) / warm
        frac = min(1.0, (m - warm) / max(1, total - warm))
        lo = self.hp.lr * self.hp.min_lr_ratio
        return lo + 0.5 * (self.hp.lr - lo) * (1.0 + math.cos(math.pi * frac))

    def idx_lr(self, stage, j):
        """Indexer lr at step j of stage 2 (warmup 10%, constant) or stage 3 (cosine to 10%)."""
        if stage == "warmup":
            warm = max(1, round(0.1 * self.plan["warmup"]))
            return self.hp.indexer_lr * min(1.0, (j + 1) / warm)
        frac = j / max(1, self.plan["sparse"] - 1)
        return self.hp.indexer_lr * (0.1 + 0.45 * (1.0 + math.cos(math.pi * frac)))

    # ------------------------------------------------------------------ one step
    def _losses(self, w, mode, kl):
        T = self.seq_len
        ids, nxt = w[:, :T], w[:, 1:T + 1]
        with torch.autocast(device_type=self.device.type, dtype=torch.bfloat16, enabled=self.amp):
            out = self.model(ids, mode=mode, next_ids=nxt, kl=kl)
            ce = cross_entropy(out["logits"], w[:, 1:T + 1])
            mtp = cross_entropy(out["mtp_logits"], w[:, 2:T + 2])
        kl_total = sum(indexer_kl(g) for g in out["groups"]) if kl else None
        return ce, mtp, kl_total

    def step(self, stage, w, main_step, j):
        """One optimiser step of a stage; returns a dict of detached loss tensors and lrs."""
        hp, model = self.hp, self.model
        if stage == "warmup":
            model.eval()
            for p in self.main_params:
                p.requires_grad_(False)
            ce, mtp, kl = self._losses(w, "dense", kl=True)
            lr_i = self.idx_lr(stage, j)
            for g in self.idx_opt.param_groups:
                g["lr"] = lr_i
            self.idx_opt.zero_grad(set_to_none=True)
            kl.backward()
            torch.nn.utils.clip_grad_norm_(self.idx_params, hp.grad_clip)
            self.idx_opt.step()
            for p in self.main_params:
                p.requires_grad_(True)
            return {"ce": ce.detach(), "mtp_ce": mtp.detach(), "kl": kl.detach(), "lr": 0.0, "lr_indexer": lr_i}
        model.train()
        sparse = stage == "sparse"
        ce, mtp, kl = self._losses(w, "sparse" if sparse else "dense", kl=sparse)
        bal = sum(m.stats[1] for m in model.moes())
        loss = ce + hp.mtp_lambda * mtp + hp.balance_alpha * bal
        if sparse:
            loss = loss + kl
        lr = self.main_lr(main_step)
        for g in self.main_opt.param_groups:
            g["lr"] = lr
        self.main_opt.zero_grad(set_to_none=True)
        self.idx_opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.main_params, hp.grad_clip)
        self.main_opt.step()
        rec = {"ce": ce.detach(), "mtp_ce": mtp.detach(), "kl": None, "balance": bal.detach(), "lr": lr}
        if sparse:
            lr_i = self.idx_lr(stage, j)
            for g in self.idx_opt.param_groups:
                g["lr"] = lr_i
            torch.nn.utils.clip_grad_norm_(self.idx_params, hp.grad_clip)
            self.idx_opt.step()
            rec.update({"kl": kl.detach(), "lr_indexer": lr_i})
        with torch.no_grad():
            loads = []
            for m in model.moes():
                counts = m.stats[0].float()
                m.gate.e_score_correction_bias += hp.bias_gamma * torch.sign(counts.mean() - counts)
                loads.append(counts.max() / counts.mean())
            rec["max_load_ratio"] = torch.stack(loads).max()
        return rec

    # ------------------------------------------------------------------ monitoring
    @torch.no_grad()
    def heldout_ce(self, mode):
        """Mean CE on the first monitor_windows held-out windows (a training-curve monitor only)."""
        was_training = self.model.training
        self.model.eval()
        wins = kdata.heldout_windows(self.heldout_tokens, self.seq_len)
        wins = [w for w in wins if w[1] - w[0] == self.seq_len][: self.hp.monitor_windows]
        x = torch.stack([self.heldout_tokens[a:b] for a, b in wins])
        with torch.autocast(device_type=self.device.type, dtype=torch.bfloat16, enabled=self.amp):
            out = self.model(x[:, :-1], mode=mode)
            ce = cross_entropy(out["logits"], x[:, 1:])
        self.model.train(was_training)
        return float(ce)

    # ------------------------------------------------------------------ plan
    def calibrate(self, n_warm=2, n_timed=5):
        """Seconds per step of each stage, measured on a copy (the RNG state is restored)."""
        devices = [self.device.index or 0] if self.device.type == "cuda" else []
        saved = (self.model, self.main_opt, self.idx_opt, self.main_params, self.idx_params, self.plan)
        secs = {}
        with torch.random.fork_rng(devices=devices):
            clone = copy.deepcopy(self.model)
            shadow = Trainer(clone, self.hp, self.train_tokens, self.heldout_tokens, self.seq_len, self.seed,
                             self.device, amp=self.amp)
            shadow.plan = {s: 1000 for s in STAGES}
            sampler = kdata.WindowSampler(self.train_tokens, self.seq_len + 2, self.hp.batch_size, self.seed + 7919)
            for stage in STAGES:
                for k in range(n_warm + n_timed):
                    if k == n_warm:
                        sync(self.device)
                        t = time.perf_counter()
                    rec = shadow.step(stage, sampler.next(), k, k)
                float(rec["ce"])
                sync(self.device)
                secs[stage] = (time.perf_counter() - t) / n_timed
            del shadow, clone
        self.model, self.main_opt, self.idx_opt, self.main_params, self.idx_params, self.plan = saved
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        return secs

    def make_plan(self, steps=None, tiny=False, budget=360.0, max_epochs=None):
        """Decide the step counts (see the module docstring); logs the plan."""
        rec = {"event": "plan", "budget_s": budget}
        if steps is not None:
            self.plan, rec["source"] = dict(zip(STAGES, steps)), "--steps"
        elif tiny:
            self.plan, rec["source"] = {s: 20 for s in STAGES}, "--tiny"
        else:
            t = time.perf_counter()
            secs = self.calibrate()
            self.plan = {s: round_2sig(int(SAFETY * FRACTIONS[s] * budget / secs[s])) for s in STAGES}
            rec.update({"source": "calibrated", "calibration_s": round(time.perf_counter() - t, 2),
                        "sec_per_step": {s: round(v, 5) for s, v in secs.items()}})
            tokens = self.hp.batch_size * self.seq_len
            cap = None if not max_epochs else int(max_epochs * self.train_tokens.numel() / tokens)
            if cap is not None and self.plan["dense"] + self.plan["sparse"] > cap:
                scale = cap / (self.plan["dense"] + self.plan["sparse"])
                for s in ("dense", "sparse"):
                    self.plan[s] = round_2sig(int(self.plan[s] * scale))
                rec["capped_by_max_epochs"] = max_epochs
        rec["steps"] = dict(self.plan)
        rec["tokens_per_step"] = self.hp.batch_size * self.seq_len
        rec["epochs_stage1_plus_3"] = round((self.plan["dense"] + self.plan["sparse"]) * rec["tokens_per_step"]
                                            / self.train_tokens.numel(), 2)
        rec["hyper"] = asdict(self.hp)
        rec["guard"] = rec["source"] == "calibrated"
        rec["bf16_autocast"] = self.amp
        self.log(rec)
        return self.plan

    # ------------------------------------------------------------------ stages
    def run(self, budget, guard):
        """Run the three stages by the plan; returns the per-stage summary list."""
        self.t0 = time.perf_counter()
        main_step = 0
        tokens_per_step = self.hp.batch_size * self.seq_len
        for si, stage in enumerate(STAGES):
            sampler = kdata.WindowSampler(self.train_tokens, self.seq_len + 2, self.hp.batch_size,
                                          self.seed * 1000 + si)
            n = self.plan[stage]
            sync(self.device)
            start = last = time.perf_counter()
            last_step = 0
            limit = GUARD * FRACTIONS[stage] * budget + 5.0
            truncated, done = False, 0
            for j in range(n):
                rec = self.step(stage, sampler.next(), main_step, j)
                done = j + 1
                if stage != "warmup":
                    main_step += 1
                final = j == n - 1
                if (j + 1) % self.hp.log_every == 0 or final or j == 0:
                    sync(self.device)
                    now = time.perf_counter()
                    out = {"event": "step", "stage": stage, "step": j + 1}
                    out.update({k: (float(v) if torch.is_tensor(v) else v) for k, v in rec.items()})
                    out["tokens_per_s"] = round((j + 1 - last_step) * tokens_per_step / max(now - last, 1e-9))
                    out["elapsed_s"] = round(now - self.t0, 2)
                    self.log(out)
                    last, last_step = now, j + 1
                    if guard and now - start > limit and not final:
                        truncated = True
                        break
                if stage != "warmup" and self.hp.monitor_every and (
                        (j + 1) % self.hp.monitor_every == 0 or final):
                    mode = "sparse" if stage == "sparse" else "dense"
                    self.log({"event": "heldout", "stage": stage, "step": j + 1, "mode": mode,
                              "heldout_ce_monitor": round(self.heldout_ce(mode), 5),
                              "elapsed_s": round(time.perf_counter() - self.t0, 2)})
            sync(self.device)
            secs = time.perf_counter() - start
            info = {"event": "stage_end", "stage": stage, "steps": done, "planned_steps": n,
                    "seconds": round(secs, 2), "tokens": done * tokens_per_step, "truncated": truncated}
            self.log(info)
            self.stage_info.append(info)
        for p in self.model.parameters():
            p.requires_grad_(True)
        self.model.eval()
        return self.stage_info
