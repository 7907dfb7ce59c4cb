/* Scratch directories for unit tests: a fresh mkdtemp tree under /tmp, and
 * its removal with everything in it, so no test leaves files behind. */
#ifndef EXO_TEST_TMPDIR_H
#define EXO_TEST_TMPDIR_H

#include <criterion/criterion.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

/* dir: at least 64 bytes; name: a short tag for the directory name. */
static inline void test_tmpdir_make(char *dir, const char *name)
{
    snprintf(dir, 64, "/tmp/exo_%s_XXXXXX", name);
    cr_assert_not_null(mkdtemp(dir), "mkdtemp %s", dir);
}

static inline int test_tmpdir_remove_one(const char *p, const struct stat *sb, int flag,
                                         struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p);
}

static inline void test_tmpdir_remove(const char *dir)
{
    if (dir[0])
        nftw(dir, test_tmpdir_remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

#endif
