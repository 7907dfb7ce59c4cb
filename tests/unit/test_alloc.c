/* Allocation: big aligned buffers are 2 MiB aligned and zeroed; the arena
 * packs pieces 64-byte aligned, gives big pieces chunks of their own without
 * closing the open one, and its memory is writable to the last byte (the
 * ASan build checks the bounds). */
#include "core/alloc.h"
#include "core/arena.h"

#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

static int all_zero(const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i])
            return 0;
    return 1;
}

Test(alloc, big_aligned_buffers_are_huge_page_aligned_and_zeroed)
{
    size_t sizes[] = {64, 4096, ((size_t)2 << 20) - 64, (size_t)2 << 20, ((size_t)5 << 20) + 3};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        unsigned char *p = exo_alloc_aligned(sizes[i]);
        cr_assert_not_null(p);
        cr_assert_eq((uintptr_t)p % 64, 0);
        if (sizes[i] >= ((size_t)2 << 20))
            cr_assert_eq((uintptr_t)p % ((size_t)2 << 20), 0, "size %zu", sizes[i]);
        cr_assert(all_zero(p, sizes[i]));
        memset(p, 0xab, sizes[i]);
        exo_free_aligned(p);
    }
}

Test(alloc, arena_packs_pieces_and_isolates_big_ones)
{
    exo_arena *a = exo_arena_new(1 << 20); /* pieces over 256 KiB get their own chunk */
    unsigned char *p1 = exo_arena_alloc(a, 100);
    unsigned char *p2 = exo_arena_alloc(a, 1000);
    cr_assert_not_null(p1);
    cr_assert_not_null(p2);
    cr_assert_eq((uintptr_t)p1 % 64, 0);
    cr_assert_eq((uintptr_t)p2 % 64, 0);
    cr_assert_eq(p2, p1 + 128, "small pieces are packed back to back");
    unsigned char *big = exo_arena_alloc(a, 600 << 10);
    cr_assert_not_null(big);
    cr_assert(big < p1 || big >= p1 + (1 << 20), "a big piece lives outside the open chunk");
    unsigned char *p3 = exo_arena_alloc(a, 64);
    cr_assert_eq(p3, p2 + 1024, "the open chunk stays open after a big piece");
    cr_assert(all_zero(big, 600 << 10));
    memset(big, 1, 600 << 10);
    memset(p1, 2, 100);
    memset(p2, 3, 1000);
    cr_assert_eq(p1[99], 2);
    cr_assert_eq(p2[0], 3, "pieces do not overlap");
    /* filling the open chunk starts a new one */
    for (int i = 0; i < 10; i++)
        cr_assert_not_null(exo_arena_alloc(a, 200 << 10));
    cr_assert_eq(exo_arena_used(a), 128 + 1024 + (600 << 10) + 64 + 10 * (200 << 10));
    cr_assert_null(exo_arena_alloc(a, SIZE_MAX - 10), "an impossible size fails cleanly");
    cr_assert_not_null(exo_arena_alloc(a, 64), "and the arena stays usable");
    exo_arena_free(a);
    exo_arena_free(NULL);
}
