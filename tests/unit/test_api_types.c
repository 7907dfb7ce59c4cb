/* gen_types: JSON round trips of requests and every chunk kind, strict
 * rejection of malformed pipe / peer messages, reasoning resolution, and the
 * direct JSON writer (escaping, invalid UTF-8 repair). */
#include "proto/gen_types.h"
#include "core/sbuf.h"

#include <criterion/criterion.h>
#include <string.h>

Test(api_types, request_roundtrip)
{
    exo_gen_request r;
    exo_gen_request_init(&r);
    r.model = strdup("mlx-community/Qwen3-0.6B-4bit");
    r.messages = json_loads("[{\"role\":\"user\",\"content\":\"hi\"}]", 0, NULL);
    r.tools = json_loads("[{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]", 0, NULL);
    r.instructions = strdup("be brief");
    r.max_tokens = 64;
    r.sampling.temperature = 0.5f;
    r.sampling.seed = 18446744073709551615ull;
    r.sampling.top_logprobs = 3;
    r.has = EXO_GEN_HAS_MAX_TOKENS | EXO_GEN_HAS_TEMPERATURE | EXO_GEN_HAS_SEED;
    cr_assert_eq(exo_gen_add_stop(&r, "END", NULL), 0);
    r.logprobs = true;
    r.reasoning_effort = EXO_EFFORT_HIGH;
    r.enable_thinking = 1;
    r.stream = true;
    json_t *j = exo_gen_request_to_json(&r);
    exo_gen_request b;
    exo_err err = {0};
    cr_assert_eq(exo_gen_request_from_json(j, &b, &err), 0, "%s", err.msg);
    cr_assert_str_eq(b.model, r.model);
    cr_assert(json_equal(b.messages, r.messages));
    cr_assert(json_equal(b.tools, r.tools));
    cr_assert_eq(b.max_tokens, 64);
    cr_assert_float_eq(b.sampling.temperature, 0.5f, 1e-6);
    cr_assert_eq(b.sampling.seed, 18446744073709551615ull);
    cr_assert_eq(b.has, r.has | EXO_GEN_HAS_TOP_LOGPROBS);
    cr_assert_eq(b.n_stop, 1);
    cr_assert_str_eq(b.stop[0], "END");
    cr_assert(b.logprobs && b.stream && !b.bench);
    cr_assert_eq(b.reasoning_effort, EXO_EFFORT_HIGH);
    cr_assert_eq(b.enable_thinking, 1);
    json_decref(j);
    exo_gen_request_free(&b);
    exo_gen_request_free(&r);
}

Test(api_types, request_strict)
{
    const char *bad[] = {
        "{\"model\":\"m\",\"messages\":[],\"bogus\":1}",
        "{\"model\":\"m\"}",
        "{\"model\":3,\"messages\":[]}",
        "{\"model\":\"m\",\"messages\":[],\"temperature\":\"hot\"}",
        "{\"model\":\"m\",\"messages\":[],\"top_p\":2}",
        "{\"model\":\"m\",\"messages\":[],\"max_tokens\":0}",
        "{\"model\":\"m\",\"messages\":[],\"top_logprobs\":21}",
        "{\"model\":\"m\",\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}",
        "{\"model\":\"m\",\"messages\":[\"x\"]}",
        "{\"model\":\"m\",\"messages\":[],\"seed\":\"-1\"}",
        "{\"model\":\"m\",\"messages\":[],\"stop\":[1]}",
        "{\"model\":\"m\",\"messages\":[],\"reasoning_effort\":\"max\"}",
        "[]",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        json_t *j = json_loads(bad[i], 0, NULL);
        cr_assert(j, "%s", bad[i]);
        exo_gen_request r;
        exo_err err = {0};
        cr_assert_neq(exo_gen_request_from_json(j, &r, &err), 0, "accepted %s", bad[i]);
        cr_assert(err.msg[0]);
        json_decref(j);
    }
}

Test(api_types, reasoning_resolution)
{
    exo_gen_request r;
    exo_gen_request_init(&r);
    r.enable_thinking = 1;
    exo_gen_resolve_reasoning(&r);
    cr_assert_eq(r.reasoning_effort, EXO_EFFORT_MEDIUM);
    exo_gen_request_init(&r);
    r.enable_thinking = 0;
    exo_gen_resolve_reasoning(&r);
    cr_assert_eq(r.reasoning_effort, EXO_EFFORT_NONE);
    exo_gen_request_init(&r);
    r.reasoning_effort = EXO_EFFORT_NONE;
    exo_gen_resolve_reasoning(&r);
    cr_assert_eq(r.enable_thinking, 0);
    exo_gen_request_init(&r);
    r.reasoning_effort = EXO_EFFORT_LOW;
    exo_gen_resolve_reasoning(&r);
    cr_assert_eq(r.enable_thinking, 1);
    exo_gen_request_init(&r);
    r.reasoning_effort = EXO_EFFORT_HIGH;
    r.enable_thinking = 0;
    exo_gen_resolve_reasoning(&r);
    cr_assert_eq(r.enable_thinking, 0);
    cr_assert_eq(r.reasoning_effort, EXO_EFFORT_HIGH);
    exo_gen_request_init(&r);
    exo_gen_resolve_reasoning(&r);
    cr_assert_eq(r.enable_thinking, -1);
    cr_assert_eq(r.reasoning_effort, EXO_EFFORT_UNSET);
}

static void roundtrip(const exo_chunk *c)
{
    json_t *j = exo_chunk_to_json(c);
    exo_chunk b;
    exo_err err = {0};
    cr_assert_eq(exo_chunk_from_json(j, &b, &err), 0, "%s", err.msg);
    json_t *j2 = exo_chunk_to_json(&b);
    cr_assert(json_equal(j, j2));
    cr_assert_eq(b.kind, c->kind);
    cr_assert_eq(b.peak_memory_bytes, c->peak_memory_bytes);
    cr_assert_eq(b.error_status, c->error_status);
    json_decref(j);
    json_decref(j2);
    exo_chunk_free(&b);
}

Test(api_types, chunk_roundtrips)
{
    exo_chunk c;
    exo_chunk_token(&c, "h\xc3\xa9llo\n\"", 8, 42, true);
    c.has_logprob = true;
    c.logprob = -0.25f;
    exo_chunk_set_top(&c, 0, "h", -0.25f);
    exo_chunk_set_top(&c, 1, "x", -3.5f);
    roundtrip(&c);
    exo_chunk_set_token_text(&c, " h"); /* the token's own text rides along */
    roundtrip(&c);
    exo_chunk copy0;
    exo_chunk_copy(&copy0, &c);
    cr_assert_str_eq(copy0.token_text, " h");
    exo_chunk_free(&copy0);
    exo_chunk_free(&c);
    exo_chunk_tool_calls(&c);
    exo_chunk_add_tool_call(&c, "call_1", "f", "{\"a\":1}");
    exo_chunk_add_tool_call(&c, "call_2", "g", "{}");
    roundtrip(&c);
    exo_chunk copy;
    exo_chunk_copy(&copy, &c);
    cr_assert_str_eq(copy.tool_calls[1].name, "g");
    exo_chunk_free(&copy);
    exo_chunk_free(&c);
    exo_chunk_prefill(&c, 10, 100);
    roundtrip(&c);
    exo_chunk_error(&c, "runner crashed");
    cr_assert_eq(c.error_status, 500);
    roundtrip(&c);
    exo_chunk_free(&c);
    exo_chunk_error_status(&c, 400, "the prompt is too long");
    roundtrip(&c);
    exo_chunk_copy(&copy, &c);
    cr_assert_eq(copy.error_status, 400);
    exo_chunk_free(&copy);
    exo_chunk_free(&c);
    exo_chunk_error_status(&c, 200, "not an error status"); /* out of range -> 500 */
    cr_assert_eq(c.error_status, 500);
    exo_chunk_free(&c);
    exo_usage u = {.prompt_tokens = 5, .completion_tokens = 7, .reasoning_tokens = 2};
    exo_chunk_finish(&c, EXO_FR_LENGTH, &u, 100.5, 20.25);
    roundtrip(&c);
    exo_chunk_set_stop_sequence(&c, "###");
    roundtrip(&c);
    c.peak_memory_bytes = (int64_t)3 << 30;
    roundtrip(&c);
    exo_chunk_free(&c);
}

Test(api_types, chunk_strict)
{
    const char *bad[] = {
        "{\"type\":\"token\"}",
        "{\"type\":\"token\",\"text\":1}",
        "{\"type\":\"token\",\"text\":\"a\",\"extra\":1}",
        "{\"type\":\"token\",\"text\":\"a\",\"token_id\":-5}",
        "{\"type\":\"token\",\"text\":\"a\",\"top_logprobs\":[1]}",
        "{\"type\":\"tool_calls\",\"tool_calls\":[{\"id\":\"x\",\"name\":\"f\"}]}",
        "{\"type\":\"prefill\",\"processed\":-1,\"total\":3}",
        "{\"type\":\"finish\",\"reason\":\"bored\",\"usage\":{\"prompt_tokens\":0,\"completion_tokens\":0,"
        "\"reasoning_tokens\":0,\"cached_tokens\":0}}",
        "{\"type\":\"finish\",\"reason\":\"stop\"}",
        "{\"type\":\"finish\",\"reason\":\"stop\",\"usage\":{\"prompt_tokens\":0,\"completion_tokens\":0,"
        "\"reasoning_tokens\":0,\"cached_tokens\":0},\"peak_memory\":-1}",
        "{\"type\":\"error\",\"message\":\"x\",\"status\":200}",
        "{\"type\":\"error\",\"message\":\"x\",\"status\":600}",
        "{\"type\":\"error\",\"message\":\"x\",\"status\":\"400\"}",
        "{\"type\":\"mystery\"}",
        "{\"text\":\"a\"}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        json_t *j = json_loads(bad[i], 0, NULL);
        cr_assert(j, "%s", bad[i]);
        exo_chunk c;
        exo_err err = {0};
        cr_assert_neq(exo_chunk_from_json(j, &c, &err), 0, "accepted %s", bad[i]);
        json_decref(j);
    }
}

Test(api_types, json_writer_escapes_and_repairs)
{
    exo_sbuf b;
    exo_sbuf_init(&b);
    const char in[] = "a\"b\\c\n\x01\xff\xc3\xa9\xe2\x82";
    exo_sbuf_json_strn(&b, in, sizeof in - 1);
    json_error_t je;
    json_t *j = json_loads(b.data, JSON_DECODE_ANY, &je);
    cr_assert(j, "%s: %s", b.data, je.text);
    cr_assert_str_eq(json_string_value(j), "a\"b\\c\n\x01\xef\xbf\xbd\xc3\xa9\xef\xbf\xbd\xef\xbf\xbd");
    json_decref(j);
    exo_sbuf_clear(&b);
    exo_sbuf_json_num(&b, -1.0 / 0.0);
    cr_assert_str_eq(b.data, "-9999");
    exo_sbuf_free(&b);
    cr_assert(exo_sbuf_utf8_valid("h\xc3\xa9", 3));
    cr_assert(!exo_sbuf_utf8_valid("\xed\xa0\x80", 3)); /* surrogate */
    cr_assert(!exo_sbuf_utf8_valid("\xc0\x80", 2));     /* overlong */
}

Test(api_types, random_ids_unique)
{
    char a[48], b[48];
    exo_gen_random_id(a, sizeof a, "call_");
    exo_gen_random_id(b, sizeof b, "call_");
    cr_assert_eq(strlen(a), 5 + 24);
    cr_assert_str_neq(a, b);
}

/* An error chunk without a status (an older runner) is a server error. */
Test(api_types, error_chunk_status_defaults_to_500)
{
    json_t *j = json_loads("{\"type\":\"error\",\"message\":\"x\"}", 0, NULL);
    exo_chunk c;
    exo_err err = {0};
    cr_assert_eq(exo_chunk_from_json(j, &c, &err), 0, "%s", err.msg);
    cr_assert_eq(c.error_status, 500);
    exo_chunk_free(&c);
    json_decref(j);
}
