"""kjv: train a small GLM-MoE-DSA (glm_moe_dsa) model on the King James Bible for dsinfer.

The package is driven by tools/train_kjv.py (prepare / train / eval). Modules:

  data        the Bible text (Debian `bible`), chapter documents, the split, the token files, batches
  tokenizer   the byte-level BPE tokenizer, tokenizer_config.json and the GLM-style chat template
  config      the model configurations (full and --tiny) and config.json in the HF v5 layout
  model       the model in plain PyTorch (MLA, lightning indexer, noaux_tc MoE, MTP layer)
  training    the three training stages, schedules, load balancing, the time plan, the log
  evaluation  held-out perplexity (dense and top-k), MTP CE and the speculative acceptance measure
  hfcheck     the exactness self-check against Hugging Face transformers
  export      safetensors shards and the other checkpoint files; loading them back
  card        the model card (README.md)

Everything here is written for this project; docs/semantics.md is the definition of the math.
"""
