/* Output parser: reasoning tags, each tool-call family, stop sequences and
 * schema checks, with the model output split at every byte position (and fed
 * byte by byte) so markers that span tokens are exercised everywhere. */
#include "core/json_util.h"
#include "runner/output_parser.h"
#include "core/sbuf.h"

#include <criterion/criterion.h>
#include <string.h>

typedef struct coll {
    exo_sbuf text, think;
    json_t  *calls;
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
            cr_assert(strncmp(c->tool_calls[i].id, "call_", 5) == 0);
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
    exo_finish_reason reason;
    bool stopped;
} expect;

static void check_one(const exo_output_parser_config *cfg, const char *out, const size_t *cuts, int n_cuts,
                      const expect *ex, const char *what)
{
    coll k = {.calls = json_array()};
    exo_sbuf_init(&k.text);
    exo_sbuf_init(&k.think);
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
