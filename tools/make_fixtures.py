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

Reference semantics: docs/semantics.md. HF is used as is, with three deliberate corrections applied
by monkeypatching at run time (MLA norm eps, the indexer's top-k tie order, and running the MTP layer
with HF's decoder-layer class); see tools/fixtures/hf_oracle.py.

Prompts are drawn at random and rejected when any discrete decision (greedy argmax, indexer top-k
boundary and order, MoE routing) lies within float noise of a flip; see tools/README_fixtures.md.

This file is the entry point (argument parsing and the summary); the work is done by the package
tools/fixtures/ (configs, semantics, weights, hf_oracle, checks, goldens, diagnostics).

Usage: python tools/make_fixtures.py --out tests/fixtures [--seed 0] [--only NAME] [--self-check]
"""

import argparse
import hashlib
import os

import torch

from fixtures.configs import FIXTURES
from fixtures.diagnostics import health_report, self_check
from fixtures.goldens import build_fixture, dir_bytes
from fixtures.hf_oracle import patch_hf, require_transformers


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
