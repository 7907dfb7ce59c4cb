/* `exo chat-template`: renders a model's chat template for a conversation
 * and prints the prompt exactly (no newline added), so templates can be
 * inspected and compared byte for byte with transformers' output. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/error.h"
#include "tokenizer/chat_template.h"

int exo_cmd_chat_template(int argc, char **argv);

static void usage(FILE *f)
{
    fprintf(f,
            "usage: exo chat-template DIR --messages FILE.json [--tools FILE.json]\n"
            "                         [--add-generation-prompt] [--enable-thinking true|false]\n"
            "                         [--kwargs FILE.json] [--template FILE.jinja] [--now EPOCH|YYYY-MM-DD]\n"
            "                         [--raw-arguments]\n"
            "  DIR holds chat_template.jinja and/or tokenizer_config.json.\n"
            "  --kwargs: a JSON object of extra template variables.\n"
            "  --template: use this template text instead of DIR's (DIR still gives bos/eos).\n"
            "  --now: pin strftime_now() (also env " EXO_CHAT_TEMPLATE_NOW_ENV ").\n"
            "  --raw-arguments: earlier tool calls' arguments exactly as given (by default a\n"
            "    template that cannot take them as an object gets their JSON text, as the API does).\n");
}

static json_t *load_json(const char *path, const char *what)
{
    json_error_t je;
    json_t *j = !strcmp(path, "-") ? json_loadf(stdin, JSON_DECODE_ANY, &je)
                                   : json_load_file(path, JSON_DECODE_ANY, &je);
    if (!j)
        fprintf(stderr, "exo chat-template: %s %s:%d: %s\n", what, path, je.line, je.text);
    return j;
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0;
    char *p = exo_malloc(cap);
    size_t k;
    while ((k = fread(p + n, 1, cap - n - 1, f)) > 0) {
        n += k;
        if (cap - n < 4096) {
            cap *= 2;
            p = exo_realloc(p, cap);
        }
    }
    fclose(f);
    p[n] = 0;
    return p;
}

int exo_cmd_chat_template(int argc, char **argv)
{
    const char *dir = NULL, *msgs_path = NULL, *tools_path = NULL, *kwargs_path = NULL;
    const char *thinking = NULL, *tpl_path = NULL, *now = NULL;
    bool agp = false, raw_args = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has_val = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--add-generation-prompt")) {
            agp = true;
        } else if (!strcmp(a, "--messages") && has_val) {
            msgs_path = argv[++i];
        } else if (!strcmp(a, "--tools") && has_val) {
            tools_path = argv[++i];
        } else if (!strcmp(a, "--kwargs") && has_val) {
            kwargs_path = argv[++i];
        } else if (!strcmp(a, "--enable-thinking") && has_val) {
            thinking = argv[++i];
        } else if (!strcmp(a, "--template") && has_val) {
            tpl_path = argv[++i];
        } else if (!strcmp(a, "--now") && has_val) {
            now = argv[++i];
        } else if (!strcmp(a, "--raw-arguments")) {
            raw_args = true;
        } else if (a[0] == '-') {
            fprintf(stderr, "exo chat-template: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        } else if (!dir) {
            dir = a;
        } else {
            fprintf(stderr, "exo chat-template: unexpected argument '%s'\n", a);
            return 2;
        }
    }
    if (!dir || !msgs_path) {
        usage(stderr);
        return 2;
    }
    if (thinking && strcmp(thinking, "true") && strcmp(thinking, "false")) {
        fprintf(stderr, "exo chat-template: --enable-thinking takes true or false\n");
        return 2;
    }
    int status = 1;
    json_t *messages = NULL, *tools = NULL, *kwargs = NULL;
    exo_chat_template *t = NULL;
    char *out = NULL;
    exo_err err = {0};
    if (!(messages = load_json(msgs_path, "messages")))
        goto done;
    if (tools_path && !(tools = load_json(tools_path, "tools")))
        goto done;
    if (kwargs_path) {
        if (!(kwargs = load_json(kwargs_path, "kwargs")))
            goto done;
        if (!json_is_object(kwargs)) {
            fprintf(stderr, "exo chat-template: --kwargs must hold a JSON object\n");
            goto done;
        }
    } else {
        kwargs = json_object();
    }
    if (thinking)
        json_object_set_new(kwargs, "enable_thinking", json_boolean(!strcmp(thinking, "true")));
    int rc;
    if (tpl_path) {
        char *src = slurp(tpl_path);
        if (!src) {
            fprintf(stderr, "exo chat-template: cannot read %s\n", tpl_path);
            goto done;
        }
        exo_chat_template *cfg = NULL;
        exo_err e2 = {0};
        /* bos/eos from DIR when it has a config */
        bool have_cfg = exo_chat_template_load(dir, &cfg, &e2) == 0;
        rc = exo_chat_template_from_string(src, have_cfg ? exo_chat_template_bos(cfg) : NULL,
                                           have_cfg ? exo_chat_template_eos(cfg) : NULL, &t, &err);
        exo_chat_template_free(cfg);
        exo_free(src);
    } else {
        rc = exo_chat_template_load(dir, &t, &err);
    }
    if (rc) {
        fprintf(stderr, "exo chat-template: %s\n", err.msg);
        goto done;
    }
    if (now) {
        int64_t e;
        if (exo_chat_template_parse_now(now, &e)) {
            fprintf(stderr, "exo chat-template: bad --now '%s'\n", now);
            goto done;
        }
        exo_chat_template_set_now(t, e);
    }
    if (raw_args)
        exo_chat_template_keep_arguments(t);
    rc = exo_chat_template_render(t, messages, tools, agp, kwargs, &out, &err);
    if (rc) {
        fprintf(stderr, "exo chat-template: %s\n", err.msg);
        status = 3;
        goto done;
    }
    fwrite(out, 1, strlen(out), stdout);
    status = fflush(stdout) ? 1 : 0;
done:
    exo_free(out);
    exo_chat_template_free(t);
    json_decref(messages);
    json_decref(tools);
    json_decref(kwargs);
    return status;
}
