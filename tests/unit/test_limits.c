/* Caps on memory that outside input makes us hold: byte budgets
 * (core/budget.c), the buffer cap (core/sbuf.c) and the parse budget of
 * request bodies (core/json_util.c: jansson's allocator). */
#include "core/alloc.h"
#include "core/budget.h"
#include "core/json_util.h"
#include "core/sbuf.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <string.h>

Test(budget, charges_refuses_and_releases)
{
    exo_budget b;
    exo_budget_init(&b, 100);
    cr_assert(exo_budget_charge(&b, 60));
    cr_assert_not(exo_budget_charge(&b, 41));
    cr_assert(exo_budget_charge(&b, 40));
    cr_assert_not(exo_budget_charge(&b, 1));
    cr_assert_eq(exo_budget_used(&b), 100);
    exo_budget_release(&b, 60);
    cr_assert_eq(exo_budget_used(&b), 40);
    cr_assert_not(exo_budget_charge_upto(&b, 40, 75), "a ceiling below the limit holds");
    cr_assert(exo_budget_charge_upto(&b, 35, 75));
    cr_assert_not(exo_budget_charge(&b, SIZE_MAX), "no overflow in the check");
    cr_assert_eq(exo_budget_peak(&b), 100);
    cr_assert_eq(exo_budget_refused(&b), 4);
}

typedef struct racer {
    exo_budget *b;
    int         got;
} racer;

static void *race(void *arg)
{
    racer *r = arg;
    for (int i = 0; i < 100000; i++)
        if (exo_budget_charge(r->b, 3))
            r->got++;
    return NULL;
}

Test(budget, concurrent_charges_never_overshoot)
{
    exo_budget b;
    exo_budget_init(&b, 1000);
    racer r[4] = {{&b, 0}, {&b, 0}, {&b, 0}, {&b, 0}};
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        pthread_create(&t[i], NULL, race, &r[i]);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    cr_assert_eq(r[0].got + r[1].got + r[2].got + r[3].got, 333);
    cr_assert_eq(exo_budget_used(&b), 999);
    cr_assert_leq(exo_budget_peak(&b), 1000);
}

Test(sbuf_cap, appends_past_the_cap_are_dropped_and_remembered)
{
    exo_sbuf b;
    exo_sbuf_init(&b);
    exo_sbuf_set_max(&b, 10);
    exo_sbuf_puts(&b, "hello");
    exo_sbuf_puts(&b, "world");
    cr_assert_str_eq(b.data, "helloworld");
    cr_assert_not(exo_sbuf_overflowed(&b));
    exo_sbuf_putc(&b, '!');
    exo_sbuf_printf(&b, "%d", 42);
    exo_sbuf_json_str(&b, "x");
    exo_sbuf_json_bytes(&b, "ab", 2);
    cr_assert_str_eq(b.data, "helloworld", "nothing past the cap, nothing partial");
    cr_assert(exo_sbuf_overflowed(&b));
    cr_assert_leq(b.cap, 11);
    exo_sbuf_clear(&b);
    cr_assert_not(exo_sbuf_overflowed(&b));
    cr_assert_not(exo_sbuf_reserve(&b, 11));
    cr_assert(exo_sbuf_reserve(&b, 10));
    exo_sbuf_printf(&b, "%s", "0123456789");
    cr_assert_str_eq(b.data, "0123456789");
    exo_sbuf_free(&b);
    exo_sbuf_puts(&b, "0123456789abc");
    cr_assert(exo_sbuf_overflowed(&b), "free keeps the cap");
    exo_sbuf_free(&b);
    /* the default cap */
    exo_sbuf d;
    exo_sbuf_init(&d);
    cr_assert_not(exo_sbuf_reserve(&d, EXO_SBUF_DEFAULT_MAX + 1));
    exo_sbuf_free(&d);
}

static char *tiny_messages(size_t n, size_t *len)
{
    exo_sbuf b;
    exo_sbuf_init(&b);
    exo_sbuf_puts(&b, "{\"messages\":[");
    for (size_t i = 0; i < n; i++)
        exo_sbuf_puts(&b, i ? ",{\"role\":\"user\",\"content\":\"a\"}" : "{\"role\":\"user\",\"content\":\"a\"}");
    exo_sbuf_puts(&b, "]}");
    *len = b.len;
    return exo_sbuf_take(&b);
}

Test(json_budget, a_parse_tree_is_charged_capped_and_paid_back)
{
    exo_budget b;
    exo_budget_init(&b, 64 << 20);
    size_t len;
    char *body = tiny_messages(10000, &len); /* ~300 KB of text */
    exo_err err = {0};
    json_t *j = NULL;

    exo_ju_set_parse_budget(&b, 32 << 20);
    cr_assert_eq(exo_ju_parse_body(body, len, &j, &err), 0, "%s", err.msg);
    size_t tree = exo_budget_used(&b);
    cr_log_info("%zu bytes of JSON -> a %zu-byte tree (%.1fx)", len, tree, (double)tree / (double)len);
    cr_assert_gt(tree, len, "the tree is charged");
    json_t *copy = json_deep_copy(j); /* not a body parse: not charged */
    cr_assert_eq(exo_budget_used(&b), tree);
    json_decref(j);
    cr_assert_eq(exo_budget_used(&b), 0, "freeing the tree pays it back");
    json_decref(copy);

    /* over the per-parse cap: EXO_ETOOBIG, nothing left charged */
    exo_ju_set_parse_budget(&b, tree / 2);
    cr_assert_eq(exo_ju_parse_body(body, len, &j, &err), EXO_ETOOBIG);
    cr_assert_null(j);
    cr_assert(strstr(err.msg, "too complex"), "%s", err.msg);
    cr_assert_eq(exo_budget_used(&b), 0);

    /* the shared budget spent by others: EXO_EBUSY */
    exo_ju_set_parse_budget(&b, 32 << 20);
    cr_assert(exo_budget_charge(&b, (64 << 20) - tree / 2));
    cr_assert_eq(exo_ju_parse_body(body, len, &j, &err), EXO_EBUSY);
    cr_assert_eq(exo_budget_used(&b), (64u << 20) - tree / 2);
    exo_ju_set_parse_budget(NULL, 0);
    cr_assert_eq(exo_ju_parse_body(body, len, &j, &err), 0, "no budget: not charged");
    json_decref(j);
    exo_free(body);
}

Test(json_budget, dumps_are_ours_to_free)
{
    json_t *j = json_pack("{s:[i,s]}", "a", 1, "b");
    char *s = exo_json_dumps(j, JSON_COMPACT);
    cr_assert_str_eq(s, "{\"a\":[1,\"b\"]}");
    exo_free(s);
    json_decref(j);
    json_t *bad = json_stringn_nocheck("\xff", 1);
    cr_assert_null(exo_json_dumps(bad, JSON_ENCODE_ANY), "invalid UTF-8 is not encodable");
    json_decref(bad);
}
