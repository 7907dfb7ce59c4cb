#!/usr/bin/python3
"""Differential test of `exo chat-template` against Python jinja2 (the
reference: it is what transformers runs) and @huggingface/jinja.

For every template (the real HF templates in tests/fixtures/chat-templates and the
tokenizer_config.json files fetched by fetch_configs.sh) and every generated
conversation (system or not, multi-turn, tool calls with dict or string
arguments, tool results, reasoning_content, tools present or absent,
add_generation_prompt, enable_thinking true/false/absent) it renders the
prompt three ways and compares bytes. A case passes when exo's output equals
jinja2's, or when both fail (raise_exception or another template error).
Cases where @huggingface/jinja disagrees with jinja2 are counted and listed
separately (jinja2 wins; see tests/templates/README.md).

usage: run_diff.py EXO_BIN SHARED_TEMPLATES_DIR CONFIGS_DIR WORK_DIR [--no-node] [-v]
Prints "N passed, N failed" last; exit 0 iff nothing failed.
"""
import concurrent.futures
import copy
import json
import os
import shutil
import subprocess
import sys
import itertools

HERE = os.path.dirname(os.path.abspath(__file__))
NOW_ENV = "2024-07-26"

# special tokens for templates that come without a tokenizer_config.json
SPECIALS = [
    ("Qwen", {"bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}),
    ("deepseek", {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"}),
    ("google-gemma", {"bos_token": "<bos>", "eos_token": "<eos>"}),
    ("meta-llama", {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}),
    ("microsoft-Phi", {"bos_token": "<s>", "eos_token": "<|endoftext|>", "unk_token": "<unk>"}),
    ("mistralai", {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}),
    ("Mistral", {"bos_token": "<s>", "eos_token": "</s>"}),
    ("moonshotai", {"bos_token": "[BOS]", "eos_token": "[EOS]"}),
    ("openai", {"bos_token": "<|startoftext|>", "eos_token": "<|return|>"}),
    ("zai-org", {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}),
]

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name, e.g. \"Paris\""},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Unit", "default": "celsius"},
            "days": {"type": "integer", "description": "Forecast days"}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the web",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "description": "Query"},
            "tags": {"type": "array", "items": {"type": "string"}, "description": "Tags"},
            "limit": {"type": ["integer", "null"], "description": "Max results"},
            "opts": {"type": "object", "properties": {"safe": {"type": "boolean"}}, "description": "Options"},
            "score": {"type": "number"}},
            "required": ["query"]}}},
]


# template-specific kwargs, used where the template mentions every key
KWARG_SETS = [
    {"reasoning_effort": "high"},
    {"reasoning_effort": "low", "model_identity": "You are Exo, a test model."},
    {"builtin_tools": ["browser", "python"]},
    {"builtin_tools": ["code_interpreter", "brave_search", "wolfram_alpha"]},
    {"date_string": "01 Jan 2025"},
    {"tools_in_user_message": False},
    {"custom_tools": TOOLS},
    {"thinking": True},
    {"thinking": False},
]


def call(i, name, args, as_string):
    return {"id": f"call_{i}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False) if as_string else args}}


def conversations():
    sys_m = {"role": "system", "content": "You are a helpful assistant."}
    u1 = {"role": "user", "content": "Hello! What's the weather like in Paris?"}
    a1 = {"role": "assistant", "content": "Let me check that for you."}
    u2 = {"role": "user", "content": "And in Tokyo, please."}
    wargs = {"city": "Paris", "unit": "celsius"}
    conv = {
        "user": [u1],
        "system_user": [sys_m, u1],
        "multi_turn": [sys_m, u1, a1, u2],
        "multi_turn_nosys": [u1, a1, u2],
        "ends_assistant": [u1, {"role": "assistant", "content": "It is sunny, 21°C."}],
        "unicode": [{"role": "system", "content": "Réponds en français. 你好 🌍"},
                    {"role": "user", "content": "Quote \"this\" and 'that' \\ back\tslash\nnew line {{ not jinja }} {% neither %}"}],
        "empty_content": [{"role": "user", "content": ""}],
        "whitespace": [{"role": "user", "content": "  padded  \n\n"}],
    }
    for as_string in (False, True):
        sfx = "_strargs" if as_string else ""
        conv["tool_call" + sfx] = [
            sys_m, u1,
            {"role": "assistant", "content": "", "tool_calls": [call(0, "get_weather", wargs, as_string)]},
            {"role": "tool", "name": "get_weather", "tool_call_id": "call_0", "content": "{\"temp\": 21, \"sky\": \"sunny\"}"},
            {"role": "assistant", "content": "It is 21°C and sunny in Paris."}]
        conv["multi_tool" + sfx] = [
            u1,
            {"role": "assistant", "content": "Checking both.", "tool_calls": [
                call(0, "get_weather", wargs, as_string),
                call(1, "search", {"query": "Tokyo weather", "tags": ["a", "b"], "limit": None}, as_string)]},
            {"role": "tool", "name": "get_weather", "tool_call_id": "call_0", "content": "21"},
            {"role": "tool", "name": "search", "tool_call_id": "call_1", "content": "rainy"},
        ]
    conv["reasoning"] = [
        u1, {"role": "assistant", "content": "It is sunny.", "reasoning_content": "The user wants weather.\nI know it."},
        u2]
    conv["reasoning_last"] = [
        u1, {"role": "assistant", "content": "It is sunny.", "reasoning_content": "Think first."}]
    conv["think_tags"] = [
        u1, {"role": "assistant", "content": "<think>\nInline reasoning.\n</think>\n\nIt is sunny."}, u2]
    conv["thinking_field"] = [
        sys_m, u1, {"role": "assistant", "content": "Sunny.", "thinking": "User asks weather."}, u2]
    conv["tool_call_null_content"] = [
        u1, {"role": "assistant", "content": None, "tool_calls": [call(0, "get_weather", wargs, False)]},
        {"role": "tool", "tool_call_id": "call_0", "content": "21"}]
    conv["developer"] = [{"role": "developer", "content": "Be terse."}, u1]
    conv["tool_response_user"] = [
        {"role": "user", "content": "<tool_response>\nok\n</tool_response>"}, u2]
    conv["content_parts"] = [
        {"role": "user", "content": [{"type": "text", "text": "Describe"}, {"type": "text", "text": " this."}]}]
    return conv


def read_dir(d):
    """The template and special tokens exactly as transformers would see them."""
    cfg = {}
    p = os.path.join(d, "tokenizer_config.json")
    if os.path.exists(p):
        cfg = json.load(open(p, encoding="utf-8"))
    specials = {}
    for k in ("bos_token", "eos_token", "unk_token", "pad_token"):
        v = cfg.get(k)
        if isinstance(v, dict):
            v = v.get("content")
        if isinstance(v, str):
            specials[k] = v
    jp = os.path.join(d, "chat_template.jinja")
    if os.path.exists(jp):
        return {"default": open(jp, encoding="utf-8", newline="").read()}, specials
    ct = cfg.get("chat_template")
    if isinstance(ct, str):
        return {"default": ct}, specials
    if isinstance(ct, list):
        return {e["name"]: e["template"] for e in ct}, specials
    return None, specials


def setup_models(shared, configs, work):
    """One model dir per template: name -> dir."""
    models = {}
    mroot = os.path.join(work, "models")
    os.makedirs(mroot, exist_ok=True)
    for f in sorted(os.listdir(shared)) if os.path.isdir(shared) else []:
        if not f.endswith(".jinja"):
            continue
        name = f[:-6]
        d = os.path.join(mroot, "shared-" + name)
        os.makedirs(d, exist_ok=True)
        shutil.copyfile(os.path.join(shared, f), os.path.join(d, "chat_template.jinja"))
        sp = next((v for k, v in SPECIALS if name.startswith(k)), {})
        json.dump({k: v for k, v in sp.items()}, open(os.path.join(d, "tokenizer_config.json"), "w"))
        models["shared/" + name] = d
    if configs and os.path.isdir(configs):
        for name in sorted(os.listdir(configs)):
            src = os.path.join(configs, name, "tokenizer_config.json")
            if not os.path.exists(src):
                continue
            d = os.path.join(mroot, "config-" + name)
            os.makedirs(d, exist_ok=True)
            shutil.copyfile(src, os.path.join(d, "tokenizer_config.json"))
            tpl, _ = read_dir(d)
            if tpl is None:
                # GPT-OSS keeps its template next to the config (chat_template.jinja)
                gp = os.path.join(shared, "openai-gpt-oss-120b.jinja")
                if name == "gptoss" and os.path.exists(gp):
                    shutil.copyfile(gp, os.path.join(d, "chat_template.jinja"))
                else:
                    continue
            models["config/" + name] = d
    return models


def exo_command(exo, c, cdir):
    """The `exo chat-template` call of one case."""
    if "template_file" in c:
        cmd = [exo, "chat-template", c["dir"], "--template", c["template_file"],
               "--messages", c["messages_file"], "--kwargs", c["kwargs_file"]]
    else:
        cmd = [exo, "chat-template", c["dir"], "--messages", os.path.join(cdir, c["conv"] + ".json")]
    # the Jinja engine against jinja2 with the same inputs: earlier calls'
    # arguments as given (the API's adaptation for templates that cannot
    # take an object is checked in test_api_parser.c and the e2e suite)
    cmd.append("--raw-arguments")
    if c["tools"]:
        cmd += ["--tools", os.path.join(cdir, "tools.json")]
    if c["agp"]:
        cmd.append("--add-generation-prompt")
    if c["think"] is not None:
        cmd += ["--enable-thinking", "true" if c["think"] else "false"]
    if "kwargs_only" in c:
        cmd += ["--kwargs", c["kwargs_only"]]
    return cmd


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("-")]
    use_node = "--no-node" not in sys.argv
    verbose = "-v" in sys.argv
    exo, shared, configs, work = args[:4]
    os.makedirs(work, exist_ok=True)
    models = setup_models(shared, configs, work)
    convs = conversations()
    cases = []
    cdir = os.path.join(work, "cases")
    os.makedirs(cdir, exist_ok=True)
    json.dump(TOOLS, open(os.path.join(cdir, "tools.json"), "w"), ensure_ascii=False)
    for cname, msgs in convs.items():
        json.dump(msgs, open(os.path.join(cdir, cname + ".json"), "w"), ensure_ascii=False)
    for mname, d in models.items():
        templates, specials = read_dir(d)
        uses_thinking = any("enable_thinking" in t for t in templates.values())
        for cname, msgs in convs.items():
            for tools, agp, think in itertools.product((False, True), (False, True),
                                                      (None, False, True) if uses_thinking else (None,)):
                tname = "tool_use" if tools and "tool_use" in templates else ("default" if "default" in templates else next(iter(templates)))
                ctx = {"messages": copy.deepcopy(msgs), "tools": copy.deepcopy(TOOLS) if tools else None,
                       "documents": None, "add_generation_prompt": agp}
                ctx.update(specials)
                if think is not None:
                    ctx["enable_thinking"] = think
                cid = f"{mname}|{cname}|tools={int(tools)}|agp={int(agp)}|think={think}"
                cases.append({"id": cid, "dir": d, "conv": cname, "tools": tools, "agp": agp, "think": think,
                              "source": templates[tname], "context": ctx})
        for ki, kw in enumerate(KWARG_SETS):
            if not all(k in "".join(templates.values()) for k in kw):
                continue
            kpath = os.path.join(cdir, f"kwargs{ki}.json")
            json.dump(kw, open(kpath, "w"), ensure_ascii=False)
            for cname in ("system_user", "tool_call", "multi_tool_strargs", "reasoning"):
                for tools in (False, True):
                    tname = "tool_use" if tools and "tool_use" in templates else ("default" if "default" in templates else next(iter(templates)))
                    ctx = {"messages": copy.deepcopy(convs[cname]), "tools": copy.deepcopy(TOOLS) if tools else None,
                           "documents": None, "add_generation_prompt": True}
                    ctx.update(specials)
                    ctx.update(copy.deepcopy(kw))
                    cid = f"{mname}|{cname}|tools={int(tools)}|agp=1|kwargs={ki}"
                    cases.append({"id": cid, "dir": d, "conv": cname, "tools": tools, "agp": True, "think": None,
                                  "kwargs_only": kpath, "source": templates[tname], "context": ctx})
    # language-feature corpus: rendered with --template in a dir without config
    sys.path.insert(0, HERE)
    import features
    fdir = os.path.join(work, "features")
    empty = os.path.join(work, "empty-model")
    os.makedirs(fdir, exist_ok=True)
    os.makedirs(empty, exist_ok=True)
    for name, src, variables in features.CASES:
        tpath = os.path.join(fdir, name + ".jinja")
        with open(tpath, "w", encoding="utf-8", newline="") as f:
            f.write(src)
        kw = {k: v for k, v in variables.items() if k != "messages"}
        msgs = variables.get("messages", [])
        json.dump(msgs, open(os.path.join(fdir, name + ".messages.json"), "w"), ensure_ascii=False)
        json.dump(kw, open(os.path.join(fdir, name + ".kwargs.json"), "w"), ensure_ascii=False)
        ctx = {"messages": msgs, "tools": None, "documents": None, "add_generation_prompt": False}
        ctx.update(kw)
        cases.append({"id": "feature|" + name, "dir": empty, "template_file": tpath, "source": src, "context": ctx,
                      "messages_file": os.path.join(fdir, name + ".messages.json"),
                      "kwargs_file": os.path.join(fdir, name + ".kwargs.json"), "tools": False, "agp": False,
                      "think": None})
    batch = os.path.join(work, "batch.json")
    json.dump([{"id": c["id"], "source": c["source"], "context": c["context"]} for c in cases],
              open(batch, "w"), ensure_ascii=False)
    # the oracles (one process each) and exo (a process per case, ~30 ms of
    # start-up apiece) run side by side, exo's cases on every core
    py_out = os.path.join(work, "py.json")
    py = subprocess.Popen(["/usr/bin/python3", os.path.join(HERE, "oracle_jinja2.py"), batch, py_out])
    js = None
    if use_node:
        js_out = os.path.join(work, "js.json")
        js = subprocess.Popen(["node", os.path.join(HERE, "oracle_hfjinja.mjs"), batch, js_out],
                              env=dict(os.environ, TZ="UTC"))
    env = dict(os.environ, EXO_CHAT_TEMPLATE_NOW=NOW_ENV)
    with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        runs = list(pool.map(lambda c: subprocess.run(exo_command(exo, c, cdir), env=env, capture_output=True),
                             cases))
    if py.wait() != 0:
        print("the jinja2 oracle failed")
        print("0 passed, 1 failed")
        return 1
    ref = json.load(open(py_out, encoding="utf-8"))
    node = None
    if js is not None:
        if js.wait() == 0:
            node = json.load(open(js_out, encoding="utf-8"))
        else:
            print("warning: @huggingface/jinja oracle failed to run; comparing with jinja2 only")
    passed = failed = both_err = 0
    node_disagree = []
    per_model = {}
    fails = []
    for c, r in zip(cases, runs):
        exp = ref[c["id"]]
        if exp["ok"]:
            ok = r.returncode == 0 and r.stdout == exp["out"].encode("utf-8")
        else:
            # syntax errors fail at load (exit 1), render errors exit 3
            ok = r.returncode == 3 or ("SyntaxError" in exp["err"] and r.returncode == 1)
            # raise_exception's own message must come through
            if exp["err"].startswith("TemplateError: "):
                ok = ok and exp["err"][len("TemplateError: "):].encode("utf-8") in r.stderr
            both_err += ok
        st = per_model.setdefault(c["id"].split("|")[0], [0, 0])
        st[0 if ok else 1] += 1
        if ok:
            passed += 1
        else:
            failed += 1
            fails.append((c, exp, r))
        if node is not None:
            nj = node.get(c["id"])
            if nj is None or nj["ok"] != exp["ok"] or (exp["ok"] and nj["out"] != exp["out"]):
                node_disagree.append(c["id"])
    for m, (p, f) in per_model.items():
        print(f"  {m:55s} {p:4d} passed {f:4d} failed")
    for c, exp, r in fails[: (50 if verbose else 10)]:
        print(f"FAIL {c['id']}")
        if exp["ok"]:
            print("  expected:", json.dumps(exp["out"][:2000], ensure_ascii=False))
        else:
            print("  expected error:", exp["err"][:300])
        print("  exo rc", r.returncode, "stdout:", json.dumps(r.stdout.decode("utf-8", "replace")[:2000], ensure_ascii=False))
        if r.stderr:
            print("  exo stderr:", r.stderr.decode("utf-8", "replace")[:500])
    if node is not None:
        print(f"@huggingface/jinja disagrees with jinja2 on {len(node_disagree)} of {len(cases)} cases (jinja2 wins)")
        by_model = {}
        for cid in node_disagree:
            by_model.setdefault(cid.split("|")[0], []).append(cid)
        for m, ids in sorted(by_model.items()):
            print(f"  {m}: {len(ids)} (e.g. {ids[0]})")
    print(f"{len(models)} templates, {len(cases)} cases, {both_err} where both raise")
    print(f"{passed} passed, {failed} failed")
    return 0 if failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
