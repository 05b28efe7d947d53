#!/usr/bin/env python3
"""Renders every tests/data/templates/*.jinja for every case of conversations.json with Python's
jinja2, set up as Hugging Face's apply_chat_template sets it up, and writes the golden outputs to
expected/<template>.<case>.txt (or <template>.<case>.error.txt holding the exception message when
the template raises). Run it from anywhere; the C++ tests only read the written files."""
import json
import os
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
FIXED_DATE = (2025, 3, 14)  # strftime_now renders this date so outputs are reproducible


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def strftime_now(fmt):
    import datetime
    return datetime.datetime(*FIXED_DATE, 12, 0, 0).strftime(fmt)


def make_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.filters["from_json"] = json.loads  # (llama.cpp's templates: DeepSeek-V3.2's)
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    with open(os.path.join(HERE, "conversations.json"), encoding="utf-8") as f:
        cases = json.load(f)
    out_dir = os.path.join(HERE, "expected")
    os.makedirs(out_dir, exist_ok=True)
    for name in os.listdir(out_dir):
        os.remove(os.path.join(out_dir, name))
    env = make_env()
    for file in sorted(os.listdir(HERE)):
        if not file.endswith(".jinja"):
            continue
        with open(os.path.join(HERE, file), encoding="utf-8") as f:
            template = env.from_string(f.read())
        stem = file[: -len(".jinja")]
        for case_name, case in cases.items():
            kwargs = dict(case.get("extra", {}))
            # As transformers' render_jinja_template: tools and documents are None when absent.
            kwargs.update(messages=case["messages"], tools=case.get("tools"), documents=None,
                          add_generation_prompt=case["add_generation_prompt"],
                          bos_token="<BOS>", eos_token="<EOS>")
            try:
                text, suffix = template.render(**kwargs), ".txt"
            except Exception as e:  # noqa: BLE001 - every template error is a golden outcome
                text, suffix = str(e), ".error.txt"
            with open(os.path.join(out_dir, f"{stem}.{case_name}{suffix}"), "w", encoding="utf-8",
                      newline="") as f:
                f.write(text)
            print(f"{stem}.{case_name}{suffix}")
    render_snippets(env)


def render_snippets(env):
    """Small templates exercising single engine features: expected/snippets.json maps each name
    to {"out": text} or {"error": message}."""
    with open(os.path.join(HERE, "snippets.json"), encoding="utf-8") as f:
        snippets = json.load(f)
    results = {}
    for name, snippet in snippets.items():
        try:
            results[name] = {"out": env.from_string(snippet["t"]).render(**snippet["v"])}
        except Exception as e:  # noqa: BLE001
            results[name] = {"error": str(e)}
    with open(os.path.join(HERE, "expected", "snippets.json"), "w", encoding="utf-8") as f:
        json.dump(results, f, ensure_ascii=False, indent=1)
        f.write("\n")


if __name__ == "__main__":
    sys.exit(main())
