/* Output parser: reasoning tags, each tool-call family, stop sequences and
 * schema checks, with the model output split at every byte position (and fed
 * byte by byte) so markers that span tokens are exercised everywhere. The
 * format detection runs on the real chat templates in
 * tests/fixtures/chat-templates, and a call parsed from each family's output
 * goes through the four API encoders. */
#include "api/api.h"
#include "core/alloc.h"
#include "core/json_util.h"
#include "runner/output_parser.h"
#include "core/sbuf.h"
#include "tokenizer/chat_template.h"

#include <criterion/criterion.h>
#include <string.h>

typedef struct coll {
    exo_sbuf text, think;
    json_t  *calls;
    exo_sbuf ids;      /* the calls' ids that are not random call_ ones, space-separated */
    int      n_token_chunks;
    int      n_logprob_entries;
    int32_t  lp_ids[16];
} coll;

static void collect(void *ctx, const exo_chunk *c)
{
    coll *k = ctx;
    if (c->kind == EXO_CHUNK_TOKEN) {
        exo_sbuf_puts(c->is_thinking ? &k->think : &k->text, c->text);
        k->n_token_chunks++;
        if (c->has_logprob && k->n_logprob_entries < 16)
            k->lp_ids[k->n_logprob_entries++] = c->token_id;
    } else if (c->kind == EXO_CHUNK_TOOL_CALLS) {
        for (int i = 0; i < c->n_tool_calls; i++) {
            if (strncmp(c->tool_calls[i].id, "call_", 5)) { /* the model's own (Kimi's) */
                exo_sbuf_puts(&k->ids, c->tool_calls[i].id);
                exo_sbuf_puts(&k->ids, " ");
            }
            json_t *args = json_loads(c->tool_calls[i].arguments, 0, NULL);
            cr_assert(args, "arguments must be JSON: %s", c->tool_calls[i].arguments);
            json_array_append_new(k->calls, json_pack("{s:s, s:o}", "name", c->tool_calls[i].name, "args", args));
        }
    }
}

static const char *weather_tools =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"}},\"required\":[\"city\"]}}}]";

typedef struct expect {
    const char *text, *think;
    const char *calls; /* JSON array of {name, args} or NULL for none */
    const char *ids;   /* the model's own call ids kept, "a b " (NULL: none; else random call_ ids) */
    exo_finish_reason reason;
    bool stopped;
} expect;

static void check_one(const exo_output_parser_config *cfg, const char *out, const size_t *cuts, int n_cuts,
                      const expect *ex, const char *what)
{
    coll k = {.calls = json_array()};
    exo_sbuf_init(&k.text);
    exo_sbuf_init(&k.think);
    exo_sbuf_init(&k.ids);
    exo_output_parser *p = exo_output_parser_create(cfg);
    size_t prev = 0, n = strlen(out);
    bool stopped = false;
    for (int i = 0; i <= n_cuts && !stopped; i++) {
        size_t end = i < n_cuts ? cuts[i] : n;
        exo_chunk tok;
        exo_chunk_token(&tok, out + prev, end - prev, 7, false);
        tok.has_logprob = true;
        tok.logprob = -0.5f;
        stopped = exo_output_parser_feed(p, &tok, collect, &k);
        exo_chunk_free(&tok);
        prev = end;
    }
    exo_finish_reason r = exo_output_parser_finish(p, stopped ? EXO_FR_STOP : EXO_FR_STOP, collect, &k);
    exo_output_parser_free(p);
    cr_assert_str_eq(k.text.data ? k.text.data : "", ex->text, "%s: text", what);
    cr_assert_str_eq(k.think.data ? k.think.data : "", ex->think ? ex->think : "", "%s: thinking", what);
    json_t *want = json_loads(ex->calls ? ex->calls : "[]", 0, NULL);
    cr_assert(want);
    char *got = exo_json_dumps(k.calls, JSON_SORT_KEYS | JSON_COMPACT);
    cr_assert(json_equal(want, k.calls), "%s: calls %s", what, got);
    free(got);
    cr_assert_str_eq(k.ids.data ? k.ids.data : "", ex->ids ? ex->ids : "", "%s: call ids", what);
    exo_sbuf_free(&k.ids);
    cr_assert_eq(r, ex->reason, "%s: reason %d", what, r);
    cr_assert_eq(stopped, ex->stopped, "%s: stopped", what);
    json_decref(want);
    json_decref(k.calls);
    exo_sbuf_free(&k.text);
    exo_sbuf_free(&k.think);
}

/* Every 2-way split, every 3-way split on a coarse grid, and byte by byte. */
static void check_splits(const exo_output_parser_config *cfg, const char *out, const expect *ex)
{
    size_t n = strlen(out);
    char what[64];
    for (size_t i = 0; i <= n; i++) {
        snprintf(what, sizeof what, "split at %zu", i);
        check_one(cfg, out, &i, 1, ex, what);
    }
    for (size_t i = 0; i <= n; i += 3)
        for (size_t j = i; j <= n; j += 5) {
            size_t c[2] = {i, j};
            snprintf(what, sizeof what, "split at %zu,%zu", i, j);
            check_one(cfg, out, c, 2, ex, what);
        }
    size_t *bytes = malloc(sizeof *bytes * (n + 1));
    for (size_t i = 0; i < n; i++)
        bytes[i] = i + 1;
    check_one(cfg, out, bytes, n ? (int)n - 1 : 0, ex, "byte by byte");
    free(bytes);
}

Test(api_parser, think_tags)
{
    exo_output_parser_config cfg = {.think_start = "<think>", .think_end = "</think>"};
    expect ex = {.text = "\n\nThe answer is 4.", .think = "2+2 is 4", .reason = EXO_FR_STOP};
    check_splits(&cfg, "<think>2+2 is 4</think>\n\nThe answer is 4.", &ex);
}

Test(api_parser, starts_in_thinking)
{
    exo_output_parser_config cfg = {.think_start = "<think>", .think_end = "</think>", .starts_in_thinking = true};
    expect ex = {.text = "Paris.", .think = "capital of France", .reason = EXO_FR_STOP};
    check_splits(&cfg, "capital of France</think>Paris.", &ex);
}

Test(api_parser, unterminated_tag_prefix_is_text)
{
    exo_output_parser_config cfg = {.think_start = "<think>", .think_end = "</think>"};
    expect ex = {.text = "a <thin", .reason = EXO_FR_STOP};
    check_splits(&cfg, "a <thin", &ex);
}

Test(api_parser, hermes_tool_call_with_coercion)
{
    json_t *tools = json_loads(weather_tools, 0, NULL);
    exo_output_parser_config cfg = {.tool_format = EXO_TOOL_FMT_HERMES, .think_start = "<think>",
                                    .think_end = "</think>", .tools = tools};
    expect ex = {.text = "Checking.\n", .think = "need weather",
                 .calls = "[{\"name\":\"get_weather\",\"args\":{\"city\":\"Paris\",\"days\":3}}]",
                 .reason = EXO_FR_TOOL_CALLS};
    check_splits(&cfg,
                 "<think>need weather</think>Checking.\n<tool_call>\n{\"name\": \"get_weather\", "
                 "\"arguments\": {\"city\": \"Paris\", \"days\": \"3\"}}\n</tool_call>",
                 &ex);
    json_decref(tools);
}

Test(api_parser, hermes_two_calls)
{
    json_t *tools = json_loads(weather_tools, 0, NULL);
    exo_output_parser_config cfg = {.tool_format = EXO_TOOL_FMT_HERMES, .tools = tools};
    expect ex = {.text = "\n",
                 .calls = "[{\"name\":\"get_weather\",\"args\":{\"city\":\"A\"}},"
                          "{\"name\":\"get_weather\",\"args\":{\"city\":\"B\"}}]",
                 .reason = EXO_FR_TOOL_CALLS};
    check_splits(&cfg,
                 "<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"city\":\"A\"}}</tool_call>\n"
                 "<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"city\":\"B\"}}</tool_call>",
                 &ex);
    json_decref(tools);
}

Test(api_parser, hermes_invalid_calls_stay_text)
{
    json_t *tools = json_loads(weather_tools, 0, NULL);
    exo_output_parser_config cfg = {.tool_format = EXO_TOOL_FMT_HERMES, .tools = tools};
    const char *unknown = "<tool_call>{\"name\":\"launch\",\"arguments\":{}}</tool_call>";
    expect ex = {.text = unknown, .reason = EXO_FR_STOP};
    check_one(&cfg, unknown, NULL, 0, &ex, "unknown tool");
    const char *missing = "<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"days\":2}}</tool_call>";
    ex.text = missing;
    check_one(&cfg, missing, NULL, 0, &ex, "missing required");
    const char *badtype = "<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"city\":\"x\",\"days\":\"many\"}}</tool_call>";
    ex.text = badtype;
    check_one(&cfg, badtype, NULL, 0, &ex, "bad type");
    const char *broken = "<tool_call>{\"name\": \"get_weather\", \"arguments\": {</tool_call>";
    ex.text = broken;
    check_splits(&cfg, broken, &ex);
    const char *unterminated = "ok <tool_call>{\"name\": \"get_weather\"";
    ex.text = unterminated;
    check_splits(&cfg, unterminated, &ex);
    json_decref(tools);
}

Test(api_parser, no_tools_no_parsing)
{
    exo_output_parser_config cfg = {.tool_format = EXO_TOOL_FMT_HERMES};
    const char *s = "<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"city\":\"A\"}}</tool_call>";
    expect ex = {.text = s, .reason = EXO_FR_STOP};
    check_one(&cfg, s, NULL, 0, &ex, "no tools");
}

Test(api_parser, llama3_json_calls)
{
    json_t *tools = json_loads(weather_tools, 0, NULL);
    exo_output_parser_config cfg = {.tool_format = EXO_TOOL_FMT_LLAMA3, .tools = tools};
    expect ex = {.text = "", .calls = "[{\"name\":\"get_weather\",\"args\":{\"city\":\"Oslo\"}}]",
                 .reason = EXO_FR_TOOL_CALLS};
    check_splits(&cfg, " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}", &ex);
    check_splits(&cfg, "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}", &ex);
    expect plain = {.text = "Hello {there}", .reason = EXO_FR_STOP};
    check_splits(&cfg, "Hello {there}", &plain);
    expect json_answer = {.text = "{\"answer\": 42}", .reason = EXO_FR_STOP};
    check_splits(&cfg, "{\"answer\": 42}", &json_answer);
    json_decref(tools);
}

#define DS_CB "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DS_CE "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DS_B  "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DS_E  "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DS_S  "<\xef\xbd\x9ctool\xe2\x96\x81" "sep\xef\xbd\x9c>"

Test(api_parser, deepseek_v3_calls)
{
    json_t *tools = json_loads(weather_tools, 0, NULL);
    exo_output_parser_config cfg = {.tool_format = EXO_TOOL_FMT_DEEPSEEK_V3, .tools = tools};
    expect ex = {.text = "Sure.", .calls = "[{\"name\":\"get_weather\",\"args\":{\"city\":\"Rome\"}}]",
                 .reason = EXO_FR_TOOL_CALLS};
    check_splits(&cfg, "Sure." DS_CB DS_B "function" DS_S "get_weather\n```json\n{\"city\": \"Rome\"}\n```" DS_E DS_CE, &ex);
    check_splits(&cfg, "Sure." DS_CB DS_B "get_weather" DS_S "{\"city\": \"Rome\"}" DS_E DS_CE, &ex);
    json_decref(tools);
}

Test(api_parser, harmony_channels_and_call)
{
    json_t *tools = json_loads(weather_tools, 0, NULL);
    exo_output_parser_config cfg = {.tool_format = EXO_TOOL_FMT_HARMONY, .tools = tools};
    expect ex = {.text = "It is sunny.", .think = "User asks weather.", .reason = EXO_FR_STOP};
    check_splits(&cfg,
                 "<|channel|>analysis<|message|>User asks weather.<|end|><|start|>assistant"
                 "<|channel|>final<|message|>It is sunny.<|return|>",
                 &ex);
    expect call = {.text = "", .think = "Need the tool.",
                   .calls = "[{\"name\":\"get_weather\",\"args\":{\"city\":\"SF\"}}]", .reason = EXO_FR_TOOL_CALLS};
    check_splits(&cfg,
                 "<|channel|>analysis<|message|>Need the tool.<|end|><|start|>assistant<|channel|>commentary "
                 "to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"SF\"}<|call|>",
                 &call);
    /* the engine does not feed <|call|> (an EOS id): complete arguments still make a call */
    check_splits(&cfg,
                 "<|channel|>analysis<|message|>Need the tool.<|end|><|start|>assistant<|channel|>commentary "
                 "to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"SF\"}",
                 &call);
    expect truncated = {.text = "{\"city\":\"S", .reason = EXO_FR_STOP};
    check_splits(&cfg, "<|channel|>commentary to=functions.get_weather<|message|>{\"city\":\"S", &truncated);
    json_decref(tools);
}

Test(api_parser, stop_sequences_never_leak)
{
    const char *stops[] = {"END", "<|im_end|>"};
    exo_output_parser_config cfg = {.stop = stops, .n_stop = 2};
    expect ex = {.text = "Hello ", .reason = EXO_FR_STOP, .stopped = true};
    check_splits(&cfg, "Hello END world", &ex);
    check_splits(&cfg, "Hello <|im_end|> trailing", &ex);
    expect partial = {.text = "abc EN", .reason = EXO_FR_STOP};
    check_splits(&cfg, "abc EN", &partial);
    exo_output_parser *p = exo_output_parser_create(&cfg);
    exo_chunk t;
    exo_chunk_token(&t, "x<|im_end|>", 11, 1, false);
    coll k = {.calls = json_array()};
    exo_sbuf_init(&k.text);
    exo_sbuf_init(&k.think);
    exo_sbuf_init(&k.ids);
    cr_assert(exo_output_parser_feed(p, &t, collect, &k));
    cr_assert_str_eq(exo_output_parser_stop_sequence(p), "<|im_end|>");
    exo_chunk_free(&t);
    exo_output_parser_free(p);
    json_decref(k.calls);
    exo_sbuf_free(&k.text);
    exo_sbuf_free(&k.think);
}

Test(api_parser, stop_inside_thinking_output)
{
    const char *stops[] = {"STOP"};
    exo_output_parser_config cfg = {.think_start = "<think>", .think_end = "</think>", .stop = stops, .n_stop = 1};
    expect ex = {.text = "ans", .think = "t", .reason = EXO_FR_STOP, .stopped = true};
    check_splits(&cfg, "<think>t</think>ansSTOPmore", &ex);
}

Test(api_parser, metadata_rides_on_first_chunk)
{
    exo_output_parser_config cfg = {.think_start = "<think>", .think_end = "</think>"};
    exo_output_parser *p = exo_output_parser_create(&cfg);
    coll k = {.calls = json_array()};
    exo_sbuf_init(&k.text);
    exo_sbuf_init(&k.think);
    exo_sbuf_init(&k.ids);
    exo_chunk t;
    exo_chunk_token(&t, "hi", 2, 99, false);
    exo_output_parser_feed(p, &t, collect, &k);
    exo_chunk_free(&t);
    cr_assert_eq(k.n_token_chunks, 1);
    cr_assert_eq(exo_output_parser_reasoning_tokens(p), 0);
    exo_chunk_token(&t, "<think>x", 8, 100, false);
    exo_output_parser_feed(p, &t, collect, &k);
    exo_chunk_free(&t);
    cr_assert_eq(exo_output_parser_reasoning_tokens(p), 1);
    exo_output_parser_free(p);
    json_decref(k.calls);
    exo_sbuf_free(&k.text);
    exo_sbuf_free(&k.think);
}

/* With logprobs, every token gets exactly one entry, in order, even when its
 * text is held back (incomplete character, a possible stop sequence). */
Test(api_parser, one_logprob_entry_per_token)
{
    const char *stops[] = {"END"};
    exo_output_parser_config cfg = {.stop = stops, .n_stop = 1};
    exo_output_parser *p = exo_output_parser_create(&cfg);
    coll k = {.calls = json_array()};
    exo_sbuf_init(&k.text);
    exo_sbuf_init(&k.think);
    exo_sbuf_init(&k.ids);
    const char *pieces[] = {"a", "", "", "\xe4\xbd\xa0", "E", "N", "x", "E", "ND"};
    for (int i = 0; i < 9; i++) {
        exo_chunk t;
        exo_chunk_token(&t, pieces[i], strlen(pieces[i]), 10 + i, false);
        t.has_logprob = true;
        t.logprob = -1.0f;
        bool stopped = exo_output_parser_feed(p, &t, collect, &k);
        exo_chunk_free(&t);
        cr_assert_eq(stopped, i == 8);
    }
    cr_assert_str_eq(k.text.data, "a\xe4\xbd\xa0" "ENx");
    cr_assert_eq(k.n_logprob_entries, 8, "one entry per token before the stop: %d", k.n_logprob_entries);
    for (int i = 0; i < 8; i++)
        cr_assert_eq(k.lp_ids[i], 10 + i, "entry %d", i);
    exo_output_parser_free(p);
    json_decref(k.calls);
    exo_sbuf_free(&k.text);
    exo_sbuf_free(&k.think);
}

Test(api_parser, detect_from_template)
{
    exo_output_parser_config cfg;
    exo_output_parser_detect("{% if tools %}<tool_call>{% endif %}<think>", "<|im_start|>assistant\n<think>\n", &cfg);
    cr_assert_eq(cfg.tool_format, EXO_TOOL_FMT_HERMES);
    cr_assert_str_eq(cfg.think_start, "<think>");
    cr_assert(cfg.starts_in_thinking);
    exo_output_parser_detect("<|start|>assistant<|channel|>", NULL, &cfg);
    cr_assert_eq(cfg.tool_format, EXO_TOOL_FMT_HARMONY);
    exo_output_parser_detect("<|python_tag|>", "x", &cfg);
    cr_assert_eq(cfg.tool_format, EXO_TOOL_FMT_LLAMA3);
    cr_assert(!cfg.starts_in_thinking);
}

Test(api_parser, schema_check)
{
    json_t *tools = json_loads(weather_tools, 0, NULL);
    json_t *a = json_loads("{\"city\":\"x\",\"days\":\"4\"}", 0, NULL);
    cr_assert_eq(exo_tool_args_check(tools, "get_weather", a, NULL), 0);
    cr_assert(json_is_integer(json_object_get(a, "days")));
    cr_assert_eq(exo_tool_args_check(tools, "nope", a, NULL), EXO_ENOENT);
    json_t *b = json_loads("{\"days\":1}", 0, NULL);
    cr_assert_eq(exo_tool_args_check(tools, "get_weather", b, NULL), EXO_EINVAL);
    json_decref(a);
    json_decref(b);
    json_decref(tools);
}

/* ---- Qwen3-Coder / Qwen3.5 XML, GLM-4.5+, Kimi K2 ------------------------------ */

static const char *typed_tools =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather\","
    "\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"}},\"required\":[\"city\"]}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"search\",\"description\":\"Search\",\"parameters\":{\"type\":\"object\",\"properties\":{"
    "\"query\":{\"type\":\"string\"},\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},"
    "\"limit\":{\"type\":[\"integer\",\"null\"]},\"opts\":{\"type\":\"object\"},\"score\":{\"type\":\"number\"},"
    "\"safe\":{\"type\":\"boolean\"}},\"required\":[\"query\"]}}}]";

/* Each string is output that must come back unchanged as text, split every way. */
static void check_all_text(const exo_output_parser_config *cfg, const char *const *outs, size_t n, bool splits)
{
    for (size_t i = 0; i < n; i++) {
        expect ex = {.text = outs[i], .reason = EXO_FR_STOP};
        if (splits)
            check_splits(cfg, outs[i], &ex);
        else
            check_one(cfg, outs[i], NULL, 0, &ex, outs[i]);
    }
}

Test(api_parser, qwen_xml_call_after_reasoning)
{
    json_t *tools = json_loads(typed_tools, 0, NULL);
    /* Qwen3.5's generation prompt opens <think>: the output starts inside it. */
    exo_output_parser_config cfg = {.tool_format = EXO_TOOL_FMT_QWEN3_XML, .think_start = "<think>",
                                    .think_end = "</think>", .starts_in_thinking = true, .tools = tools};
    expect ex = {.text = "\n\nLet me check.\n\n", .think = "The user wants weather.\n",
                 .calls = "[{\"name\":\"get_weather\",\"args\":{\"city\":\"New York\",\"days\":3}}]",
                 .reason = EXO_FR_TOOL_CALLS};
    check_splits(&cfg,
                 "The user wants weather.\n</think>\n\nLet me check.\n\n<tool_call>\n<function=get_weather>\n"
                 "<parameter=city>\nNew York\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n"
                 "</tool_call>",
                 &ex);
    json_decref(tools);
}

Test(api_parser, qwen_xml_schema_coercion_and_two_calls)
{
    json_t *tools = json_loads(typed_tools, 0, NULL);
    exo_output_parser_config cfg = {.tool_format = EXO_TOOL_FMT_QWEN3_XML, .tools = tools};
    /* Values are text: strings keep inner newlines and spaces (one newline
     * each side is the markup's); typed ones follow the schema; an
     * undeclared parameter stays a string, as vLLM's qwen3_coder does. */
    expect ex = {.text = "\n",
                 .calls = "[{\"name\":\"search\",\"args\":{\"query\":\"line one\\nline two\\n\",\"tags\":[\"a\",\"b\"],"
                          "\"limit\":null,\"opts\":{\"safe\":true},\"score\":0.5,\"safe\":true,\"extra\":\"42\"}},"
                          "{\"name\":\"get_weather\",\"args\":{\"city\":\"  Paris  \",\"days\":4}}]",
                 .reason = EXO_FR_TOOL_CALLS};
    check_splits(&cfg,
                 "<tool_call>\n<function=search>\n<parameter=query>\nline one\nline two\n\n</parameter>\n"
                 "<parameter=tags>\n[\"a\", \"b\"]\n</parameter>\n<parameter=limit>\nnull\n</parameter>\n"
                 "<parameter=opts>\n{\"safe\": true}\n</parameter>\n<parameter=score>\n0.5\n</parameter>\n"
                 "<parameter=safe>\nTrue\n</parameter>\n<parameter=extra>\n42\n</parameter>\n</function>\n"
                 "</tool_call>\n<tool_call>\n<function=get_weather>\n<parameter=city>\n  Paris  \n</parameter>\n"
                 "<parameter=days>\n4.0\n</parameter>\n</function>\n</tool_call>",
                 &ex);
    json_decref(tools);
}

Test(api_parser, qwen_xml_lenient_forms)
{
    json_t *tools = json_loads(typed_tools, 0, NULL);
    exo_output_parser_config cfg = {.tool_format = EXO_TOOL_FMT_QWEN3_XML, .tools = tools};
    /* A bare <function=...> without the <tool_call> wrapper (Qwen3-Coder
     * does this; vLLM accepts it). */
    expect bare = {.text = "Sure.\n", .calls = "[{\"name\":\"get_weather\",\"args\":{\"city\":\"Oslo\"}}]",
                   .reason = EXO_FR_TOOL_CALLS};
    check_splits(&cfg, "Sure.\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>", &bare);
    /* A parameter without </parameter> ends at the next one; a function
     * without </function> at the end of its block. */
    expect loose = {.text = "", .calls = "[{\"name\":\"get_weather\",\"args\":{\"city\":\"Oslo\",\"days\":2}}]",
                    .reason = EXO_FR_TOOL_CALLS};
    check_splits(&cfg, "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n<parameter=days>\n2\n</tool_call>",
                 &loose);
    /* No parameters at all. */
    json_t *t2 = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"now\"}}]", 0, NULL);
    exo_output_parser_config cfg2 = {.tool_format = EXO_TOOL_FMT_QWEN3_XML, .tools = t2};
    expect none = {.text = "", .calls = "[{\"name\":\"now\",\"args\":{}}]", .reason = EXO_FR_TOOL_CALLS};
    check_splits(&cfg2, "<tool_call>\n<function=now>\n</function>\n</tool_call>", &none);
    json_decref(t2);
    json_decref(tools);
}

Test(api_parser, qwen_xml_bad_calls_stay_text)
{
    json_t *tools = json_loads(typed_tools, 0, NULL);
    exo_output_parser_config cfg = {.tool_format = EXO_TOOL_FMT_QWEN3_XML, .tools = tools};
    static const char *const bad[] = {
        /* unknown tool */
        "<tool_call>\n<function=launch>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>",
        /* not an integer */
        ("<tool_call>\n<function=get_weather>\n<parameter=city>\nA\n</parameter>\n<parameter=days>\nmany\n"
        "</parameter>\n</function>\n</tool_call>"),
        /* required city missing */
        "<tool_call>\n<function=get_weather>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>",
        /* null where null is not allowed */
        ("<tool_call>\n<function=get_weather>\n<parameter=city>\nA\n</parameter>\n<parameter=days>\nnull\n"
        "</parameter>\n</function>\n</tool_call>"),
        /* bad JSON for an object */
        ("<tool_call>\n<function=search>\n<parameter=query>\nq\n</parameter>\n<parameter=opts>\n{safe}\n"
        "</parameter>\n</function>\n</tool_call>"),
        /* text inside the block */
        "<tool_call>\nI will call <function=get_weather>\n<parameter=city>\nA\n</parameter>\n</function>\n</tool_call>",
        /* no function in the block, and a function name without '>' */
        "<tool_call>\n</tool_call>",
        "<tool_call>\n<function=get_weather\n</tool_call>",
        /* a block is all calls or all text: the second call is unknown */
        ("<tool_call>\n<function=get_weather>\n<parameter=city>\nA\n</parameter>\n</function>\n"
        "<function=launch>\n</function>\n</tool_call>"),
    };
    check_all_text(&cfg, bad, sizeof bad / sizeof *bad, false);
    static const char *const unterminated[] = {
        "ok <tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>\n",
        "ok <function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n",
    };
    check_all_text(&cfg, unterminated, 2, true);
    /* a good block, then a bad one: the first is a call, the second text */
    expect mixed = {.text = "\n<tool_call>\n<function=launch>\n</function>\n</tool_call>",
                    .calls = "[{\"name\":\"get_weather\",\"args\":{\"city\":\"A\"}}]", .reason = EXO_FR_TOOL_CALLS};
    check_splits(&cfg,
                 "<tool_call>\n<function=get_weather>\n<parameter=city>\nA\n</parameter>\n</function>\n</tool_call>\n"
                 "<tool_call>\n<function=launch>\n</function>\n</tool_call>",
                 &mixed);
    json_decref(tools);
}

Test(api_parser, glm45_calls_with_newlines)
{
    json_t *tools = json_loads(typed_tools, 0, NULL);
    exo_output_parser_config cfg = {.tool_format = EXO_TOOL_FMT_GLM4, .think_start = "<think>",
                                    .think_end = "</think>", .tools = tools};
    expect ex = {.text = "\n\nChecking.\n", .think = "User asks weather.",
                 .calls = "[{\"name\":\"get_weather\",\"args\":{\"city\":\"Paris\",\"days\":2}}]",
                 .reason = EXO_FR_TOOL_CALLS};
    check_splits(&cfg,
                 "\n<think>User asks weather.</think>\nChecking.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
                 "<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>",
                 &ex);
    json_decref(tools);
}

Test(api_parser, glm47_calls_and_value_typing)
{
    json_t *tools = json_loads(typed_tools, 0, NULL);
    /* GLM-4.7's generation prompt ends in <think>; no newlines in its markup. */
    exo_output_parser_config cfg = {.tool_format = EXO_TOOL_FMT_GLM4, .think_start = "<think>",
                                    .think_end = "</think>", .starts_in_thinking = true, .tools = tools};
    /* A declared string stays text even when it looks like JSON; other
     * values read as JSON when they are JSON (an undeclared "7" is 7, as in
     * vLLM's glm4_moe parser), else stay text. */
    expect ex = {.text = "Checking.", .think = "Need weather.",
                 .calls = "[{\"name\":\"get_weather\",\"args\":{\"city\":\"Paris\"}},"
                          "{\"name\":\"search\",\"args\":{\"query\":\"123\",\"tags\":[\"x\"],\"opts\":{\"safe\":false},"
                          "\"limit\":null,\"extra\":7,\"note\":\"not json\"}}]",
                 .reason = EXO_FR_TOOL_CALLS};
    check_splits(&cfg,
                 "Need weather.</think>Checking.<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris"
                 "</arg_value></tool_call><tool_call>search<arg_key>query</arg_key><arg_value>123</arg_value>"
                 "<arg_key>tags</arg_key><arg_value>[\"x\"]</arg_value><arg_key>opts</arg_key><arg_value>{\"safe\": "
                 "false}</arg_value><arg_key>limit</arg_key><arg_value>null</arg_value><arg_key>extra</arg_key>"
                 "<arg_value>7</arg_value><arg_key>note</arg_key><arg_value>not json</arg_value></tool_call>",
                 &ex);
    json_decref(tools);
}

Test(api_parser, glm_bad_calls_stay_text)
{
    json_t *tools = json_loads(typed_tools, 0, NULL);
    exo_output_parser_config cfg = {.tool_format = EXO_TOOL_FMT_GLM4, .tools = tools};
    static const char *const bad[] = {
        "<tool_call>launch\n<arg_key>x</arg_key>\n<arg_value>1</arg_value>\n</tool_call>",
        ("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>A</arg_value>\n<arg_key>days</arg_key>\n"
        "<arg_value>soon</arg_value>\n</tool_call>"),
        "<tool_call>get_weather\n<arg_key>city</arg_key>junk<arg_value>A</arg_value>\n</tool_call>",
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>A\n</tool_call>",
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>A</arg_value>\ntrailing\n</tool_call>",
        "<tool_call>\n<arg_key>city</arg_key>\n<arg_value>A</arg_value>\n</tool_call>",
        "<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"A\"}}</tool_call>",
        "<tool_call>get_weather\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
    };
    check_all_text(&cfg, bad, sizeof bad / sizeof *bad, false);
    static const char *const unterminated[] = {
        "x <tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>A</arg_value>\n",
    };
    check_all_text(&cfg, unterminated, 1, true);
    json_decref(tools);
}

#define KIMI_SB "<|tool_calls_section_begin|>"
#define KIMI_SE "<|tool_calls_section_end|>"
#define KIMI_B  "<|tool_call_begin|>"
#define KIMI_A  "<|tool_call_argument_begin|>"
#define KIMI_E  "<|tool_call_end|>"

Test(api_parser, kimi_k2_sections)
{
    json_t *tools = json_loads(typed_tools, 0, NULL);
    /* Kimi K2 Thinking writes <think>...</think> first. */
    exo_output_parser_config cfg = {.tool_format = EXO_TOOL_FMT_KIMI_K2, .think_start = "<think>",
                                    .think_end = "</think>", .tools = tools};
    expect ex = {.text = "Let me look.", .think = "Weather needed.",
                 .calls = "[{\"name\":\"get_weather\",\"args\":{\"city\":\"Paris\",\"days\":3}},"
                          "{\"name\":\"search\",\"args\":{\"query\":\"rain\"}}]",
                 /* the model's ids are kept: its template writes them back next turn */
                 .ids = "functions.get_weather:0 functions.search:1 ", .reason = EXO_FR_TOOL_CALLS};
    check_splits(&cfg,
                 "<think>Weather needed.</think>Let me look." KIMI_SB KIMI_B "functions.get_weather:0" KIMI_A
                 "{\"city\": \"Paris\", \"days\": \"3\"}" KIMI_E KIMI_B "functions.search:1" KIMI_A
                 "{\"query\": \"rain\"}" KIMI_E KIMI_SE,
                 &ex);
    /* Whitespace between the tokens, an id without the functions. prefix. */
    exo_output_parser_config plain = {.tool_format = EXO_TOOL_FMT_KIMI_K2, .tools = tools};
    expect ws = {.text = "", .calls = "[{\"name\":\"get_weather\",\"args\":{\"city\":\"Rome\"}}]",
                 .ids = "get_weather:12 ", .reason = EXO_FR_TOOL_CALLS};
    check_splits(&plain, KIMI_SB "\n" KIMI_B " get_weather:12 " KIMI_A " {\"city\":\"Rome\"} " KIMI_E "\n" KIMI_SE,
                 &ws);
    json_decref(tools);
}

Test(api_parser, kimi_bad_sections_stay_text)
{
    json_t *tools = json_loads(typed_tools, 0, NULL);
    exo_output_parser_config cfg = {.tool_format = EXO_TOOL_FMT_KIMI_K2, .tools = tools};
    static const char *const bad[] = {
        (KIMI_SB KIMI_B "functions.launch:0" KIMI_A "{}" KIMI_E KIMI_SE),
        (KIMI_SB KIMI_B "functions.get_weather:0" KIMI_A "{\"city\": " KIMI_E KIMI_SE),
        (KIMI_SB KIMI_B "functions.get_weather:0" KIMI_A "[1]" KIMI_E KIMI_SE),
        /* all or nothing: the second call's JSON is broken */
        (KIMI_SB KIMI_B "functions.get_weather:0" KIMI_A "{\"city\":\"A\"}" KIMI_E KIMI_B "functions.get_weather:1"
        KIMI_A "{" KIMI_E KIMI_SE),
        (KIMI_SB "junk" KIMI_B "functions.get_weather:0" KIMI_A "{\"city\":\"A\"}" KIMI_E KIMI_SE),
        (KIMI_SB KIMI_B "functions.get_weather:0{\"city\":\"A\"}" KIMI_E KIMI_SE),
        (KIMI_SB KIMI_SE),
    };
    check_all_text(&cfg, bad, sizeof bad / sizeof *bad, false);
    static const char *const unterminated[] = {
        ("a" KIMI_SB KIMI_B "functions.get_weather:0" KIMI_A "{\"city\":\"A\"}" KIMI_E),
    };
    check_all_text(&cfg, unterminated, 1, true);
    json_decref(tools);
}

Test(api_parser, coercion_of_scalars)
{
    json_t *tools = json_loads(typed_tools, 0, NULL);
    json_t *a = json_loads("{\"query\":\"q\",\"score\":\" 2 \",\"safe\":\"FALSE\\n\",\"limit\":\"NULL\"}", 0, NULL);
    cr_assert_eq(exo_tool_args_check(tools, "search", a, NULL), 0);
    cr_assert(json_is_integer(json_object_get(a, "score")), "a whole number stays whole");
    cr_assert(json_is_false(json_object_get(a, "safe")));
    cr_assert(json_is_null(json_object_get(a, "limit")));
    json_t *b = json_loads("{\"query\":\"q\",\"score\":\"1e400\"}", 0, NULL);
    cr_assert_eq(exo_tool_args_check(tools, "search", b, NULL), EXO_EINVAL, "not a finite number");
    json_t *c = json_loads("{\"query\":\"q\",\"limit\":1e300}", 0, NULL);
    cr_assert_eq(exo_tool_args_check(tools, "search", c, NULL), EXO_EINVAL, "out of the integer range");
    json_decref(a);
    json_decref(b);
    json_decref(c);
    json_decref(tools);
}

/* ---- real templates: detection, parsing, and the four APIs ------------------------ */

static char *read_text(const char *path)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s (tests run from the repository root)", path);
    exo_sbuf b;
    exo_sbuf_init(&b);
    char tmp[4096];
    size_t n;
    while ((n = fread(tmp, 1, sizeof tmp, f)) > 0)
        exo_sbuf_append(&b, tmp, n);
    fclose(f);
    return exo_sbuf_take(&b);
}

typedef struct tpl_case {
    const char     *file, *kwargs;          /* template; extra render kwargs (JSON) or NULL */
    exo_tool_format fmt;
    bool            think, starts_in_thinking;
    const char     *output, *think_text, *text; /* model output and what it parses into */
    bool            has_call;               /* a get_weather(city=Paris, days=2) call */
} tpl_case;

#define WEATHER_CALL "[{\"name\":\"get_weather\",\"args\":{\"city\":\"Paris\",\"days\":2}}]"
#define QWEN_XML_CALL                                                                                  \
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n" \
    "</parameter>\n</function>\n</tool_call>"
#define GLM_CALL                                                                                       \
    "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days"    \
    "</arg_key>\n<arg_value>2</arg_value>\n</tool_call>"
#define KIMI_CALL                                                                                      \
    KIMI_SB KIMI_B "functions.get_weather:0" KIMI_A "{\"city\": \"Paris\", \"days\": 2}" KIMI_E KIMI_SE

static const tpl_case tpl_cases[] = {
    {"Qwen-Qwen3.5-4B.jinja", NULL, EXO_TOOL_FMT_QWEN3_XML, true, true,
     "Weather.\n</think>\n\n" QWEN_XML_CALL, "Weather.\n", "\n\n", true},
    {"Qwen-Qwen3.5-4B.jinja", "{\"enable_thinking\": false}", EXO_TOOL_FMT_QWEN3_XML, true, false,
     QWEN_XML_CALL, "", "", true},
    {"Qwen-Qwen3-Coder-30B-A3B-Instruct.jinja", NULL, EXO_TOOL_FMT_QWEN3_XML, false, false,
     "Checking.\n" QWEN_XML_CALL, "", "Checking.\n", true},
    {"zai-org-GLM-4.6.jinja", NULL, EXO_TOOL_FMT_GLM4, true, false,
     "\n<think>Weather.</think>\n" GLM_CALL, "Weather.", "\n\n", true},
    {"zai-org-GLM-4.7-Flash.jinja", NULL, EXO_TOOL_FMT_GLM4, true, true,
     "Weather.</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value><arg_key>days"
     "</arg_key><arg_value>2</arg_value></tool_call>", "Weather.", "", true},
    {"zai-org-GLM-4.7-Flash.jinja", "{\"enable_thinking\": false}", EXO_TOOL_FMT_GLM4, true, false,
     "Sure." GLM_CALL, "", "Sure.", true},
    {"moonshotai-Kimi-K2.jinja", NULL, EXO_TOOL_FMT_KIMI_K2, false, false, "Sure." KIMI_CALL, "", "Sure.", true},
    {"moonshotai-Kimi-K2-Thinking.jinja", NULL, EXO_TOOL_FMT_KIMI_K2, true, false,
     "<think>Weather.</think>" KIMI_CALL, "Weather.", "", true},
    {"deepseek-ai-DeepSeek-V3.1.jinja", "{\"thinking\": true}", EXO_TOOL_FMT_DEEPSEEK_V3, true, true,
     "Weather.</think>" DS_CB DS_B "get_weather" DS_S "{\"city\": \"Paris\", \"days\": 2}" DS_E DS_CE,
     "Weather.", "", true},
    {"deepseek-ai-DeepSeek-V3.1.jinja", NULL, EXO_TOOL_FMT_DEEPSEEK_V3, true, false,
     DS_CB DS_B "get_weather" DS_S "{\"city\": \"Paris\", \"days\": 2}" DS_E DS_CE, "", "", true},
    {"openai-gpt-oss-120b.jinja", NULL, EXO_TOOL_FMT_HARMONY, false, false,
     "<|channel|>analysis<|message|>Weather.<|end|><|start|>assistant<|channel|>commentary "
     "to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"Paris\",\"days\":2}<|call|>",
     "Weather.", "", true},
    {"Qwen-Qwen3-0.6B.jinja", NULL, EXO_TOOL_FMT_HERMES, true, false,
     "<think>\nWeather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", "
     "\"days\": 2}}\n</tool_call>", "\nWeather.\n", "\n\n", true},
    {"meta-llama-Llama-3.2-3B-Instruct.jinja", NULL, EXO_TOOL_FMT_LLAMA3, false, false,
     "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\", \"days\": 2}}", "", "", true},
    /* Gemma 3 has no tool format: everything is text, markup included. */
    {"google-gemma-3-it.jinja", NULL, EXO_TOOL_FMT_NONE, false, false,
     "Hi <tool_call>{\"name\": \"get_weather\"}</tool_call> <think>x</think>", "",
     "Hi <tool_call>{\"name\": \"get_weather\"}</tool_call> <think>x</think>", false},
};

/* Renders the template's generation prompt for one user turn with tools, and
 * fills cfg the way the runner does. Returns the template text. */
static char *detect_case(const tpl_case *tc, const json_t *tools, exo_output_parser_config *cfg)
{
    char path[256];
    snprintf(path, sizeof path, "tests/fixtures/chat-templates/%s", tc->file);
    char *src = read_text(path);
    exo_chat_template *t = NULL;
    exo_err err = {0};
    cr_assert_eq(exo_chat_template_from_string(src, NULL, NULL, &t, &err), 0, "%s: %s", tc->file, err.msg);
    json_t *msgs = json_loads("[{\"role\":\"user\",\"content\":\"Weather in Paris for 2 days?\"}]", 0, NULL);
    json_t *kw = tc->kwargs ? json_loads(tc->kwargs, 0, NULL) : NULL;
    char *prompt = NULL;
    cr_assert_eq(exo_chat_template_render(t, msgs, tools, true, kw, &prompt, &err), 0, "%s: %s", tc->file, err.msg);
    memset(cfg, 0, sizeof *cfg);
    exo_output_parser_detect(src, prompt, cfg);
    cfg->tools = tools;
    exo_free(prompt);
    json_decref(kw);
    json_decref(msgs);
    exo_chat_template_free(t);
    return src;
}

Test(api_parser, real_templates_detect_and_parse)
{
    json_t *tools = json_loads(typed_tools, 0, NULL);
    for (size_t i = 0; i < sizeof tpl_cases / sizeof *tpl_cases; i++) {
        const tpl_case *tc = &tpl_cases[i];
        exo_output_parser_config cfg;
        char *src = detect_case(tc, tools, &cfg);
        cr_assert_eq(cfg.tool_format, tc->fmt, "%s: format %d", tc->file, cfg.tool_format);
        cr_assert_eq(cfg.think_start != NULL, tc->think, "%s: reasoning tags", tc->file);
        cr_assert_eq(cfg.starts_in_thinking, tc->starts_in_thinking, "%s %s: starts in thinking", tc->file,
                     tc->kwargs ? tc->kwargs : "");
        expect ex = {.text = tc->text, .think = tc->think_text, .calls = tc->has_call ? WEATHER_CALL : NULL,
                     .ids = tc->has_call && tc->fmt == EXO_TOOL_FMT_KIMI_K2 ? "functions.get_weather:0 " : NULL,
                     .reason = tc->has_call ? EXO_FR_TOOL_CALLS : EXO_FR_STOP};
        check_splits(&cfg, tc->output, &ex);
        exo_free(src);
    }
    json_decref(tools);
}

typedef struct api_sink {
    exo_api_encoder *e;
    exo_sbuf         out;
} api_sink;

static void to_encoder(void *ctx, const exo_chunk *c)
{
    api_sink *s = ctx;
    exo_api_encoder_feed(s->e, c, &s->out);
}

/* The non-streaming body an API family returns for `output` parsed with cfg
 * (fed in 5-byte tokens). */
static json_t *api_body(exo_api_family f, const exo_output_parser_config *cfg, const char *output)
{
    exo_gen_request r;
    exo_gen_request_init(&r);
    r.model = exo_strdup("m");
    r.messages = json_array();
    api_sink s = {.e = exo_api_encoder_create(f, &r, "cmd1", 1700000000)};
    exo_sbuf_init(&s.out);
    exo_api_encoder_begin(s.e, &s.out);
    exo_output_parser *p = exo_output_parser_create(cfg);
    size_t n = strlen(output);
    int ntok = 0;
    for (size_t i = 0; i < n; i += 5, ntok++) {
        exo_chunk tok;
        exo_chunk_token(&tok, output + i, n - i < 5 ? n - i : 5, 100 + ntok, false);
        exo_output_parser_feed(p, &tok, to_encoder, &s);
        exo_chunk_free(&tok);
    }
    exo_finish_reason reason = exo_output_parser_finish(p, EXO_FR_STOP, to_encoder, &s);
    exo_usage u = {.prompt_tokens = 3, .completion_tokens = ntok,
                   .reasoning_tokens = exo_output_parser_reasoning_tokens(p)};
    exo_chunk fin;
    exo_chunk_finish(&fin, reason, &u, 1, 1);
    exo_api_encoder_feed(s.e, &fin, &s.out);
    exo_chunk_free(&fin);
    exo_output_parser_free(p);
    json_error_t je;
    json_t *body = json_loads(s.out.data ? s.out.data : "", 0, &je);
    cr_assert(body, "family %d: not JSON (%s): %s", f, je.text, s.out.data);
    exo_sbuf_free(&s.out);
    exo_api_encoder_free(s.e);
    exo_gen_request_free(&r);
    return body;
}

static void assert_args(const char *what, const json_t *got_args)
{
    json_t *want = json_pack("{s:s, s:i}", "city", "Paris", "days", 2);
    json_t *got = json_is_string(got_args) ? json_loads(json_string_value(got_args), 0, NULL)
                                           : json_incref((json_t *)got_args);
    char *g = got ? exo_json_dumps(got, JSON_COMPACT) : NULL;
    cr_assert(got && json_equal(want, got), "%s: arguments %s", what, g ? g : "(none)");
    exo_free(g);
    json_decref(got);
    json_decref(want);
}

/* The item of type `type` in a content/output array. */
static json_t *item_of_type(const json_t *arr, const char *type)
{
    size_t i;
    json_t *it;
    json_array_foreach(arr, i, it) {
        if (json_is_string(json_object_get(it, "type")) && !strcmp(json_string_value(json_object_get(it, "type")), type))
            return it;
    }
    return NULL;
}

Test(api_parser, parsed_calls_reach_every_api)
{
    json_t *tools = json_loads(typed_tools, 0, NULL);
    for (size_t i = 0; i < sizeof tpl_cases / sizeof *tpl_cases; i++) {
        const tpl_case *tc = &tpl_cases[i];
        if (!tc->has_call)
            continue;
        exo_output_parser_config cfg;
        char *src = detect_case(tc, tools, &cfg);
        char what[160];

        snprintf(what, sizeof what, "%s: OpenAI chat", tc->file);
        json_t *j = api_body(EXO_API_OPENAI_CHAT, &cfg, tc->output);
        json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
        json_t *msg = json_object_get(ch, "message");
        json_t *call = json_array_get(json_object_get(msg, "tool_calls"), 0);
        cr_assert_str_eq(json_string_value(json_object_get(json_object_get(call, "function"), "name")), "get_weather",
                         "%s", what);
        assert_args(what, json_object_get(json_object_get(call, "function"), "arguments"));
        cr_assert_str_eq(json_string_value(json_object_get(ch, "finish_reason")), "tool_calls", "%s", what);
        if (*tc->think_text)
            cr_assert(strstr(json_string_value(json_object_get(msg, "reasoning_content")), "Weather."), "%s", what);
        json_decref(j);

        snprintf(what, sizeof what, "%s: Claude messages", tc->file);
        j = api_body(EXO_API_CLAUDE, &cfg, tc->output);
        json_t *use = item_of_type(json_object_get(j, "content"), "tool_use");
        cr_assert(use, "%s: no tool_use block", what);
        cr_assert_str_eq(json_string_value(json_object_get(use, "name")), "get_weather", "%s", what);
        cr_assert(!strncmp(json_string_value(json_object_get(use, "id")), "toolu_", 6), "%s", what);
        assert_args(what, json_object_get(use, "input"));
        cr_assert_str_eq(json_string_value(json_object_get(j, "stop_reason")), "tool_use", "%s", what);
        cr_assert_eq(*tc->think_text != 0, item_of_type(json_object_get(j, "content"), "thinking") != NULL, "%s", what);
        json_decref(j);

        snprintf(what, sizeof what, "%s: OpenAI responses", tc->file);
        j = api_body(EXO_API_RESPONSES, &cfg, tc->output);
        json_t *fc = item_of_type(json_object_get(j, "output"), "function_call");
        cr_assert(fc, "%s: no function_call item", what);
        cr_assert_str_eq(json_string_value(json_object_get(fc, "name")), "get_weather", "%s", what);
        assert_args(what, json_object_get(fc, "arguments"));
        json_decref(j);

        snprintf(what, sizeof what, "%s: Ollama chat", tc->file);
        j = api_body(EXO_API_OLLAMA_CHAT, &cfg, tc->output);
        msg = json_object_get(j, "message");
        call = json_array_get(json_object_get(msg, "tool_calls"), 0);
        cr_assert_str_eq(json_string_value(json_object_get(json_object_get(call, "function"), "name")), "get_weather",
                         "%s", what);
        assert_args(what, json_object_get(json_object_get(call, "function"), "arguments"));
        cr_assert_str_eq(json_string_value(json_object_get(j, "done_reason")), "tool_call", "%s", what);
        json_decref(j);
        exo_free(src);
    }
    json_decref(tools);
}

/* An earlier call's arguments reach each real template in the form it
 * takes: an object for those that iterate or tojson it (Qwen3.5, GLM, Kimi,
 * gpt-oss), the JSON text for DeepSeek-V3.1's, which concatenates a
 * string (an object there was an error: "unsupported operand"). */
Test(api_parser, earlier_call_arguments_as_each_template_takes_them)
{
    static const struct { const char *file, *want; } cases[] = {
        {"deepseek-ai-DeepSeek-V3.1.jinja", "{\"city\":\"Paris\"}"},
        {"Qwen-Qwen3.5-4B.jinja", "<parameter=city>\nParis\n</parameter>"},
        {"zai-org-GLM-4.6.jinja", "<arg_value>Paris</arg_value>"},
        {"moonshotai-Kimi-K2-Thinking.jinja", "{\"city\": \"Paris\"}"},
        {"Qwen-Qwen3-0.6B.jinja", "\"arguments\": {\"city\": \"Paris\"}"},
    };
    json_t *tools = json_loads(typed_tools, 0, NULL);
    json_t *msgs = json_loads(
        "[{\"role\":\"user\",\"content\":\"Weather?\"},{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":"
        "[{\"id\":\"functions.get_weather:0\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
        "\"arguments\":{\"city\":\"Paris\"}}}]},{\"role\":\"tool\",\"tool_call_id\":\"functions.get_weather:0\","
        "\"content\":\"sunny\"}]", 0, NULL);
    cr_assert(tools && msgs);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char path[256];
        snprintf(path, sizeof path, "tests/fixtures/chat-templates/%s", cases[i].file);
        char *src = read_text(path);
        exo_chat_template *t = NULL;
        exo_err err = {0};
        cr_assert_eq(exo_chat_template_from_string(src, NULL, NULL, &t, &err), 0, "%s: %s", cases[i].file, err.msg);
        char *prompt = NULL;
        cr_assert_eq(exo_chat_template_render(t, msgs, tools, true, NULL, &prompt, &err), 0, "%s: %s",
                     cases[i].file, err.msg);
        cr_assert(strstr(prompt, cases[i].want), "%s: no %s in:\n%s", cases[i].file, cases[i].want, prompt);
        cr_assert(!strstr(prompt, "{'city'"), "%s: a Python dict in:\n%s", cases[i].file, prompt);
        exo_free(prompt);
        exo_chat_template_free(t);
        exo_free(src);
    }
    json_decref(msgs);
    json_decref(tools);
}
