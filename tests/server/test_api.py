"""Live tests of the OpenAI-compatible server with the official `openai` client and a real SSE
parser (httpx-sse): every endpoint and parameter, streaming format, 32 concurrent streams against
the same requests one at a time, client disconnects, bad input, and no leaked requests or pages.

Run by ctest (tests/server/server_tests.cmake) against `dsinfer serve` with the bundled model and
against the engine's test double; see conftest.py for the server fixture.
"""
import concurrent.futures
import json
import time

import pathlib

import httpx
import httpx_sse
import openai
import pytest

MODEL = "kjv-dsa"
MAX_MODEL_LEN = 512  # the servers run with --max-model-len 512
MODEL_DIR = pathlib.Path(__file__).resolve().parents[2] / "models" / MODEL


def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=600)


def sse_events(server, path, body):
    """POSTs a streaming request; returns the parsed `data:` payloads (the last must be [DONE])."""
    with httpx.Client(timeout=600) as http:
        with httpx_sse.connect_sse(http, "POST", server.url + path, json=body) as es:
            assert es.response.status_code == 200, es.response.read()
            assert es.response.headers["content-type"].startswith("text/event-stream")
            datas = [sse.data for sse in es.iter_sse()]
    assert datas and datas[-1] == "[DONE]", datas[-3:]
    chunks = [json.loads(d) for d in datas[:-1]]
    assert all("error" not in c for c in chunks), chunks
    return chunks


def completion_text(chunks):
    return "".join(c["choices"][0]["text"] for c in chunks if c["choices"])


def chat_text(chunks):
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


def test_health_and_models(server):
    assert httpx.get(server.url + "/health").status_code == 200
    models = client(server).models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert models.data[0].object == "model"
    raw = httpx.get(server.url + "/v1/models").json()
    assert raw["object"] == "list" and raw["data"][0]["max_model_len"] == MAX_MODEL_LEN


def test_completion(server):
    r = client(server).completions.create(model=MODEL, prompt="In the beginning God created",
                                          max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    assert r.object == "text_completion" and r.model == MODEL and r.id.startswith("cmpl-")
    assert len(r.choices) == 1 and r.choices[0].index == 0
    assert r.choices[0].finish_reason == "length"
    assert isinstance(r.choices[0].text, str) and r.choices[0].text
    assert r.usage.completion_tokens == 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + 12
    # Token-id prompts give the same continuation as the text they encode to, greedy.
    tok = client(server).completions.create(model=MODEL, prompt="In the beginning God created",
                                            max_tokens=1, temperature=0, logprobs=0)
    assert tok.usage.prompt_tokens == r.usage.prompt_tokens


def test_logit_bias(server):
    if server.fake:
        pytest.skip("the test double does not sample from logits")
    body = {"model": MODEL, "prompt": "In the beginning God created", "temperature": 0,
            "ignore_eos": True}
    plain = httpx.post(server.url + "/v1/completions", json=dict(body, max_tokens=3), timeout=600).json()
    # +100 on token 400 ("eth" in the bundled model's vocabulary) makes it every greedy choice.
    forced = dict(body, logit_bias={"400": 100})
    one = httpx.post(server.url + "/v1/completions", json=dict(forced, max_tokens=1), timeout=600).json()
    three = httpx.post(server.url + "/v1/completions", json=dict(forced, max_tokens=3), timeout=600).json()
    t = one["choices"][0]["text"]
    assert t and three["choices"][0]["text"] == t * 3 != plain["choices"][0]["text"]
    bad = httpx.post(server.url + "/v1/completions", json=dict(body, max_tokens=1, logit_bias={"9999999": 1}),
                     timeout=600)
    assert bad.status_code == 400 and "logit_bias" in bad.json()["error"]["message"]


def test_penalties(server):
    if server.fake:
        pytest.skip("the test double does not sample from logits")
    body = {"model": MODEL, "prompt": "In the beginning God created", "temperature": 0,
            "ignore_eos": True, "max_tokens": 24}
    plain = httpx.post(server.url + "/v1/completions", json=body, timeout=600).json()
    # Strong penalties on what was already said change a greedy continuation of 24 tokens.
    pen = httpx.post(server.url + "/v1/completions", timeout=600,
                     json=dict(body, presence_penalty=2, frequency_penalty=2, repetition_penalty=2)).json()
    assert pen["usage"]["completion_tokens"] == 24
    assert pen["choices"][0]["text"] != plain["choices"][0]["text"]
    bad = httpx.post(server.url + "/v1/completions", json=dict(body, repetition_penalty=0), timeout=600)
    assert bad.status_code == 400 and "repetition_penalty" in bad.json()["error"]["message"]


def test_n_choices(server):
    # n choices are n requests: choice i is what one request with seed + i gives, streamed or not.
    body = {"model": MODEL, "prompt": "And God said", "max_tokens": 10, "temperature": 1.0,
            "seed": 7, "ignore_eos": True}
    many = httpx.post(server.url + "/v1/completions", json=dict(body, n=3), timeout=600).json()
    assert [c["index"] for c in many["choices"]] == [0, 1, 2]
    assert all(c["finish_reason"] == "length" for c in many["choices"])
    assert many["usage"]["completion_tokens"] == 30
    singles = [httpx.post(server.url + "/v1/completions", json=dict(body, seed=7 + i), timeout=600).json()
               for i in range(3)]
    assert [c["text"] for c in many["choices"]] == [s["choices"][0]["text"] for s in singles]
    assert many["usage"]["prompt_tokens"] == singles[0]["usage"]["prompt_tokens"]
    chunks = sse_events(server, "/v1/completions",
                        dict(body, n=3, stream=True, stream_options={"include_usage": True}))
    texts, finished = ["", "", ""], [None, None, None]
    for c in chunks[:-1]:
        for ch in c["choices"]:
            texts[ch["index"]] += ch["text"]
            finished[ch["index"]] = ch["finish_reason"] or finished[ch["index"]]
    assert texts == [c["text"] for c in many["choices"]] and finished == ["length"] * 3
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 30
    chat = client(server).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Who made the light?"}], n=2, max_tokens=6,
        temperature=1.0, seed=3)
    assert [c.index for c in chat.choices] == [0, 1]
    bad = httpx.post(server.url + "/v1/completions", json=dict(body, n=17), timeout=600)
    assert bad.status_code == 400 and "'n'" in bad.json()["error"]["message"]


def test_batch_of_prompts(server):
    # A batch of prompts is each prompt's request at once: choice p * n + i is prompt p's choice i,
    # the same as a request of prompt p alone (same seed), streamed or not; usage counts each prompt.
    prompts = ["And God said", [1, 2, 3, 4], "In the beginning"]
    body = {"model": MODEL, "max_tokens": 6, "temperature": 1.0, "seed": 11, "ignore_eos": True, "n": 2}
    batch = httpx.post(server.url + "/v1/completions", json=dict(body, prompt=prompts), timeout=600).json()
    assert [c["index"] for c in batch["choices"]] == list(range(6))
    singles = [httpx.post(server.url + "/v1/completions", json=dict(body, prompt=p), timeout=600).json()
               for p in prompts]
    assert [c["text"] for c in batch["choices"]] == [c["text"] for s in singles for c in s["choices"]]
    assert batch["usage"]["prompt_tokens"] == sum(s["usage"]["prompt_tokens"] for s in singles)
    assert batch["usage"]["completion_tokens"] == 36
    chunks = sse_events(server, "/v1/completions",
                        dict(body, prompt=prompts, stream=True, stream_options={"include_usage": True}))
    texts = [""] * 6
    for c in chunks[:-1]:
        for ch in c["choices"]:
            texts[ch["index"]] += ch["text"]
    assert texts == [c["text"] for c in batch["choices"]]
    assert all(chunks[-1]["usage"][k] == batch["usage"][k] for k in ("prompt_tokens", "completion_tokens"))
    # echo: each choice starts with its own prompt's text.
    echo = httpx.post(server.url + "/v1/completions",
                      json=dict(body, prompt=["And God said", "Let there be"], echo=True, n=1), timeout=600).json()
    assert echo["choices"][0]["text"].startswith("And God said")
    assert echo["choices"][1]["text"].startswith("Let there be")
    # One prompt past the context refuses the whole batch, naming it.
    e = error_of(httpx.post(server.url + "/v1/completions",
                            json=dict(body, prompt=["x", " light" * 600]), timeout=60), 400)
    assert "prompt 1 of the batch" in e["message"] and str(MAX_MODEL_LEN) in e["message"]


def test_completion_stream_matches_non_stream(server):
    body = {"model": MODEL, "prompt": "And the earth was without form", "max_tokens": 24,
            "temperature": 0, "ignore_eos": True}
    full = httpx.post(server.url + "/v1/completions", json=body, timeout=600).json()
    chunks = sse_events(server, "/v1/completions",
                        dict(body, stream=True, stream_options={"include_usage": True}))
    assert completion_text(chunks) == full["choices"][0]["text"]
    ids = {c["id"] for c in chunks}
    assert len(ids) == 1 and ids.pop().startswith("cmpl-")
    # finish_reason only on the last chunk with a choice; then one usage chunk without choices.
    with_choices = [c for c in chunks if c["choices"]]
    assert [c["choices"][0]["finish_reason"] for c in with_choices[:-1]] == [None] * (len(with_choices) - 1)
    assert with_choices[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == full["usage"]
    assert all(c["usage"] is None for c in chunks[:-1])
    # Without include_usage there is no usage chunk; the openai client's stream agrees.
    args = {k: v for k, v in body.items() if k != "ignore_eos"}
    stream = client(server).completions.create(stream=True, extra_body={"ignore_eos": True}, **args)
    parts = list(stream)
    assert "".join(p.choices[0].text for p in parts) == full["choices"][0]["text"]
    assert all(p.usage is None for p in parts)


def test_chat(server):
    messages = [{"role": "system", "content": "Answer in the words of the King James Bible."},
                {"role": "user", "content": "Who made the light?"}]
    c = client(server)
    r = c.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=16,
                                  temperature=0, extra_body={"ignore_eos": True})
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 16
    text = r.choices[0].message.content
    stream = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0,
                                       stream=True, stream_options={"include_usage": True},
                                       extra_body={"ignore_eos": True})
    parts = list(stream)
    assert parts[0].choices[0].delta.role == "assistant"
    assert "".join(p.choices[0].delta.content or "" for p in parts if p.choices) == text
    assert parts[-1].usage.completion_tokens == 16 and parts[-1].choices == []
    assert parts[-2].choices[0].finish_reason == "length"
    # Raw SSE: chunk objects and the role chunk.
    chunks = sse_events(server, "/v1/chat/completions",
                        {"model": MODEL, "messages": messages, "max_tokens": 16, "temperature": 0,
                         "stream": True, "ignore_eos": True})
    assert all(ch["object"] == "chat.completion.chunk" for ch in chunks)
    assert chat_text(chunks) == text
    # chat_template_kwargs reach the template (an unused variable is accepted).
    k = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=4, temperature=0,
                                  extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert k.choices[0].message.content is not None
    # Content given as text parts renders like the plain string.
    parts_msg = [messages[0], {"role": "user", "content": [{"type": "text", "text": "Who made "},
                                                           {"type": "text", "text": "the light?"}]}]
    p = c.chat.completions.create(model=MODEL, messages=parts_msg, max_completion_tokens=16,
                                  temperature=0, extra_body={"ignore_eos": True})
    assert p.choices[0].message.content == text and p.usage.prompt_tokens == r.usage.prompt_tokens


def pick_stop(text):
    """A stop string of 4 printable ASCII characters from the middle of `text`."""
    for at in range(len(text) // 3, len(text) - 4):
        s = text[at:at + 4]
        if all(33 <= ord(ch) < 127 for ch in s):
            return s
    pytest.fail(f"no stop string to pick in {text!r}")


def test_stop_strings(server):
    c = client(server)
    base = dict(model=MODEL, prompt="Let there be light", max_tokens=48, temperature=0,
                extra_body={"ignore_eos": True})
    full = c.completions.create(**base).choices[0].text
    stop = pick_stop(full)
    want = full[:full.index(stop)]
    r = c.completions.create(stop=[stop, "\u0001never"], **base)
    assert r.choices[0].text == want and r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens < 48
    chunks = sse_events(server, "/v1/completions",
                        {"model": MODEL, "prompt": "Let there be light", "max_tokens": 48,
                         "temperature": 0, "ignore_eos": True, "stop": stop, "stream": True})
    assert completion_text(chunks) == want
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    # Chat too.
    messages = [{"role": "user", "content": "Let there be light"}]
    cfull = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=48, temperature=0,
                                      extra_body={"ignore_eos": True}).choices[0].message.content
    cstop = pick_stop(cfull)
    cr = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=48, temperature=0,
                                   stop=cstop, extra_body={"ignore_eos": True})
    assert cr.choices[0].message.content == cfull[:cfull.index(cstop)]
    assert cr.choices[0].finish_reason == "stop"


@pytest.fixture(scope="session")
def tokenizer():
    """The bundled model's tokenizer (HF tokenizers), to name token ids in requests."""
    import tokenizers
    return tokenizers.Tokenizer.from_file(str(MODEL_DIR / "tokenizer.json"))


def test_stop_token_ids(server, tokenizer):
    c = client(server)
    base = dict(model=MODEL, prompt="Blessed are the meek", max_tokens=20, temperature=0, logprobs=0)
    full = c.completions.create(extra_body={"ignore_eos": True}, **base)
    tokens = full.choices[0].logprobs.tokens
    assert len(tokens) == 20 and "".join(tokens) == full.choices[0].text
    # Stop on the ids whose text is that of the 6th token: generation ends at the first token
    # with that text (its text included), finish reason "stop".
    target = tokens[5]
    ids = [i for i in range(tokenizer.get_vocab_size()) if tokenizer.decode([i], skip_special_tokens=False) == target]
    assert ids, target
    first = tokens.index(target)
    r = c.completions.create(extra_body={"ignore_eos": True, "stop_token_ids": ids}, **base)
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == "".join(tokens[:first + 1])
    assert r.usage.completion_tokens == first + 1
    # Streamed, and in chat.
    chunks = sse_events(server, "/v1/completions", {"model": MODEL, "prompt": "Blessed are the meek",
                                                    "max_tokens": 20, "temperature": 0, "ignore_eos": True,
                                                    "stop_token_ids": ids, "stream": True})
    assert completion_text(chunks) == r.choices[0].text
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_sampling_seed_and_top_p(server):
    c = client(server)
    args = dict(model=MODEL, prompt="And God said", max_tokens=16, temperature=1.0, top_p=0.9,
                extra_body={"ignore_eos": True})
    a = c.completions.create(seed=1234, **args).choices[0].text
    b = c.completions.create(seed=1234, **args).choices[0].text
    assert a == b  # same seed, same tokens
    others = {c.completions.create(seed=s, **args).choices[0].text for s in range(1, 6)}
    assert len(others | {a}) > 1  # different seeds are not all the same


def test_completion_logprobs(server):
    r = httpx.post(server.url + "/v1/completions", timeout=600, json={
        "model": MODEL, "prompt": "In the beginning", "max_tokens": 8, "temperature": 0,
        "ignore_eos": True, "logprobs": 3}).json()
    lp = r["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == 8
    assert all(isinstance(x, float) and x <= 0 for x in lp["token_logprobs"])
    assert all(1 <= len(t) <= 4 for t in lp["top_logprobs"])
    # Greedy: the chosen token is the most likely of its alternatives.
    for tok, lpv, top in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"]):
        assert tok in top and abs(top[tok] - lpv) < 1e-5
        if not server.fake:
            assert lpv >= max(top.values()) - 1e-5
    assert lp["text_offset"] == sorted(lp["text_offset"]) and lp["text_offset"][0] == 0
    assert "".join(lp["tokens"]) == r["choices"][0]["text"]
    # The openai client reads the same structure.
    o = client(server).completions.create(model=MODEL, prompt="In the beginning", max_tokens=8,
                                          temperature=0, logprobs=3, extra_body={"ignore_eos": True})
    assert o.choices[0].logprobs.tokens == lp["tokens"]


def test_scoring_a_prompt(server, tokenizer):
    # echo + logprobs, as evaluation harnesses score a continuation (a batch of id lists,
    # max_tokens 1): every prompt token after the first gets its logprob under the tokens before it.
    if server.fake:
        pytest.skip("the test double does not score prompts")
    tok = tokenizer
    context = tok.encode("And God said, Let there be light", add_special_tokens=False).ids
    # The greedy next token after the context, and its logprob as a generated token.
    gen = httpx.post(server.url + "/v1/completions", timeout=600, json={
        "model": MODEL, "prompt": context, "max_tokens": 1, "temperature": 0, "logprobs": 2}).json()
    g_lp = gen["choices"][0]["logprobs"]["token_logprobs"][0]
    g_tok = gen["choices"][0]["logprobs"]["tokens"][0]
    g_id = [i for i in range(tok.get_vocab_size()) if tok.decode([i], skip_special_tokens=False) == g_tok][0]
    cont = tok.encode(": and there was light.", add_special_tokens=False).ids
    r = httpx.post(server.url + "/v1/completions", timeout=600, json={
        "model": MODEL, "prompt": [context + [g_id], context + cont], "max_tokens": 1, "temperature": 0,
        "echo": True, "logprobs": 1}).json()
    for choice, ids in zip(r["choices"], [context + [g_id], context + cont]):
        lp = choice["logprobs"]
        assert len(lp["tokens"]) == len(ids) + 1  # the prompt's tokens, then the one generated
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        assert all(x <= 0 for x in lp["token_logprobs"][1:])
        assert all(1 <= len(t) <= 2 for t in lp["top_logprobs"][1:])
        assert lp["text_offset"] == sorted(lp["text_offset"])
        assert choice["text"].startswith(tok.decode(ids, skip_special_tokens=True))
    # The scored greedy token is the generated one, with the same logprob.
    first = r["choices"][0]["logprobs"]
    assert abs(first["token_logprobs"][len(context)] - g_lp) < 1e-3
    assert first["tokens"][len(context)] == g_tok
    # In a stream: each choice's first chunk is the echoed prompt with its logprobs, then the
    # generated token's chunk (its offset after the prompt's text).
    chunks = {}
    with httpx.stream("POST", server.url + "/v1/completions", timeout=600, json={
            "model": MODEL, "prompt": [context + [g_id], context + cont], "max_tokens": 1, "temperature": 0,
            "echo": True, "logprobs": 1, "stream": True}) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for c in json.loads(line[6:])["choices"]:
                    chunks.setdefault(c["index"], []).append(c)
    for index, choice in enumerate(r["choices"]):
        got = [c for c in chunks[index] if c["logprobs"] is not None]
        assert got[0]["text"] + "".join(c["text"] for c in got[1:]) == choice["text"]
        streamed = {k: sum((c["logprobs"][k] for c in got), []) for k in ("tokens", "text_offset")}
        assert streamed["tokens"] == choice["logprobs"]["tokens"]
        assert streamed["text_offset"] == choice["logprobs"]["text_offset"]
        lps = sum((c["logprobs"]["token_logprobs"] for c in got), [])
        assert lps[0] is None
        assert all(abs(a - b) < 1e-4 for a, b in zip(lps[1:], choice["logprobs"]["token_logprobs"][1:]))


@pytest.mark.constrained
def test_json_mode(server):
    # response_format json_object: the answer is one JSON object (it can end only once the object
    # is closed; cut short by max_tokens it is a prefix of one).
    if server.fake:
        pytest.skip("the test double does not apply constraints")
    for seed in range(3):
        r = httpx.post(server.url + "/v1/completions", timeout=600, json={
            "model": MODEL, "prompt": "And God said", "max_tokens": 150, "temperature": 1.0, "seed": seed,
            "response_format": {"type": "json_object"}}).json()
        text = r["choices"][0]["text"]
        assert text.lstrip().startswith("{"), text
        if r["choices"][0]["finish_reason"] == "stop":
            assert isinstance(json.loads(text), dict), text
    chat = client(server).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Who made the light?"}], max_tokens=150,
        temperature=0.7, seed=1, response_format={"type": "json_object"})
    content = chat.choices[0].message.content
    assert content.lstrip().startswith("{"), content
    if chat.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(content), dict), content
    e = error_of(httpx.post(server.url + "/v1/completions", timeout=60, json={
        "prompt": "x", "response_format": {"type": "json_schema"}}), 400)
    assert e["param"] == "response_format"


VERSE_SCHEMA = {
    "type": "object",
    "properties": {
        "book": {"enum": ["Genesis", "Exodus", "Psalms"]},
        "chapter": {"type": "integer", "minimum": 1, "maximum": 150},
        "pages": {"type": "integer", "multipleOf": 3, "maximum": 300},
        "weight": {"type": "number", "exclusiveMinimum": 0, "maximum": 2.5},
        "verse": {"type": "string", "pattern": "^[1-9][0-9]?:[0-9]{1,3}$"},
        "when": {"type": "string", "format": "date"},
        "words": {"type": "array", "items": {"type": "string", "maxLength": 12, "pattern": "^\\w+$"},
                  "minItems": 1, "maxItems": 3, "uniqueItems": True},
        "note": {"anyOf": [{"type": "string", "maxLength": 20, "pattern": "[.!?]$"}, {"type": "null"}]},
    },
    "required": ["book", "chapter", "verse", "when", "words"],
    "additionalProperties": False,
}

COMPOSED_SCHEMA = {
    "$defs": {"base": {"type": "object", "properties": {"book": {"enum": ["Genesis", "Exodus"]}}, "required": ["book"]}},
    "allOf": [{"$ref": "#/$defs/base"}],
    "properties": {"chapter": {"type": "integer", "minimum": 1, "maximum": 50},
                   "verse": {"type": "integer", "minimum": 1, "maximum": 30}},
    "anyOf": [{"required": ["chapter"]}, {"required": ["verse"]}],
    "not": {"required": ["chapter", "verse"]},
    "unevaluatedProperties": False,
}


@pytest.mark.constrained
def test_json_schema(server):
    # response_format json_schema (structured outputs): a value the schema accepts, as the
    # jsonschema package reads it; a schema with what the server cannot enforce is a 400.
    import jsonschema
    if server.fake:
        pytest.skip("the test double does not apply constraints")
    fmt = {"type": "json_schema", "json_schema": {"name": "verse", "strict": True, "schema": VERSE_SCHEMA}}
    stopped = 0
    for seed in range(4):
        r = httpx.post(server.url + "/v1/completions", timeout=600, json={
            "model": MODEL, "prompt": "And God said", "max_tokens": 320, "temperature": 0.8, "seed": seed,
            "response_format": fmt}).json()
        text = r["choices"][0]["text"]
        assert text.startswith("{"), text
        if r["choices"][0]["finish_reason"] == "stop":
            stopped += 1
            jsonschema.validate(json.loads(text), VERSE_SCHEMA, format_checker=jsonschema.FormatChecker())
    assert stopped >= 1
    chat = client(server).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Which verse?"}], max_tokens=200, temperature=0.7,
        seed=1, response_format=fmt)
    if chat.choices[0].finish_reason == "stop":
        jsonschema.validate(json.loads(chat.choices[0].message.content), VERSE_SCHEMA,
                            format_checker=jsonschema.FormatChecker())
    # A composed schema: a $ref'd base through allOf, anyOf beside properties, not of required and
    # unevaluatedProperties (2020-12, as jsonschema's Draft202012Validator reads them).
    stopped = 0
    for seed in range(3):
        r = httpx.post(server.url + "/v1/completions", timeout=600, json={
            "model": MODEL, "prompt": "And God said", "max_tokens": 120, "temperature": 0.8, "seed": seed,
            "response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": COMPOSED_SCHEMA}}}).json()
        if r["choices"][0]["finish_reason"] == "stop":
            stopped += 1
            jsonschema.Draft202012Validator(COMPOSED_SCHEMA).validate(json.loads(r["choices"][0]["text"]))
    assert stopped >= 1
    e = error_of(httpx.post(server.url + "/v1/completions", timeout=60, json={
        "prompt": "x", "response_format": {"type": "json_schema", "json_schema": {
            "name": "n", "schema": {"type": "array", "items": {"not": {"minimum": 1}}}}}}), 400)
    assert e["param"] == "response_format" and "#/items/not: 'minimum' in it" in e["message"], e["message"]
    e = error_of(httpx.post(server.url + "/v1/completions", timeout=60, json={
        "prompt": "x", "response_format": {"type": "json_schema", "json_schema": {
            "name": "n", "schema": {"type": "string", "pattern": "(?=a)b"}}}}), 400)
    assert "#/pattern" in e["message"] and "lookaround" in e["message"], e["message"]


@pytest.mark.constrained
def test_structured_outputs_regex_and_choice(server):
    # vLLM's structured_outputs (and guided_*): a regular expression the whole answer matches (as
    # Python's re.fullmatch reads it), one of a list of choices; what cannot be enforced is a 400.
    import re
    if server.fake:
        pytest.skip("the test double does not apply constraints")
    regex = r"[A-Z][a-z]{2,8} [0-9]{1,3}:[0-9]{1,3}( and [a-z]{1,8})?\."
    stopped = 0
    for seed in range(3):
        r = httpx.post(server.url + "/v1/completions", timeout=600, json={
            "model": MODEL, "prompt": "And God said", "max_tokens": 40, "temperature": 0.9, "seed": seed,
            "structured_outputs": {"regex": regex}}).json()
        choice = r["choices"][0]
        if choice["finish_reason"] == "stop":
            stopped += 1
            assert re.fullmatch(regex, choice["text"]), choice["text"]
    assert stopped == 3  # the pattern's longest answer is shorter than max_tokens
    books = ["Genesis", "Exodus", "Leviticus 19:18"]
    chat = client(server).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Which book?"}], max_tokens=20, temperature=0.8, seed=2,
        extra_body={"structured_outputs": {"choice": books}})
    assert chat.choices[0].message.content in books and chat.choices[0].finish_reason == "stop"
    r = httpx.post(server.url + "/v1/completions", timeout=600, json={
        "model": MODEL, "prompt": "In the beginning", "max_tokens": 20, "temperature": 0, "guided_choice": books}).json()
    assert r["choices"][0]["text"] in books
    e = error_of(httpx.post(server.url + "/v1/completions", timeout=60, json={
        "prompt": "x", "structured_outputs": {"regex": "(a)\\1"}}), 400)
    assert e["param"] == "structured_outputs" and "back-reference" in e["message"], e["message"]
    e = error_of(httpx.post(server.url + "/v1/completions", timeout=60, json={
        "prompt": "x", "guided_grammar": "root ::= \"a\""}), 400)
    assert e["param"] == "guided_grammar" and "not supported" in e["message"]


FIND_VERSE = {"type": "function", "function": {"name": "find_verse", "strict": True, "parameters": {
    "type": "object",
    "properties": {"book": {"type": "string", "enum": ["Genesis", "Exodus", "Psalms"]},
                   "chapter": {"type": "integer", "minimum": 1, "maximum": 50},
                   "words": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3}},
    "required": ["book", "chapter"], "additionalProperties": False}}}
SAY = {"type": "function", "function": {"name": "say", "parameters": {
    "type": "object", "properties": {"text": {"type": "string", "maxLength": 30}}, "required": ["text"]}}}


@pytest.mark.constrained
def test_forced_tool_calls(server):
    # tool_choice "required" or a named function (the server reads GLM's call format here): the
    # answer is a call, read back by the openai client as message.tool_calls, of a declared
    # function with arguments its parameters schema accepts (jsonschema); parameters the server
    # cannot enforce are a 400.
    import jsonschema
    if server.fake:
        pytest.skip("the test double does not apply constraints")
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (FIND_VERSE, SAY)}
    for seed, choice in enumerate([{"type": "function", "function": {"name": "find_verse"}}, "required", "required"]):
        chat = client(server).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Where is the verse?"}], tools=[FIND_VERSE, SAY],
            tool_choice=choice, parallel_tool_calls=False, max_tokens=300, temperature=0.9, seed=seed)
        c = chat.choices[0]
        assert c.finish_reason == "tool_calls", chat
        assert len(c.message.tool_calls) == 1 and not c.message.content, chat
        for call in c.message.tool_calls:
            if isinstance(choice, dict):
                assert call.function.name == "find_verse"
            jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
    e = error_of(httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": "x"}], "tool_choice": "required",
        "tools": [{"type": "function", "function": {"name": "odd", "parameters": {
            "type": "object", "not": {"minProperties": 1}}}}]}), 400)
    assert e["param"] == "tools" and "odd" in e["message"], e["message"]


def test_chat_logprobs(server):
    r = client(server).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hear, O Israel"}], max_tokens=6,
        temperature=0, logprobs=True, top_logprobs=2, extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    assert len(content) == 6
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 2
        assert bytes(t.bytes).decode("utf-8", "replace") == t.token or "\ufffd" in t.token
        if not server.fake:
            assert t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob
            assert abs(t.top_logprobs[0].logprob - t.logprob) < 1e-5  # greedy picks the top one


def test_prefix_cache_serves_a_repeated_prompt(server):
    # A prompt of a few 64-token blocks, twice: the second request takes the first one's blocks
    # (usage.prompt_tokens_details.cached_tokens, as OpenAI reports it) and continues identically.
    prompt = ("Then Solomon gathered the elders of Israel, and all the heads of the tribes, the chief "
              "of the fathers of the children of Israel, unto king Solomon in Jerusalem, that they "
              "might bring up the ark of the covenant of the LORD out of the city of David, which is "
              "Zion. And all the men of Israel assembled themselves unto king Solomon at the feast "
              "in the month Ethanim, which is the seventh month.")
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True}
    first = httpx.post(server.url + "/v1/completions", json=body, timeout=600).json()
    second = httpx.post(server.url + "/v1/completions", json=body, timeout=600).json()
    n = first["usage"]["prompt_tokens"]
    assert second["choices"][0]["text"] == first["choices"][0]["text"]
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    if server.fake:
        assert cached == 0
        return
    assert n > 64 and cached == (n - 1) // 64 * 64, (n, cached)
    metrics = httpx.get(server.url + "/metrics", timeout=60).text
    hits = [line for line in metrics.splitlines() if line.startswith("dsinfer:prefix_cache_hits_total{")]
    assert len(hits) == 1 and float(hits[0].split()[-1]) >= cached


def test_concurrent_streams_match_sequential(server):
    n = 32
    bodies = [{"model": MODEL, "prompt": f"Verse {i}: and the LORD said", "max_tokens": 8 + i % 9,
               "temperature": 0, "ignore_eos": True} for i in range(n)]
    sequential = [httpx.post(server.url + "/v1/completions", json=b, timeout=600).json()["choices"][0]["text"]
                  for b in bodies]

    def run(b):
        return completion_text(sse_events(server, "/v1/completions", dict(b, stream=True)))

    with concurrent.futures.ThreadPoolExecutor(max_workers=n) as pool:
        concurrent_out = list(pool.map(run, bodies))
    assert concurrent_out == sequential


def wait_idle(server, timeout=120):
    deadline = time.time() + timeout
    while True:
        running = server.metric("dsinfer:num_requests_running")
        waiting = server.metric("dsinfer:num_requests_waiting")
        if running == 0 and waiting == 0:
            return
        assert time.time() < deadline, f"running {running}, waiting {waiting}"
        time.sleep(0.1)


def test_client_disconnect_cancels_request(server):
    wait_idle(server)
    aborted = server.metric("dsinfer:request_success_total", finished_reason="abort")
    for path, body in [("/v1/completions", {"prompt": "Blessed are the meek"}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Amen"}]})]:
        body = dict(body, model=MODEL, max_tokens=400, temperature=0, ignore_eos=True, stream=True)
        with httpx.Client(timeout=600) as http:
            with httpx_sse.connect_sse(http, "POST", server.url + path, json=body) as es:
                events = es.iter_sse()
                for _ in range(3):
                    next(events)
            # leaving the block closes the connection mid-stream
        wait_idle(server)
    # Both requests were cancelled (not run to their 400 tokens).
    assert server.metric("dsinfer:request_success_total", finished_reason="abort") == aborted + 2


def error_of(response, status):
    assert response.status_code == status, response.text
    e = response.json()["error"]
    assert set(e) == {"message", "type", "param", "code"}
    assert isinstance(e["message"], str) and e["message"]
    return e


BAD = [
    ("/v1/completions", "{not json", 400, None),
    ("/v1/chat/completions", "", 400, None),
    ("/v1/completions", {"prompt": "x", "max_tokens": "10"}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": 12}, 400, "prompt"),
    ("/v1/chat/completions", {"messages": "hi"}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}, 400, "temperature"),
    ("/v1/completions", {"prompt": "x", "stream": "yes"}, 400, "stream"),
    ("/v1/completions", {"prompt": "x", "n": 0}, 400, "n"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 17}, 400, "n"),
    ("/v1/completions", {"prompt": "x", "best_of": 2}, 400, "best_of"),
    ("/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("/v1/completions", {"prompt": ""}, 400, "prompt"),
    ("/v1/completions", {"prompt": "x", "max_tokens": -1}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 10**6}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 10**13}, 400, "max_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0}, 400,
     "max_completion_tokens"),
    ("/v1/completions", {"prompt": "x", "model": "gpt-4o"}, 404, "model"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "model": "nope"}, 404, "model"),
    ("/v1/completions", {"prompt": [1, 10**6]}, 400, "prompt"),
    ("/v1/chat/completions", {"messages": [{"role": "tool", "content": "x"}]}, 400, "messages"),
]


@pytest.mark.parametrize("path,body,status,param", BAD)
def test_bad_input(server, path, body, status, param):
    data = body if isinstance(body, str) else json.dumps(body)
    r = httpx.post(server.url + path, content=data, headers={"content-type": "application/json"}, timeout=60)
    e = error_of(r, status)
    assert e["param"] == param
    if param == "best_of":
        assert e["code"] == "unsupported"


def test_prompt_past_max_model_len(server):
    prompt = " light" * 600
    e = error_of(httpx.post(server.url + "/v1/completions", json={"model": MODEL, "prompt": prompt}, timeout=60), 400)
    assert str(MAX_MODEL_LEN) in e["message"] and "prompt has" in e["message"]
    assert e["code"] == "context_length_exceeded"
    long_chat = [{"role": "user", "content": prompt}]
    e = error_of(httpx.post(server.url + "/v1/chat/completions", json={"messages": long_chat}, timeout=60), 400)
    assert str(MAX_MODEL_LEN) in e["message"]
    # The openai client surfaces it as BadRequestError.
    with pytest.raises(openai.BadRequestError):
        client(server).completions.create(model=MODEL, prompt=prompt, max_tokens=4)
    with pytest.raises(openai.NotFoundError):
        client(server).completions.create(model="other", prompt="x", max_tokens=4)


def test_wrong_method_and_path(server):
    error_of(httpx.get(server.url + "/v1/completions"), 405)
    error_of(httpx.post(server.url + "/v1/models", json={}), 405)
    error_of(httpx.delete(server.url + "/v1/chat/completions"), 405)
    error_of(httpx.get(server.url + "/v1/embeddings"), 404)
    error_of(httpx.post(server.url + "/nothing", json={}), 404)


def test_zz_metrics_no_leaks(server):
    """Last (by name): nothing running or waiting, no KV pages held, every counter present."""
    wait_idle(server)
    m = server.metrics()
    names = {k.split("{", 1)[0] for k in m}
    for name in ["dsinfer:num_requests_running", "dsinfer:num_requests_waiting", "dsinfer:kv_cache_pages_used",
                 "dsinfer:kv_cache_pages_total", "dsinfer:kv_cache_usage_perc", "dsinfer:request_success_total",
                 "dsinfer:prompt_tokens_total", "dsinfer:generation_tokens_total",
                 "dsinfer:generation_tokens_per_second", "dsinfer:time_to_first_token_seconds_bucket",
                 "dsinfer:inter_token_latency_seconds_bucket", "dsinfer:e2e_request_latency_seconds_count",
                 "dsinfer:spec_decode_num_drafts_total", "dsinfer:spec_decode_num_draft_tokens_total",
                 "dsinfer:spec_decode_num_accepted_tokens_total"]:
        assert name in names, name
    assert server.metric("dsinfer:kv_cache_pages_used") == 0
    assert server.metric("dsinfer:num_requests_in_flight") == 0
    assert server.metric("dsinfer:kv_cache_pages_total") > 0
    assert server.metric("dsinfer:generation_tokens_total") > 0
    assert server.metric("dsinfer:request_success_total", finished_reason="length") > 0
    assert server.metric("dsinfer:time_to_first_token_seconds_count") > 0
