#!/usr/bin/env python3
"""The chat-template oracle: Python jinja2 renders what dsi::jinja renders, the way Hugging Face
transformers' apply_chat_template(tokenize=False) does, and writes the results as JSON for
tests/test_jinja_parity.cpp (JinjaParity.*).

The environment is transformers' (utils/chat_template_utils.py, _compile_jinja_template):
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) with the loopcontrols extension
and the {% generation %} tag, tojson replaced by json.dumps(ensure_ascii=False, ...), and the
raise_exception and strftime_now globals; strftime_now sees a fixed date so outputs are stable.
The variables are render_jinja_template's: messages, tools (None without tools), documents=None,
add_generation_prompt, the tokenizer's special tokens, then the extra keyword arguments.

  chat:   every template of templates/templates.json x every conversation x every variant of
          conversations.json;
  engine: the small templates of engine_cases.json (one construct each) with their variables.

Usage: oracle.py --source-dir REPO --out FILE
"""
import argparse
import datetime
import json
from pathlib import Path

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

FIXED_NOW = datetime.datetime(2025, 3, 7, 13, 5, 9)  # the C++ test injects the same date


class AssistantTracker(Extension):
    """transformers' {% generation %}...{% endgeneration %}: renders its body through a call block."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_generation_support"), [], [], body).set_lineno(lineno)

    @jinja2.pass_eval_context
    def _generation_support(self, context, caller):
        return caller()


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(format):
        return FIXED_NOW.strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def load_model_dir(path):
    """A model directory's template and special tokens, as transformers loads them."""
    config = {}
    if (path / "tokenizer_config.json").exists():
        config = json.loads((path / "tokenizer_config.json").read_text(encoding="utf-8"))
    if (path / "chat_template.jinja").exists():
        source = (path / "chat_template.jinja").read_text(encoding="utf-8")
    elif (path / "chat_template.json").exists():
        source = json.loads((path / "chat_template.json").read_text(encoding="utf-8"))["chat_template"]
    else:
        source = config["chat_template"]
    if isinstance(source, list):
        source = next(t["template"] for t in source if t["name"] == "default")
    special = {}
    for name in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"):
        token = config.get(name)
        if isinstance(token, dict):
            token = token.get("content")
        if token is not None:
            special[name] = token
    return source, special


def render(env, source, variables):
    """{"output": text} or {"error": "Type: message"}."""
    try:
        return {"output": env.from_string(source).render(**variables)}
    except Exception as e:  # the test only needs to know that jinja2 raised
        return {"error": f"{type(e).__name__}: {e}"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--source-dir", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    src = Path(args.source_dir)
    here = src / "tests" / "jinja"
    env = make_env()

    manifest = json.loads((here / "templates" / "templates.json").read_text(encoding="utf-8"))
    convs = json.loads((here / "conversations.json").read_text(encoding="utf-8"))
    chat = []
    for t in manifest["templates"]:
        if "model_dir" in t:
            source, special = load_model_dir(src / t["model_dir"])
        else:
            source = (src / t["file"]).read_text(encoding="utf-8")
            special = t.get("special_tokens", {})
        for conv in convs["conversations"]:
            for vi, variant in enumerate(convs["variants"]):
                variables = dict(special)
                variables.update(variant["kwargs"])
                variables.update(messages=conv["messages"], tools=conv.get("tools"), documents=None,
                                 add_generation_prompt=variant["add_generation_prompt"])
                result = render(env, source, variables)
                result.update(template=t["name"], conversation=conv["name"], variant=vi)
                chat.append(result)

    engine = []
    for case in json.loads((here / "engine_cases.json").read_text(encoding="utf-8"))["cases"]:
        result = render(env, case["template"], case.get("vars", {}))
        result["name"] = case["name"]
        engine.append(result)

    out = {"jinja2_version": jinja2.__version__, "chat": chat, "engine": engine}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    errors = sum("error" in r for r in chat)
    print(f"jinja2 {jinja2.__version__}: {len(chat)} chat renders ({errors} raised), "
          f"{len(engine)} engine cases -> {args.out}")


if __name__ == "__main__":
    main()
