/* Unit tests of the Jinja interpreter: language features with expected
 * outputs (checked against Python jinja2 when written), error reporting with
 * line numbers, and the resource bounds that keep hostile templates from
 * hanging or exhausting memory. The byte-exact comparison with real
 * templates lives in tests/integration/test_chat_templates.sh. */
#include <criterion/criterion.h>
#include "test_tmpdir.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/jinja.h"

static char *render_opts(const char *src, const char *ctx_json, const exo_jinja_opts *o, int *rc, exo_err *err)
{
    exo_jinja_template *t = NULL;
    *rc = exo_jinja_parse(src, strlen(src), &t, err);
    if (*rc)
        return NULL;
    json_error_t je;
    json_t *ctx = ctx_json ? json_loads(ctx_json, 0, &je) : json_object();
    cr_assert(ctx, "bad test context: %s", je.text);
    char *out = NULL;
    *rc = exo_jinja_render(t, ctx, o, &out, NULL, err);
    json_decref(ctx);
    exo_jinja_free(t);
    return out;
}

static void check(const char *src, const char *ctx, const char *want)
{
    exo_err err = {0};
    int rc;
    exo_jinja_opts o = {.now = 1721952000};
    char *out = render_opts(src, ctx, &o, &rc, &err);
    cr_assert_eq(rc, 0, "template %s failed: %s", src, err.msg);
    cr_assert_str_eq(out, want, "template %s", src);
    exo_free(out);
}

static void check_err(const char *src, const char *ctx, int code, const char *msg_part)
{
    exo_err err = {0};
    int rc;
    char *out = render_opts(src, ctx, NULL, &rc, &err);
    exo_free(out);
    cr_assert_eq(rc, code, "template %s: rc %d (%s), want %d", src, rc, err.msg, code);
    cr_assert(strstr(err.msg, msg_part), "template %s: message '%s' lacks '%s'", src, err.msg, msg_part);
}

Test(jinja, text_and_output)
{
    check("hello", NULL, "hello");
    check("", NULL, "");
    check("a\n", NULL, "a");           /* keep_trailing_newline=False */
    check("a\n\n", NULL, "a\n");
    check("{{ 1 }}{{ 'x' }}{{ none }}{{ true }}", NULL, "1xNoneTrue");
    check("{{ x }}", "{\"x\": [1, \"a\", null, {\"k\": 1.5}]}", "[1, 'a', None, {'k': 1.5}]");
}

Test(jinja, whitespace_control)
{
    check("{% if true %}\nyes\n{% endif %}\nafter", NULL, "yes\nafter");
    check("  {% if true %}\n    x\n  {% endif %}\n", NULL, "    x\n");
    check("a   {%- if true -%}   b   {%- endif -%}   c", NULL, "abc");
    check("  {%+ if true %}\nq{% endif +%}\nr", NULL, "  q\nr");
    check("a\n  {# c #}\nb", NULL, "a\nb");
    check("a\r\nb{% if 1 %}\r\nc{% endif %}", NULL, "a\nbc");
    check("{% raw %}{{ x }}{% endraw %}", NULL, "{{ x }}");
}

Test(jinja, expressions)
{
    check("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 0.1 + 0.2 }}", NULL,
          "3 -4 2 3.5 1024 0.30000000000000004");
    check("{{ 1e16 }} {{ 1.0 }} {{ 1e-5 }}", NULL, "1e+16 1.0 1e-05");
    check("{{ 'a' ~ 1 ~ none }} {{ 'ab' * 2 }} {{ [1] + [2] }}", NULL, "a1None abab [1, 2]");
    check("{{ 1 < 2 < 3 }} {{ 'b' in 'abc' }} {{ 3 not in [1] }}", NULL, "True True True");
    check("{{ 0 or 'x' }} {{ 1 and 'y' }} {{ 'a' if false else 'b' }}", NULL, "x y b");
    check("{{ 'it\\'s' }} {{ \"q\\\"\" }} {{ '\\u00e9' }} {{ ['it\\'s'] }}", NULL, "it's q\" \xc3\xa9 [\"it's\"]");
}

Test(jinja, slices_and_access)
{
    const char *ctx = "{\"l\": [1, 2, 3], \"s\": \"h\\u00e9llo\", \"d\": {\"items\": 5, \"a\": {\"b\": 1}}}";
    check("{{ l[::-1] }} {{ l[1:] }} {{ l[-1] }} {{ s[::-1] }} {{ s[1] }} {{ s | length }}", ctx,
          "[3, 2, 1] [2, 3] 3 oll\xc3\xa9h \xc3\xa9 5");
    check("{{ d['items'] }} {{ d.a.b }} [{{ d.nope }}] [{{ l[10] }}]", ctx, "5 1 [] []");
}

Test(jinja, loops)
{
    check("{% for x in 'ab' %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}"
          "{{ loop.length }}{{ loop.revindex }}{{ loop.cycle('o','e') }} {% endfor %}",
          NULL, "10TrueFalse22o 21FalseTrue21e ");
    check("{% for x in [] %}x{% else %}empty{% endfor %}", NULL, "empty");
    check("{% for x in range(6) if x is even %}{{ x }}{{ loop.index }}{% endfor %}", NULL, "012243");
    check("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", "{\"d\": {\"a\": 1, \"b\": 2}}", "a=1;b=2;");
    check("{% for x in range(9) %}{% if x == 1 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}"
          "{% endif %}{{ x }}{% endfor %}",
          NULL, "023");
    /* set inside a loop does not leak; each iteration starts from outside */
    check("{% set x = 0 %}{% for i in [1,2] %}{{ x }}{% set x = i %}{% endfor %}{{ x }}", NULL, "000");
    check("{% set ns = namespace(n=0) %}{% for i in [1,2,3] %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}",
          NULL, "6");
}

Test(jinja, macros_and_blocks)
{
    check("{% macro g(n, s='Hi') %}{{ s }} {{ n }}{% endmacro %}{{ g('a') }}/{{ g('b', s='Yo') }}", NULL,
          "Hi a/Yo b");
    check("{% macro f(n) %}{% if n > 0 %}{{ n }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(3) }}", NULL, "321");
    check("{% macro w() %}[{{ caller() }}]{% endmacro %}{% call w() %}in{% endcall %}", NULL, "[in]");
    check("{% set b %}x{{ 1 }}{% endset %}{{ b }}", NULL, "x1");
    check("{% filter upper %}ab{% endfilter %}", NULL, "AB");
    check("{% set a, b = 1, 2 %}{{ a + b }}", NULL, "3");
}

Test(jinja, tests_and_filters)
{
    const char *ctx = "{\"u\": [{\"n\": \"b\", \"a\": true}, {\"n\": \"A\", \"a\": false}], \"d\": {\"b\": 1, \"a\": \"\\u00e9\"}}";
    check("{{ x is defined }} {{ u is sequence }} {{ d is mapping }} {{ 'a' is string }} {{ 1 is number }}"
          " {{ none is none }} {{ true is boolean }} {{ 2 is divisibleby 2 }}",
          ctx, "False True True True True True True True");
    check("{{ d | tojson }}|{{ d | tojson(indent=2) }}", ctx, "{\"b\": 1, \"a\": \"\xc3\xa9\"}|{\n  \"b\": 1,\n  \"a\": \"\xc3\xa9\"\n}");
    check("{{ u | selectattr('a') | map(attribute='n') | list }} {{ u | map(attribute='n') | sort | join(',') }}",
          ctx, "['b'] A,b");
    check("{{ ' x ' | trim }}|{{ 'ab' | upper }}|{{ 'a b' | title }}|{{ x | default('d') }}|{{ [3,1] | sort | first }}",
          ctx, "x|AB|A B|d|1");
    check("{{ 'a,b'.split(',') }} {{ '<x>'.startswith('<') }} {{ '\\nx\\n'.strip() }} {{ 'abc'.replace('b', 'B') }}",
          NULL, "['a', 'b'] True x aBc");
    check("{{ [1, 1, 2] | unique | list }} {{ '%s=%d' | format('a', 1) }} {{ 2.5 | round }} {{ '3' | int + 1 }}",
          NULL, "[1, 2] a=1 2.0 4");
}

Test(jinja, globals)
{
    check("{{ strftime_now('%Y-%m-%d') }}", NULL, "2024-07-26");
    check("{{ range(3) | list }} {{ dict(a=1) }}", NULL, "[0, 1, 2] {'a': 1}");
}

Test(jinja, syntax_errors_have_lines)
{
    check_err("a\nb\n{% if x %}\nno end", NULL, EXO_EFORMAT, "line 4");
    check_err("line1\n{{ 1 + }}", NULL, EXO_EFORMAT, "line 2");
    check_err("{% frob %}", NULL, EXO_EFORMAT, "unknown tag 'frob'");
    check_err("{{ 'abc }}", NULL, EXO_EFORMAT, "unterminated string");
    check_err("\n\n{% endfor %}", NULL, EXO_EFORMAT, "line 3");
    check_err("{% for x in y %}", NULL, EXO_EFORMAT, "endfor");
    char deep[4096] = "{{ ";
    for (int i = 0; i < 1000; i++)
        strcat(deep, "not ");
    strcat(deep, "1 }}");
    check_err(deep, NULL, EXO_EFORMAT, "too deep");
}

Test(jinja, runtime_errors_have_lines)
{
    check_err("ok\n{{ raise_exception('custom message') }}", NULL, EXO_EINVAL, "line 2: custom message");
    check_err("\n{{ nothing.attr }}", NULL, EXO_EINVAL, "line 2: 'nothing' is undefined");
    check_err("{{ 1 / 0 }}", NULL, EXO_EINVAL, "division by zero");
    check_err("{{ 1 + 'a' }}", NULL, EXO_EINVAL, "unsupported operand");
    check_err("{% for x in none %}{% endfor %}", NULL, EXO_EINVAL, "not iterable");
    check_err("{{ [1].append(2) }}", NULL, EXO_EINVAL, "undefined");
    check_err("{{ x | nosuchfilter }}", NULL, EXO_EINVAL, "no filter named 'nosuchfilter'");
}

Test(jinja, limits)
{
    exo_err err = {0};
    int rc;
    /* runaway recursion */
    check_err("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", NULL, EXO_ERANGE, "recursion");
    /* output size */
    exo_jinja_opts o = {.max_output = 1000};
    char *out = render_opts("{% for i in range(100000) %}xxxxxxxxxx{% endfor %}", NULL, &o, &rc, &err);
    cr_assert_eq(rc, EXO_ETOOBIG, "%s", err.msg);
    exo_free(out);
    out = render_opts("{{ 'x' * 100000 }}", NULL, &o, &rc, &err);
    cr_assert_eq(rc, EXO_ETOOBIG, "%s", err.msg);
    exo_free(out);
    /* steps: nested loops that would run for hours */
    exo_jinja_opts o2 = {.max_steps = 100000};
    out = render_opts("{% for a in range(1000000) %}{% for b in range(1000000) %}{% endfor %}{% endfor %}", NULL,
                      &o2, &rc, &err);
    cr_assert_eq(rc, EXO_ETOOBIG, "%s", err.msg);
    exo_free(out);
    /* deep values built in a loop are refused before they can overflow the stack */
    out = render_opts("{% set ns = namespace(x=[]) %}{% for i in range(2000) %}{% set ns.x = [ns.x] %}{% endfor %}",
                      NULL, NULL, &rc, &err);
    cr_assert_eq(rc, EXO_ETOOBIG, "%s", err.msg);
    exo_free(out);
    /* memory: values kept alive in a growing list are charged as produced */
    exo_jinja_opts o3 = {.max_output = 1 << 20};
    out = render_opts("{% set ns = namespace(l=[]) %}{% for i in range(100000) %}"
                      "{% set ns.l = ns.l + [('x' * 100000)[1:]] %}{% endfor %}{{ ns.l | length }}",
                      NULL, &o3, &rc, &err);
    cr_assert_eq(rc, EXO_ETOOBIG, "%s", err.msg);
    exo_free(out);
        /* a namespace cannot contain itself (no reference cycles) */
    check_err("{% set ns = namespace() %}{% set ns.me = [ns] %}", NULL, EXO_EINVAL, "itself");
}

static char *write_model_dir(const char *config, const char *jinja)
{
    char *dir = exo_malloc(64);
    test_tmpdir_make(dir, "jinja_test");
    char path[512];
    if (config) {
        snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
        FILE *f = fopen(path, "w");
        fputs(config, f);
        fclose(f);
    }
    if (jinja) {
        snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
        FILE *f = fopen(path, "w");
        fputs(jinja, f);
        fclose(f);
    }
    return dir;
}

static void remove_model_dir(char *dir)
{
    test_tmpdir_remove(dir);
    exo_free(dir);
}

static char *render_dir(const char *dir, const char *msgs, const char *tools, bool agp, const char *kw)
{
    exo_chat_template *t = NULL;
    exo_err err = {0};
    cr_assert_eq(exo_chat_template_load(dir, &t, &err), 0, "%s", err.msg);
    json_t *m = json_loads(msgs, 0, NULL), *tl = tools ? json_loads(tools, 0, NULL) : NULL;
    json_t *k = kw ? json_loads(kw, 0, NULL) : NULL;
    char *out = NULL;
    int rc = exo_chat_template_render(t, m, tl, agp, k, &out, &err);
    cr_assert_eq(rc, 0, "%s", err.msg);
    json_decref(m);
    json_decref(tl);
    json_decref(k);
    exo_chat_template_free(t);
    return out;
}

Test(chat_template, config_string_and_specials)
{
    char *dir = write_model_dir(
        "{\"bos_token\": {\"content\": \"<s>\", \"lstrip\": false}, \"eos_token\": \"</s>\", \"model_max_length\": "
        "1000000000000000019884624838656, \"chat_template\": \"{{ bos_token }}{% for m in messages %}[{{ m.role }}]"
        "{{ m.content }}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}{{ eos_token }}"
        "{{ tools is none }}{{ enable_thinking }}\"}",
        NULL);
    char *out = render_dir(dir, "[{\"role\": \"user\", \"content\": \"hi\"}]", NULL, true, "{\"enable_thinking\": false}");
    cr_assert_str_eq(out, "<s>[user]hi[assistant]</s>TrueFalse");
    exo_free(out);
    remove_model_dir(dir);
}

Test(chat_template, jinja_file_wins_and_named_list)
{
    char *dir = write_model_dir("{\"chat_template\": \"config\"}", "file{{ messages | length }}\n");
    char *out = render_dir(dir, "[{\"role\": \"user\", \"content\": \"hi\"}]", NULL, false, NULL);
    cr_assert_str_eq(out, "file1");
    exo_free(out);
    remove_model_dir(dir);

    dir = write_model_dir("{\"chat_template\": [{\"name\": \"default\", \"template\": \"D\"},"
                          " {\"name\": \"tool_use\", \"template\": \"T{{ tools | length }}\"}]}",
                          NULL);
    out = render_dir(dir, "[]", NULL, false, NULL);
    cr_assert_str_eq(out, "D");
    exo_free(out);
    out = render_dir(dir, "[]", "[{\"type\": \"function\"}]", false, NULL);
    cr_assert_str_eq(out, "T1");
    exo_free(out);
    remove_model_dir(dir);
}

Test(chat_template, missing_template)
{
    char *dir = write_model_dir("{\"eos_token\": \"</s>\"}", NULL);
    exo_chat_template *t = NULL;
    exo_err err = {0};
    cr_assert_eq(exo_chat_template_load(dir, &t, &err), EXO_ENOENT);
    remove_model_dir(dir);
}

Test(chat_template, pinned_now)
{
    int64_t e;
    cr_assert_eq(exo_chat_template_parse_now("2024-07-26", &e), 0);
    cr_assert_eq(e, 1721952000);
    cr_assert_eq(exo_chat_template_parse_now("1721952000", &e), 0);
    cr_assert_eq(e, 1721952000);
    cr_assert_neq(exo_chat_template_parse_now("yesterday", &e), 0);
    exo_chat_template *t = NULL;
    exo_err err = {0};
    cr_assert_eq(exo_chat_template_from_string("{{ strftime_now('%d %b %Y') }}", NULL, NULL, &t, &err), 0);
    exo_chat_template_set_now(t, 1721952000);
    json_t *m = json_array();
    char *out = NULL;
    cr_assert_eq(exo_chat_template_render(t, m, NULL, false, NULL, &out, &err), 0, "%s", err.msg);
    cr_assert_str_eq(out, "26 Jul 2024");
    exo_free(out);
    json_decref(m);
    exo_chat_template_free(t);
}

/* One parsed template is shared by concurrent requests: rendering must not
 * write to it (template literals have immortal reference counts). */

static exo_jinja_template *shared_tpl;

static void *render_many(void *arg)
{
    (void)arg;
    json_t *ctx = json_loads("{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", 0, NULL);
    for (int i = 0; i < 300; i++) {
        char *out = NULL;
        exo_err err = {0};
        if (exo_jinja_render(shared_tpl, ctx, NULL, &out, NULL, &err) != 0 || strcmp(out, "<user>hi</user>lit"))
            return (void *)1;
        exo_free(out);
    }
    json_decref(ctx);
    return NULL;
}

Test(jinja, concurrent_renders_share_template)
{
    const char *src = "{% set ns = namespace(x='lit') %}{% for m in messages %}{{ '<' ~ m.role ~ '>' }}{{ m.content }}"
                      "{{ '</' + m.role + '>' }}{% endfor %}{{ ns.x }}";
    exo_err err = {0};
    cr_assert_eq(exo_jinja_parse(src, strlen(src), &shared_tpl, &err), 0, "%s", err.msg);
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&th[i], NULL, render_many, NULL);
    for (int i = 0; i < 4; i++) {
        void *r;
        pthread_join(th[i], &r);
        cr_assert_null(r);
    }
    exo_jinja_free(shared_tpl);
}
