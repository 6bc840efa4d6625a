"""`train_kjv.py prepare --out DIR`: text extraction, split, tokenizer training, token files, data.json.

Runs on the CPU machine that has the Debian program `bible`. DIR then holds everything training needs:
tokenizer.json, tokenizer_config.json, chat_template.jinja, train.npy, heldout.npy, data.json. The
tokenizer is trained twice and the two tokenizer.json texts are compared (determinism check).
"""

import hashlib
import json
import os
import time

import numpy as np

from . import data as kdata
from . import tokenizer as ktok

MAX_POSITIONS = 2048


def _sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def prepare(out_dir, check_twice=True):
    """Build the data directory; returns the data.json dict."""
    t0 = time.time()
    os.makedirs(out_dir, exist_ok=True)
    raw = kdata.extract_text()
    chapters = kdata.parse_chapters(raw)
    train_docs, held_docs, held_names = kdata.split_documents(chapters)
    print(f"[prepare] {len(chapters)} chapters: {len(train_docs)} train, {len(held_docs)} held out", flush=True)

    tok = ktok.train_tokenizer(train_docs)
    text = ktok.tokenizer_json(tok)
    deterministic = None
    if check_twice:
        again = ktok.tokenizer_json(ktok.train_tokenizer(train_docs))
        deterministic = again == text
        if not deterministic:
            raise RuntimeError("two tokenizer trainings on the same input gave different tokenizer.json")
    print(f"[prepare] tokenizer trained ({time.time() - t0:.1f}s), deterministic check: {deterministic}", flush=True)
    ktok.write_tokenizer_files(tok, out_dir, MAX_POSITIONS)

    eos = tok.token_to_id(ktok.EOS_TOKEN)
    encoded = {}
    for name, docs in (("train", train_docs), ("heldout", held_docs)):
        ids = [e.ids for e in tok.encode_batch(docs, add_special_tokens=False)]
        for doc, toks in zip(docs, ids):
            if tok.decode(toks, skip_special_tokens=False) != doc:
                raise RuntimeError(f"{name}: a document does not round-trip through the tokenizer")
        arr = kdata.pack_documents(ids, eos)
        np.save(os.path.join(out_dir, f"{name}.npy"), arr, allow_pickle=False)
        encoded[name] = {"documents": len(docs), "tokens": int(arr.size),
                         "characters": sum(len(d) for d in docs),
                         "sha256_text": kdata.sha256_text("\x00".join(docs))}

    notes = ktok.check_tokenizer(tok, out_dir)
    verses = sum(len(v) for _, v in chapters)
    info = {
        "source": f"Debian package bible-kjv {kdata.bible_version() or '(version unknown)'}: "
                  f"`bible -f \"{kdata.BIBLE_RANGE}\"`",
        "sha256_bible_output": kdata.sha256_text(raw),
        "verses": verses,
        "chapters": len(chapters),
        "document": "one chapter; verse references stripped; verses joined with '\\n'; "
                    "each document followed by <|endoftext|> in the token files",
        "split_rule": kdata.SPLIT_RULE,
        "heldout_chapters": held_names,
        "train": encoded["train"],
        "heldout": encoded["heldout"],
        "sha256_text_rule": "sha256 of the split's documents joined with NUL, UTF-8",
        "vocab_size": tok.get_vocab_size(with_added_tokens=True),
        "special_tokens": ktok.special_ids(tok),
        "eos_token_id": eos,
        "token_dtype": "uint16",
        "tokenizer_trained_on": "train split only",
        "tokenizer_deterministic_check": deterministic,
        "tokenizer_checks": notes,
        "files": {},
    }
    for fn in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "train.npy", "heldout.npy"):
        p = os.path.join(out_dir, fn)
        info["files"][fn] = {"bytes": os.path.getsize(p), "sha256": _sha256_file(p)}
    with open(os.path.join(out_dir, "data.json"), "w", encoding="utf-8") as f:
        json.dump(info, f, indent=2)
        f.write("\n")
    total = sum(v["bytes"] for v in info["files"].values())
    print(f"[prepare] train {encoded['train']['tokens']} tokens, heldout {encoded['heldout']['tokens']} tokens, "
          f"vocab {info['vocab_size']}, {total / 1e6:.2f} MB in {out_dir} ({time.time() - t0:.1f}s)", flush=True)
    return info
