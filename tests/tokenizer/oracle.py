#!/usr/bin/env python3
"""The tokenizer oracle: Hugging Face `tokenizers` (PyPI) encodes and decodes the parity corpus with
three tokenizers, and writes what it got as JSON for tests/test_tokenizer.cpp (TokenizerParity.*).

  (a) kjv: the committed model's tokenizer (models/kjv-dsa/tokenizer.json): byte-level BPE, a
      GPT-4-style Split regex then ByteLevel without regex, six special tokens;
  (b) bytelevel: trained here on the corpus: ByteLevel(add_prefix_space, use_regex), merges saved
      in the older "a b" string form, added tokens with lstrip/rstrip/single_word/normalized;
  (c) nfc_splits: trained here: NFC normalizer, DeepSeek-V3-style Split regexes and one Split of
      every behavior (and invert), ignore_merges, a TemplateProcessing post-processor adding
      non-ASCII special tokens.

Inputs are bytes; HF tokenizers takes a Python str, so every input is decoded with
bytes.decode('utf-8', 'replace') first, which is what dsi::Tokenizer does to invalid UTF-8.

Usage: oracle.py --source-dir REPO --out DIR   (writes DIR/oracle.json and DIR/*.tokenizer.json)
"""
import argparse
import json
import random
from pathlib import Path

import tokenizers
from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                        pre_tokenizers, processors, trainers)


def read_corpus(path):
    """Records of corpus.txt as (name, bytes); see the file's header for the format."""
    data = Path(path).read_bytes()
    starts = []  # (header start, body start, name, is_hex)
    pos = 0
    while True:
        i = data.find(b"#### ", pos)
        if i < 0:
            break
        if i == 0 or data[i - 1:i] == b"\n":
            eol = data.index(b"\n", i)
            head = data[i + 5:eol].decode("utf-8")
            is_hex = head.startswith("hex ")
            starts.append((i, eol + 1, head[4:] if is_hex else head, is_hex))
            pos = eol + 1
        else:
            pos = i + 1
    records = []
    for k, (_, body_start, name, is_hex) in enumerate(starts):
        end = starts[k + 1][0] - 1 if k + 1 < len(starts) else len(data)
        if k + 1 == len(starts) and data.endswith(b"\n"):
            end -= 1
        body = data[body_start:max(end, body_start)]
        records.append((name, bytes.fromhex(body.decode("ascii")) if is_hex else body))
    return records


def generated_cases(records):
    """Cases built in code: long runs, many digits, the whole corpus, seeded random mixes."""
    cases = [
        ("empty", b""),
        ("long run of spaces", b" " * 300 + b"x" + b" " * 100),
        ("long runs of tabs and newlines", b"\t" * 50 + b"\n" * 50 + b"a" + b"\r\n" * 20),
        ("a thousand digits", "".join(str(i * 7 % 10) for i in range(1000)).encode()),
        ("a long word", b"a" * 500 + b"b" * 300),
        ("the whole corpus", b"\n".join(body for _, body in records)),
    ]
    pieces = ["a", "b", "e", "The", " ", "  ", "\t", "\n", "\r\n", "'s", "'S", "0", "12", "345",
              ".", "!", "...", "中", "文", "の", "ア", "한", "😀", "\u200d", "👨", "🇯", "🇵",
              "\u0301", "\u0308", "é", "ß", "ſ", "\u00a0", "\u3000", "<|user|>", "<|", "user",
              "|>", "[gMASK]", "<sop>", "<sep>", "[[code]]", "(word)", "café", "<think>", "--",
              "<｜begin▁of▁sentence｜>", "Ω", "ب", "ש"]
    raw = [b"\xff", b"\xe2\x82", b"\xf0\x9f", b"\x80", b"\xc3"]
    rng = random.Random(1234)
    for k in range(150):
        parts = []
        for _ in range(rng.randint(1, 14)):
            parts.append(rng.choice(raw) if rng.random() < 0.08 else rng.choice(pieces).encode())
        cases.append((f"random mix {k}", b"".join(parts)))
    return cases


def train_bytelevel(texts, out_dir):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    trainer = trainers.BpeTrainer(vocab_size=700, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|im_start|>", "<|im_end|>"])
    tok.train_from_iterator(texts, trainer)
    tok.add_tokens([AddedToken("[[code]]", lstrip=True, rstrip=True),
                    AddedToken("<sep>", rstrip=True, normalized=False),
                    AddedToken("(word)", single_word=True),
                    AddedToken("<think>", normalized=False), AddedToken("</think>"),
                    AddedToken("café")])
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True)])
    j = json.loads(tok.to_str())
    # The older merges form: one "a b" string per merge (byte-level tokens hold no spaces).
    j["model"]["merges"] = [m if isinstance(m, str) else " ".join(m) for m in j["model"]["merges"]]
    path = out_dir / "bytelevel.tokenizer.json"
    path.write_text(json.dumps(j, ensure_ascii=False, indent=1), encoding="utf-8")
    return path


DEEPSEEK_PATTERN = (r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?"""
                    r"""[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")


def train_nfc_splits(texts, out_dir):
    bos, eos = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\p{N}{1,3}"), "isolated"),
        pre_tokenizers.Split(Regex("[一-龥\u3040-ゟ゠-ヿ]+"), "isolated"),
        pre_tokenizers.Split(Regex(DEEPSEEK_PATTERN), "isolated"),
        pre_tokenizers.Split(Regex(r"[aeiouAEIOU]"), "merged_with_previous"),
        pre_tokenizers.Split(Regex(r"[A-Z]"), "merged_with_next"),
        pre_tokenizers.Split("--", "removed"),
        pre_tokenizers.Split(Regex(r"\s"), "contiguous", invert=True),
        pre_tokenizers.Split(Regex(r"q*(?=[.,;:])"), "isolated"),  # some matches are empty
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[bos, eos])
    tok.train_from_iterator(texts, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}", special_tokens=[(bos, tok.token_to_id(bos)),
                                                   (eos, tok.token_to_id(eos))])
    tok.add_tokens([AddedToken("café", normalized=True), AddedToken("<think>", normalized=False)])
    j = json.loads(tok.to_str())
    # ignore_merges: whole pre-tokens that are in the vocab are taken as they are. Add some that
    # the merges split, so that the flag changes ids; the added tokens outside the model's vocab
    # move after them, as HF numbers them on load.
    j["model"]["ignore_merges"] = True
    vocab = j["model"]["vocab"]
    next_id = len(vocab)
    words = {}
    for text in texts:
        for word, _ in tok.pre_tokenizer.pre_tokenize_str(tok.normalizer.normalize_str(text)):
            if word not in vocab and len(tok.model.tokenize(word)) > 1:
                words[word] = words.get(word, 0) + 1
    for word, _ in sorted(words.items(), key=lambda kv: (-kv[1], kv[0]))[:40]:
        vocab[word] = next_id
        next_id += 1
    for a in j["added_tokens"]:
        if a["content"] not in vocab:
            a["id"] = next_id
            next_id += 1
    path = out_dir / "nfc_splits.tokenizer.json"
    path.write_text(json.dumps(j, ensure_ascii=False, indent=1), encoding="utf-8")
    return path


def pre_tokens(tok, text):
    if tok.normalizer:
        text = tok.normalizer.normalize_str(text)
    return [piece for piece, _ in tok.pre_tokenizer.pre_tokenize_str(text)]


def expectations(name, path, cases, seed):
    tok = Tokenizer.from_file(str(path))  # reloaded: exactly what the C++ side reads
    out_cases = []
    for case_name, data in cases:
        text = data.decode("utf-8", "replace")
        ids = tok.encode(text, add_special_tokens=False).ids
        out_cases.append({
            "name": case_name,
            "input_hex": data.hex(),
            "pre_tokens": pre_tokens(tok, text),
            "ids": ids,
            "ids_with_special": tok.encode(text, add_special_tokens=True).ids,
            "decoded": tok.decode(ids, skip_special_tokens=False),
            "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
        })
    n = tok.get_vocab_size(with_added_tokens=True)
    rng = random.Random(seed)
    decode_cases = []
    for _ in range(200):  # arbitrary id sequences: bytes split mid-character, unknown ids
        ids = [rng.randrange(n + 8) for _ in range(rng.randint(1, 12))]
        decode_cases.append({"ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False),
                             "decoded_skip_special": tok.decode(ids, skip_special_tokens=True)})
    return {
        "name": name,
        "path": str(path),
        "vocab_size": n,
        "id_to_token": [tok.id_to_token(i) for i in range(n + 8)],
        "cases": out_cases,
        "decode_cases": decode_cases,
    }


def split_cases(cases):
    """One tiny tokenizer per Split (pattern, behavior, invert), its pre-tokens of every input:
    the behaviors and the regex engine's match iteration (empty matches too) piece by piece."""
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}
    texts = [data.decode("utf-8", "replace") for _, data in cases]
    out = []
    for pattern in ["a*", "(?=b)", "x?", r"\s+", r"\p{L}+", r"\s*[\r\n]+|\s+(?!\S)", "--"]:
        for behavior in ["isolated", "removed", "merged_with_previous", "merged_with_next",
                         "contiguous"]:
            for invert in [False, True]:
                tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
                split = pre_tokenizers.Split(pattern if pattern == "--" else Regex(pattern),
                                             behavior, invert=invert)
                tok.pre_tokenizer = split
                case = {"pattern": pattern, "behavior": behavior, "invert": invert,
                        "tokenizer_json": tok.to_str(),
                        "pre_tokens": [pre_tokens(tok, t) for t in texts]}
                if behavior == "isolated" and not invert:
                    # No ByteLevel and no decoder: characters outside the vocab are dropped (no
                    # unk token), decode joins the tokens with spaces.
                    ids = [tok.encode(t).ids for t in texts]
                    case["ids"] = ids
                    case["decoded"] = [tok.decode(i, skip_special_tokens=False) for i in ids]
                out.append(case)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source-dir", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    records = read_corpus(args.source_dir / "tests/tokenizer/corpus.txt")
    cases = records + generated_cases(records)
    train_texts = [body.decode("utf-8", "replace") for _, body in records] * 3

    kjv = args.source_dir / "models/kjv-dsa/tokenizer.json"
    result = {
        "tokenizers_version": tokenizers.__version__,
        "tokenizers": [
            expectations("kjv", kjv, cases, 1),
            expectations("bytelevel", train_bytelevel(train_texts, args.out), cases, 2),
            expectations("nfc_splits", train_nfc_splits(train_texts, args.out), cases, 3),
        ],
        "split_cases": split_cases(cases),
    }
    (args.out / "oracle.json").write_text(json.dumps(result, ensure_ascii=False), encoding="utf-8")
    print(f"oracle: tokenizers {tokenizers.__version__}, {len(cases)} inputs x "
          f"{len(result['tokenizers'])} tokenizers -> {args.out / 'oracle.json'}")


if __name__ == "__main__":
    main()
