/* The machine's memory as /proc/meminfo gives it, and memory sizes as
 * users write them (exo serve --kv-budget, EXO_KV_BUDGET). */
#include "core/meminfo.h"

#include <criterion/criterion.h>

Test(meminfo, reads_total_and_available)
{
    uint64_t total = 0, avail = 0;
    exo_err err = {0};
    cr_assert_eq(exo_meminfo(&total, &avail, &err), 0, "%s", err.msg);
    cr_assert(total > ((uint64_t)64 << 20) && avail > 0 && avail <= total, "%llu %llu",
              (unsigned long long)total, (unsigned long long)avail);
}

Test(meminfo, sizes_as_users_write_them)
{
    static const struct {
        const char *text;
        uint64_t bytes;
    } ok[] = {{"1", 1},           {"4096", 4096},         {"512M", 512ull << 20}, {"4G", 4ull << 30},
              {"4g", 4ull << 30}, {"4GiB", 4ull << 30},   {"4GB", 4ull << 30},    {"1.5G", 3ull << 29},
              {"2T", 2ull << 40}, {"100B", 100},          {"0.5K", 512},          {"16k", 16384}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        uint64_t b = 0;
        exo_err err = {0};
        cr_assert_eq(exo_parse_size(ok[i].text, &b, &err), 0, "%s: %s", ok[i].text, err.msg);
        cr_assert_eq(b, ok[i].bytes, "%s: %llu", ok[i].text, (unsigned long long)b);
    }
    static const char *bad[] = {"", "0", "0.2", "-1", " 5", "5 ", "inf", "nan", "0x10", "G", "4X", "4GiBs",
                                "4iB", ".5G", "1e3", "5000000T", "4G4"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t b = 7;
        exo_err err = {0};
        cr_assert_eq(exo_parse_size(bad[i], &b, &err), EXO_EINVAL, "'%s' taken as %llu", bad[i],
                     (unsigned long long)b);
        cr_assert_eq(b, 7, "'%s' wrote the output", bad[i]);
        cr_assert(err.msg[0], "'%s' without a message", bad[i]);
    }
}
