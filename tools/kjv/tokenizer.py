"""The tokenizer: byte-level BPE shaped like the GLM / DeepSeek tokenizer.json files, plus the chat template.

tokenizer.json: no normalizer; pre_tokenizer Sequence[Split(<cl100k-style pattern with \\p{L} / \\p{N}
classes>, "isolated"), ByteLevel(add_prefix_space=false, use_regex=false)]; BPE model; ByteLevel decoder.
The BPE is trained on the training split only with vocab_size 4096 - 6: the 256 byte symbols and 3834
merges. The six special tokens are then added (as GLM does, at the end of the vocabulary), so
<|endoftext|> = 4090, [gMASK] = 4091, <sop> = 4092, <|system|> = 4093, <|user|> = 4094, <|assistant|> = 4095.

The chat template is GLM-style: "[gMASK]<sop>", then per message "<|role|>\\n" + content, and the
generation prompt "<|assistant|>\\n". It is written to chat_template.jinja and into tokenizer_config.json.
"""

import json

SPECIAL_TOKENS = ["<|endoftext|>", "[gMASK]", "<sop>", "<|system|>", "<|user|>", "<|assistant|>"]
EOS_TOKEN = "<|endoftext|>"
VOCAB_SIZE = 4096
# The GPT-4 (cl100k) pre-tokenisation pattern, as in the GLM-4/5 and DeepSeek-V3 tokenizer.json files.
SPLIT_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

CHAT_TEMPLATE = (
    "[gMASK]<sop>"
    "{%- for message in messages %}"
    "{%- if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{- raise_exception('unsupported role: ' ~ message['role']) }}"
    "{%- endif %}"
    "{{- '<|' ~ message['role'] ~ '|>\\n' ~ message['content'] }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|assistant|>\\n' }}{%- endif %}"
)

SAMPLE_CONVERSATION = [
    {"role": "system", "content": "You answer in the words of the King James Bible."},
    {"role": "user", "content": "How does the book of Genesis begin?"},
    {"role": "assistant", "content": "In the beginning God created the heaven and the earth."},
    {"role": "user", "content": "And then?"},
]
SAMPLE_RENDERED = (
    "[gMASK]<sop><|system|>\nYou answer in the words of the King James Bible."
    "<|user|>\nHow does the book of Genesis begin?"
    "<|assistant|>\nIn the beginning God created the heaven and the earth."
    "<|user|>\nAnd then?<|assistant|>\n"
)


def train_tokenizer(train_docs):
    """Train the BPE on the training documents; returns a tokenizers.Tokenizer with the specials added."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False, fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - len(SPECIAL_TOKENS), min_frequency=2, show_progress=False,
        special_tokens=[], initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(train_docs, trainer=trainer, length=len(train_docs))
    base = tok.get_vocab_size(with_added_tokens=False)
    if base != VOCAB_SIZE - len(SPECIAL_TOKENS):
        raise RuntimeError(f"BPE training produced {base} tokens, expected {VOCAB_SIZE - len(SPECIAL_TOKENS)}")
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    for i, t in enumerate(SPECIAL_TOKENS):
        if tok.token_to_id(t) != base + i:
            raise RuntimeError(f"special token {t} got id {tok.token_to_id(t)}, expected {base + i}")
    return tok


def tokenizer_json(tok):
    """The canonical tokenizer.json text (pretty-printed, as the released files are)."""
    return tok.to_str(pretty=True)


def special_ids(tok):
    """{token: id} for the special tokens."""
    return {t: tok.token_to_id(t) for t in SPECIAL_TOKENS}


def tokenizer_config(tok, max_length):
    """tokenizer_config.json as a dict (PreTrainedTokenizerFast, GLM-style specials and chat template)."""
    decoder = {}
    for t in SPECIAL_TOKENS:
        decoder[str(tok.token_to_id(t))] = {
            "content": t, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": True}
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": decoder,
        "extra_special_tokens": [t for t in SPECIAL_TOKENS if t != EOS_TOKEN],
        "eos_token": EOS_TOKEN,
        "pad_token": EOS_TOKEN,
        "clean_up_tokenization_spaces": False,
        "do_lower_case": False,
        "model_max_length": max_length,
        "padding_side": "left",
        "chat_template": CHAT_TEMPLATE,
    }


def render_chat(messages, add_generation_prompt):
    """Render CHAT_TEMPLATE with jinja2 the way transformers does (sandboxed, trim/lstrip blocks)."""
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(msg):
        raise TemplateError(msg)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(CHAT_TEMPLATE).render(messages=messages, add_generation_prompt=add_generation_prompt)


def check_tokenizer(tok, out_dir):
    """Unit checks: chat template render, special-token encoding, round trips, HF loading. Returns notes."""
    notes = {}
    rendered = render_chat(SAMPLE_CONVERSATION, add_generation_prompt=True)
    if rendered != SAMPLE_RENDERED:
        raise AssertionError(f"chat template renders {rendered!r}, expected {SAMPLE_RENDERED!r}")
    ids = tok.encode(rendered, add_special_tokens=False).ids
    sp = special_ids(tok)
    want_head = [sp["[gMASK]"], sp["<sop>"], sp["<|system|>"]]
    if ids[:3] != want_head or ids[-1] != tok.token_to_id("\u010a") or ids[-2] != sp["<|assistant|>"]:
        raise AssertionError(f"chat template tokens look wrong: {ids[:4]} ... {ids[-3:]}")
    if tok.decode(ids, skip_special_tokens=False) != rendered:
        raise AssertionError("chat sample does not round-trip through the tokenizer")
    notes["chat_template_sample_tokens"] = len(ids)
    try:
        from transformers import AutoTokenizer
    except ImportError:
        notes["transformers_check"] = "skipped (transformers not importable)"
        return notes
    hf = AutoTokenizer.from_pretrained(out_dir)
    hf_text = hf.apply_chat_template(SAMPLE_CONVERSATION, tokenize=False, add_generation_prompt=True)
    if hf_text != SAMPLE_RENDERED:
        raise AssertionError(f"transformers renders the chat template as {hf_text!r}")
    hf_ids = hf(rendered, add_special_tokens=False)["input_ids"]
    if list(hf_ids) != ids or hf.eos_token_id != sp[EOS_TOKEN]:
        raise AssertionError("transformers tokenizes the sample differently or has another eos id")
    notes["transformers_check"] = "ok (AutoTokenizer: same ids, same chat rendering, eos id)"
    return notes


def write_tokenizer_files(tok, out_dir, max_length):
    """Write tokenizer.json, tokenizer_config.json and chat_template.jinja into out_dir."""
    import os
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write(tokenizer_json(tok))
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer_config(tok, max_length), f, indent=2, ensure_ascii=False)
        f.write("\n")
    with open(os.path.join(out_dir, "chat_template.jinja"), "w", encoding="utf-8") as f:
        f.write(CHAT_TEMPLATE)
