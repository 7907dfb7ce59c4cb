#!/usr/bin/python3
"""Reference renderer: Python jinja2 configured exactly as transformers'
apply_chat_template configures it (ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks and loopcontrols; tojson as transformers defines
it; raise_exception; strftime_now pinned to a fixed date).

usage: oracle_jinja2.py BATCH.json OUT.json
BATCH is a list of {"id", "template" (path), "context"}; OUT maps each id to
{"ok": true, "out": text} or {"ok": false, "err": message}.
"""
import datetime
import json
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

NOW = datetime.datetime(2024, 7, 26, 0, 0, 0)


class AssistantTracker(jinja2.ext.Extension):
    # transformers' {% generation %} block; it only marks spans, renders the body
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_gen"), [], [], body).set_lineno(lineno)

    def _gen(self, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    return NOW.strftime(fmt)


def make_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    batch = json.load(open(sys.argv[1], encoding="utf-8"))
    env = make_env()
    cache = {}
    out = {}
    for case in batch:
        try:
            src = case.get("source")
            if src is None:
                path = case["template"]
                if path not in cache:
                    with open(path, encoding="utf-8", newline="") as f:
                        cache[path] = env.from_string(f.read())
                tpl = cache[path]
            else:
                if src not in cache:
                    cache[src] = env.from_string(src)
                tpl = cache[src]
            out[case["id"]] = {"ok": True, "out": tpl.render(**case["context"])}
        except Exception as e:  # noqa: BLE001 - any failure is a result
            out[case["id"]] = {"ok": False, "err": f"{type(e).__name__}: {e}"}
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
