/* CHECK: an invariant a fuzz target asserts about what the code under test
 * did with its input; a failure aborts, which the fuzzer reports as a crash
 * with the line. Unlike assert() it stays on in every build. */
#ifndef EXO_FUZZ_CHECK_H
#define EXO_FUZZ_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#define CHECK(c)                                                              \
    do {                                                                      \
        if (!(c)) {                                                           \
            fprintf(stderr, "invariant failed: %s (line %d)\n", #c, __LINE__); \
            abort();                                                          \
        }                                                                     \
    } while (0)

#endif
